"""Trainable class-specific prompts over a frozen text encoder (FedTSP's server-side model).

Each class c has k prompts (one handcrafted template or k LLM descriptions) and m = `n_ctx`
context vectors v_c in R^{m x d'} shared by its k prompts. The class text prototype is the
mean of the encoder features of the k prompts with v_c written into their token embeddings.

Where the context vectors go (`position`), for a BERT-style token sequence
`[CLS] w1 w2 ... [SEP]` (CLIP: `<sot> ... <eot>` in the same way):

- `"replace_first"` (default; the paper's "the context vectors replace the first m token
  embeddings", read CoOp-style): the prompt is tokenised with m-1 placeholder tokens after
  the start token, `[CLS] X .. X w1 ...`, and v_c overwrites positions 0..m-1, i.e. the
  start token *and* the m-1 placeholders. No real word is ever overwritten, and no
  placeholder is left behind. With m = 1 only the start token is replaced.
- `"overwrite_first"` (the authors' code): no placeholders; v_c overwrites positions 0..m-1
  of the plain tokenised prompt, so with m > 1 it erases the first m-1 real tokens (m = 10:
  "<start> a photo of a <class> :" and the description's first words). Positions beyond a
  short prompt's end stay masked out. With m = 1 it equals `"replace_first"`.
- `"after_start"` (CoOp style): m placeholders are reserved, `[CLS] X .. X w1 ...`, and v_c
  overwrites positions 1..m; the start token keeps its pre-trained embedding.

The frozen token embeddings (g0) of all C*k prompts are computed once and cached as buffers;
a forward pass only splices in the context vectors and runs g1 on one padded batch.
Only `ctx` and `logit_scale` are parameters; the encoder is held by reference, not as a
submodule, so `state_dict()` is just those two tensors (what the server sends/stores) and
the PLM is never copied.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fedtsp.models.text import TextEncoder

__all__ = [
    "PROMPT_POSITIONS",
    "PromptLearner",
    "PromptSequences",
    "embed_prompts",
    "prompt_layout",
]

PROMPT_POSITIONS = ("replace_first", "overwrite_first", "after_start")


def prompt_layout(position: str, n_ctx: int) -> tuple[int, int]:
    """Where the m context vectors start in a token sequence, and how many placeholder
    tokens the prompts are tokenised with (see the module docstring)."""
    if position not in PROMPT_POSITIONS:
        raise ValueError(f"position must be one of {PROMPT_POSITIONS}, got {position!r}")
    if position == "after_start":
        return 1, n_ctx
    if position == "replace_first":  # overwrites the start token too: one placeholder fewer
        return 0, max(n_ctx - 1, 0)
    return 0, 0


@dataclass
class PromptSequences:
    """Every class's prompts as frozen token embeddings (g0), padded to one length: what the
    learner encodes. Built from prompt text (``embed_prompts``) or received as a client's
    private upload, which carries no token ids."""

    embeddings: Tensor  # (P, L, d'), the prompts of class 0 first, then class 1, ...
    lengths: Tensor  # (P,) tokens of each prompt, special tokens and placeholders included
    counts: list[int]  # prompts per class
    ids: Tensor | None = None  # (P, L) token ids, when built from text

    def mask(self) -> Tensor:
        positions = torch.arange(self.embeddings.shape[1], device=self.lengths.device)
        return (positions < self.lengths[:, None]).long()


@torch.no_grad()
def embed_prompts(
    encoder: TextEncoder, class_prompts: list[list[str]], n_ctx: int, position: str
) -> PromptSequences:
    """The prompts tokenised with the placeholders ``position`` needs and embedded by g0."""
    _check_prompts(class_prompts)
    _, n_reserved = prompt_layout(position, n_ctx)
    flat = [t for p in class_prompts for t in p]
    ids, mask = encoder.tokenize(flat, extra_tokens=n_reserved)
    return PromptSequences(
        encoder.embed_tokens(ids), mask.sum(1), [len(p) for p in class_prompts], ids
    )


class PromptLearner(nn.Module):
    """Class text prototypes T (C, d) from prompts + trainable context vectors.

    Build the encoder on the target device first: the cached buffers are created there, and
    `.to()` on this module does not move the (unowned) encoder.
    """

    def __init__(
        self,
        encoder: TextEncoder,
        class_prompts: list[list[str]] | PromptSequences,
        n_ctx: int = 1,
        position: str = "replace_first",
        init_std: float = 0.02,
        logit_scale_init: float = math.log(100),
        chunk_size: int | None = 128,
    ) -> None:
        super().__init__()
        if not isinstance(n_ctx, int) or n_ctx < 0:
            raise ValueError(f"n_ctx must be an integer >= 0, got {n_ctx!r}")
        if isinstance(class_prompts, PromptSequences):
            sequences, self.prompts = class_prompts, None
        else:
            sequences = embed_prompts(encoder, class_prompts, n_ctx, position)
            self.prompts = [list(p) for p in class_prompts]
        # Plain attribute, not a submodule: keeps the PLM out of state_dict / parameters().
        object.__setattr__(self, "encoder", encoder)
        counts = sequences.counts
        self.n_classes = len(counts)
        self.n_ctx = n_ctx
        self.position = position
        self.ctx_start, _ = prompt_layout(position, n_ctx)
        embeds, mask = sequences.embeddings, sequences.mask()
        # Non-persistent: they are recomputed from the prompts, never sent or checkpointed.
        self.register_buffer("attention_mask", mask, persistent=False)
        self.register_buffer("token_embeddings", embeds.detach().clone(), persistent=False)
        self.register_buffer(
            "class_index",
            torch.repeat_interleave(torch.arange(self.n_classes), torch.tensor(counts)).to(
                embeds.device
            ),
            persistent=False,
        )
        self.register_buffer(
            "class_counts", torch.tensor(counts, dtype=embeds.dtype, device=embeds.device), False
        )
        self.register_buffer("token_ids", sequences.ids, persistent=False)  # None: uploaded
        count = len(mask)

        # Length buckets: prompts sorted by length and run in chunks, each padded only to its
        # own longest prompt. Padding never changes a feature, so this only saves compute.
        lengths = mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        step = chunk_size or count
        self._chunks = [
            (a, min(a + step, count), int(lengths[order[a : a + step]].max()))
            for a in range(0, count, step)
        ]
        self.register_buffer("_order", order, persistent=False)
        self.register_buffer("_inverse", torch.argsort(order), persistent=False)

        ctx = torch.randn(self.n_classes, n_ctx, encoder.token_width, device=embeds.device)
        self.ctx = nn.Parameter(ctx * init_std, requires_grad=n_ctx > 0)
        self.logit_scale = nn.Parameter(torch.tensor(float(logit_scale_init), device=embeds.device))
        self._fixed_cache: Tensor | None = None
        self._frozen_cache: Tensor | None = None

    @property
    def tau(self) -> float:
        """Temperature 1 / exp(logit_scale)."""
        return float(torch.exp(-self.logit_scale.detach()))

    def spliced_embeddings(self) -> Tensor:
        """Cached token embeddings with each prompt's class context written in, (P, L, d')."""
        e = self.token_embeddings
        if self.n_ctx == 0:
            return e
        s, m = self.ctx_start, self.n_ctx
        ctx = self.ctx[self.class_index].to(e.dtype)  # (P, m, d'), shared by a class's prompts
        # [:, :L]: overwrite_first on prompts shorter than m writes past their end (masked).
        return torch.cat([e[:, :s], ctx, e[:, s + m :]], dim=1)[:, : e.shape[1]]

    def forward(self) -> Tensor:
        """Class text prototypes (C, d): mean feature of each class's prompts."""
        if self.n_ctx == 0:
            # Nothing trainable reaches the encoder: encode once and reuse.
            if self._fixed_cache is None:
                with torch.no_grad():
                    self._fixed_cache = self._class_mean(self._encode(self.token_embeddings))
            return self._fixed_cache.clone()  # callers may modify the result in place
        return self._class_mean(self._encode(self.spliced_embeddings()))

    def _encode(self, embeds: Tensor) -> Tensor:
        """g1 over all prompts, chunk by chunk in length order; features in prompt order."""
        e, m = embeds[self._order], self.attention_mask[self._order]
        feats = [self.encoder.encode_embeddings(e[a:b, :n], m[a:b, :n]) for a, b, n in self._chunks]
        return torch.cat(feats)[self._inverse]

    @torch.no_grad()
    def frozen_prototypes(self) -> Tensor:
        """Prototypes of the plain prompts (no context vectors, no placeholders), no grad."""
        if self.prompts is None:
            raise ValueError("a learner built from uploaded embeddings has no prompt text")
        if self._frozen_cache is None:
            flat = [t for p in self.prompts for t in p]
            self._frozen_cache = self._class_mean(self.encoder.encode_text(flat))
        return self._frozen_cache.clone()

    def set_token_embeddings(self, embeds: Tensor) -> None:
        """Replace the cached g0 output (e.g. by noisy embeddings from the privacy upload)."""
        if embeds.shape != self.token_embeddings.shape:
            raise ValueError(
                f"token embeddings must have shape {tuple(self.token_embeddings.shape)}, "
                f"got {tuple(embeds.shape)}"
            )
        self.token_embeddings = embeds.detach().to(self.token_embeddings)
        self._fixed_cache = None

    def _class_mean(self, feats: Tensor) -> Tensor:
        out = feats.new_zeros(self.n_classes, feats.shape[1])
        out = out.index_add(0, self.class_index, feats)
        return out / self.class_counts.to(feats.dtype).unsqueeze(1)

    def __deepcopy__(self, memo: dict[int, Any]) -> PromptLearner:
        # Share the frozen encoder between copies; copy everything else.
        memo[id(self.encoder)] = self.encoder
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def extra_repr(self) -> str:
        return (
            f"encoder={self.encoder.name}, classes={self.n_classes}, "
            f"prompts={len(self.class_index)}, n_ctx={self.n_ctx}, position={self.position}"
        )


def _check_prompts(class_prompts: list[list[str]]) -> None:
    if not isinstance(class_prompts, (list, tuple)) or not class_prompts:
        raise ValueError("class_prompts must be a non-empty list (one list of prompts per class)")
    for c, prompts in enumerate(class_prompts):
        if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"class {c}: expected a non-empty list of prompt strings")
        for j, t in enumerate(prompts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"class {c}, prompt {j}: expected a non-empty string, got {t!r}")
