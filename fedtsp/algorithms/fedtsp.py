"""FedTSP: federated prototype learning with text-derived class prototypes.

The server turns class prompts (a template or LLM-written descriptions) into class
prototypes with a frozen pre-trained language model. Trainable class-specific context
vectors are tuned on the server for ``server_epochs`` full-batch SGD steps of an InfoNCE
loss that matches each text prototype to its class's aggregated client image prototype
(Eq. 7); clients add ``lam * CE(cos(f(x), T) / tau, y)`` to their cross-entropy (Eq. 8)
with the server-learnt temperature. Heads stay personal.

Paper vs authors' code: the paper averages image prototypes weighted by sample counts
(Eq. 6, ``weighting="samples"``); the code uses an unweighted mean over the clients that
hold the class (``weighting="uniform"``). Context vectors (``prompt_position``, see
``fedtsp.models.prompts``): by default they replace the start token and m-1 placeholder
tokens inserted after it (the paper's "replace the first m token embeddings"); the
authors' code overwrites the first m positions of the plain prompt, start token and
m-1 real tokens included (``"overwrite_first"``; identical for m = 1, CIFAR-10);
``"after_start"`` keeps the start/[CLS] token. Image prototypes (``prototype_source``): a pass with the trained model after local
training (Eq. 5, "at the end of each training round"), as the authors' FedTSP clients do
(``collect_protos()``); ``"training"`` averages the features of the training forward passes
of all local epochs instead (HtFLlib's FedProto; no extra pass). Runs with ``"training"``
hash with revision 1: before it a class met only in dropped partial batches was uploaded as
a zero vector (the default's keys are unchanged). Eq. 7 (``infonce_direction``): the paper
takes, for each text prototype, a softmax over the image prototypes; the authors' server
computes ``image @ text.T`` logits, the softmax over text prototypes for each image
prototype (``"image_to_text"``). BERT-style encoders (``bert_input``): the authors feed the
embedding block's output back into the model as ``inputs_embeds`` (position, type and
LayerNorm twice) with no attention mask (``"authors"``). The method label
``FedTSP (authors' runs)`` (``profiles.toml``) sets every one of these code choices at once.

Model-homogeneous settings (Table 3): in ``gfl`` (and as FedTSP-FT in ``pfl``) every client
holds the same architecture, and the whole model, head included, is averaged with FedAvg
(sample-weighted) every round while the clients keep aligning to the text prototypes.

Semantic controls (``targets``, not in the paper): the text prototypes are replaced by fixed
targets without their meaning: ``"random"`` unit vectors, ``"shuffled"`` (the same text
prototypes assigned to other classes: geometry kept, semantics gone; no class keeps its
own) or ``"simplex"`` (AlignFed's anchors spread uniformly on the sphere). They need
``trainable_prompts=False`` and compare with the fixed text prototypes of Table 2's row 2,
testing whether the text's meaning, or only fixed well-spread targets, carries the gain.

Private description upload (Sec. 3.5, Table 4; ``fedtsp.algorithms.privacy``): with ``dp_epsilon`` set,
client ``dp_client`` embeds its class prompts with the encoder's g0 in its set-up, clips each
sequence to ``dp_clip``, noises it for (dp_epsilon, dp_delta)-DP and uploads the noisy
sequences with their lengths, once (a set-up message, counted in the record's set-up bytes);
the server builds its prompt learner from that upload alone and never reads the description
text. ``dp_noise_std`` is the authors' code instead: the server embeds the clean prompts and
adds one fixed Gaussian tensor of that std, no clipping, no guarantee.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import WEIGHTINGS, aggregate_uploads
from fedtsp.algorithms.base import (
    Algorithm,
    ClassTargets,
    Message,
    RunContext,
    ServerHalf,
    register,
)
from fedtsp.algorithms.clients import PROTOTYPE_SOURCES, Client, ClientFacts
from fedtsp.algorithms.finetune import FineTuned, FineTuneOptions, HeadFineTuning
from fedtsp.algorithms.model_messages import (
    average_model_messages,
    load_model_message,
    model_message,
    with_sample_count,
)
from fedtsp.algorithms.privacy import add_fixed_noise, check_dp_parameters, privatize_sequences
from fedtsp.algorithms.prototypes import PrototypeClient, uniform_anchors
from fedtsp.core.options import option
from fedtsp.data.registry import dataset_info
from fedtsp.models.prompts import (
    PROMPT_POSITIONS,
    PromptLearner,
    PromptSequences,
    embed_prompts,
    prompt_layout,
)
from fedtsp.models.text import (
    BERT_INPUTS,
    BertTextEncoder,
    TextEncoder,
    build_text_encoder,
    is_bert_style,
    text_encoder_names,
    text_encoder_width,
)
from fedtsp.text.descriptions import (
    description_set_path,
    handcrafted_prompts,
    resolve_description_set,
    validate_descriptions,
)

PROMPT_VARIANTS = ("manual", "short", "long")
# Eq. 7's softmax: per text prototype over the image prototypes (the paper's text), or per
# image prototype over the text prototypes (the authors' server: `image @ text.T` logits).
INFONCE_DIRECTIONS = ("text_to_image", "image_to_text")
TARGETS = ("text", "random", "shuffled", "simplex")
# Authors' per-dataset settings (PROTOCOL.md): CIFAR-10 m = 1, E_s = 1; otherwise 10 / 20.
_SMALL_LABEL_SETS = ("cifar10", "fmnist")


@dataclass
class FedTSPOptions:
    lam: float = option(7.0, "weight of the client-side text-prototype alignment (Eq. 8)", ">= 0")
    text_encoder: str = option(
        "minilm", "frozen PLM that encodes the prompts", choices=text_encoder_names
    )
    prompts: str = option(
        "manual",
        "manual ('A photo of a {class}.'; with trainable prompts, Table 2's row 4), or the "
        "committed short / long descriptions (long + trainable prompts: the full method)",
        choices=PROMPT_VARIANTS,
    )
    description_set: str | None = option(
        None, "description JSON in the authors' schema (path or committed set name) to use instead"
    )
    trainable_prompts: bool = option(True, "tune class-specific context vectors on the server")
    targets: str = option(
        "text",
        "class targets: text prototypes, or a semantic control (random, shuffled, simplex)",
        choices=TARGETS,
    )
    prompt_tokens: int | None = option(
        None, "context vectors per class m (unset: 1 on CIFAR-10, else 10)", ">= 1"
    )
    prompt_position: str = option(
        "replace_first",
        "replace_first (paper), overwrite_first (authors' code) or after_start",
        choices=PROMPT_POSITIONS,
    )
    server_epochs: int | None = option(
        None, "server InfoNCE steps E_s (unset: 1 on CIFAR-10, else 20)", ">= 0"
    )
    server_lr: float = option(0.01, "SGD learning rate of the prompts and logit scale", "> 0")
    infonce_direction: str = option(
        "text_to_image",
        "server loss (Eq. 7): softmax over image prototypes per text prototype (paper) or "
        "over text prototypes per image prototype (image_to_text, authors' code)",
        choices=INFONCE_DIRECTIONS,
    )
    bert_input: str = option(
        "standard",
        "BERT-style encoders: standard input, or the authors' (embedding block applied "
        "twice, no attention mask)",
        choices=BERT_INPUTS,
    )
    weighting: str = option(
        "samples", "image-prototype average: samples (paper) or uniform (code)", choices=WEIGHTINGS
    )
    prototype_source: str = option(
        "pass",
        "image prototypes: pass after training (Eq. 5, authors' FedTSP) or training "
        "(the training passes' features, HtFLlib's FedProto)",
        choices=PROTOTYPE_SOURCES,
    )
    dp_epsilon: float | None = option(
        None, "privacy budget of the client-side DP description upload (unset: no DP)"
    )
    dp_delta: float = option(1e-5, "delta of the DP description upload, in (0, 1)")
    dp_clip: float = option(2.5, "L2 clipping norm C of each uploaded token-embedding sequence")
    dp_client: int = option(0, "index of the client that uploads the private descriptions", ">= 0")
    dp_noise_std: float | None = option(
        None,
        "authors' code variant: std of one fixed Gaussian tensor the server adds (no clip)",
        ">= 0",
    )

    def validate(self) -> None:
        if self.description_set is not None:
            resolve_description_set(self.description_set)
        check_dp_parameters(
            1.0 if self.dp_epsilon is None else self.dp_epsilon, self.dp_delta, self.dp_clip
        )
        if self.targets != "text" and self.trainable_prompts:
            raise ValueError(
                f"targets={self.targets!r} replaces the text prototypes by fixed vectors, "
                "which no prompt can tune; set trainable_prompts=False"
            )
        if self.bert_input != "standard" and not is_bert_style(self.text_encoder):
            raise ValueError(
                f"bert_input={self.bert_input!r} applies to BERT-style encoders only, not to "
                f"{self.text_encoder!r}"
            )
        if self.dp_epsilon is not None and self.dp_noise_std is not None:
            raise ValueError(
                "dp_epsilon and dp_noise_std are two alternative mechanisms; set only one"
            )


def _text_encoder(opts: FedTSPOptions, device: torch.device) -> TextEncoder:
    encoder = build_text_encoder(opts.text_encoder, device=device)
    if isinstance(encoder, BertTextEncoder):
        encoder.input_mode = opts.bert_input
    return encoder


def _noise_generator(seed: int, client: int) -> torch.Generator:
    """The description noise's generator, fixed by (run seed, uploading client): a resumed
    run re-creates the very same upload."""
    entropy = [seed, client, 0xD9]
    return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))


@dataclass
class FedTSPState(ClassTargets):
    """``targets``: the unit-norm text prototypes last received."""

    logit_scale: Tensor | None = None


def _dataset_default(ctx: RunContext, value: int | None, small: int, large: int) -> int:
    if value is not None:
        return value
    return small if ctx.dataset in _SMALL_LABEL_SETS else large


def context_tokens(opts: FedTSPOptions, ctx: RunContext) -> int:
    """m, the context vectors per class (0 without trainable prompts)."""
    if not opts.trainable_prompts:
        return 0
    return _dataset_default(ctx, opts.prompt_tokens, 1, 10)


def class_prompts(
    opts: FedTSPOptions, ctx: RunContext, encoder: TextEncoder, n_ctx: int
) -> list[list[str]]:
    """Prompts per class; description files are validated against the encoder first.

    Every prompt must fit the encoder's context with the n_ctx prompt vectors added:
    a too-long description is an error naming file, class and description, never a
    silent truncation.
    """
    if opts.description_set is None and opts.prompts == "manual":
        return handcrafted_prompts(ctx.class_names)
    if opts.description_set is not None:
        path = resolve_description_set(opts.description_set)
    else:
        path = description_set_path(ctx.dataset, opts.prompts)
    checked = validate_descriptions(
        path, ctx.class_names, k=None, tokenizer=encoder, reserved_tokens=n_ctx
    )
    return checked.prompts


class FedTSPClient(PrototypeClient):
    State = FedTSPState
    start_from = "model"  # homogeneous settings: one common starting model

    def setup_upload(self, client: Client) -> Message:
        upload = super().setup_upload(client) if self.ctx.homogeneous else {}
        if self.opts.dp_epsilon is not None and client.index == self.opts.dp_client:
            upload |= self._private_descriptions(client)
        return upload

    def _private_descriptions(self, client: Client) -> Message:
        """The selected client's one-time private upload (Sec. 3.5): its class prompts as
        token embeddings, each sequence clipped and noised, with the lengths the server
        needs to run the encoder. The slots the server's context vectors overwrite are sent
        as zeros (with ``overwrite_first`` they hold real words); padding holds the public
        pad token."""
        opts, n_ctx = self.opts, context_tokens(self.opts, self.ctx)
        encoder = _text_encoder(opts, client.device)
        prompts = class_prompts(opts, self.ctx, encoder, n_ctx)
        sequences = embed_prompts(encoder, prompts, n_ctx, opts.prompt_position)
        start, _ = prompt_layout(opts.prompt_position, n_ctx)
        keep = sequences.mask().bool()
        keep[:, start : start + n_ctx] = False
        noisy = privatize_sequences(
            sequences.embeddings,
            keep,
            opts.dp_epsilon,
            opts.dp_delta,
            opts.dp_clip,
            _noise_generator(self.ctx.seed, opts.dp_client),
        )
        noisy[:, start : start + n_ctx] = 0.0
        return {
            "dp_embeddings": noisy,
            "dp_lengths": sequences.lengths,
            "dp_counts": torch.tensor(sequences.counts),
        }

    def pull(self, client: Client, y: Tensor, feats: Tensor) -> Tensor:
        state = client.state
        sims = F.normalize(feats.float(), dim=1) @ state.targets.T  # unit-norm text rows
        return F.cross_entropy(state.logit_scale.exp() * sims, y)

    def upload(self, client: Client) -> Message:
        upload = super().upload(client)
        if self.ctx.homogeneous:
            return with_sample_count(client, upload | model_message(client.model))
        return upload

    def receive(self, client: Client, message: Message) -> None:
        load_model_message(client.model, message)  # homogeneous settings only
        client.state.targets = F.normalize(message["text_protos"], dim=1).to(client.device)
        client.state.logit_scale = message["logit_scale"].to(client.device)


class FedTSPServer(ServerHalf):
    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        opts, ctx = self.opts, self.ctx
        encoder = _text_encoder(opts, ctx.device)
        n_ctx = context_tokens(opts, ctx)
        if opts.dp_epsilon is not None:  # the server never sees the descriptions' text
            upload = uploads[opts.dp_client]
            prompts: list[list[str]] | PromptSequences = PromptSequences(
                upload["dp_embeddings"].to(ctx.device),
                upload["dp_lengths"].to(ctx.device),
                upload["dp_counts"].tolist(),
            )
        else:
            prompts = class_prompts(opts, ctx, encoder, n_ctx)
        self.server_epochs = (
            _dataset_default(ctx, opts.server_epochs, 1, 20) if opts.trainable_prompts else 0
        )
        self.learner = PromptLearner(
            encoder, prompts, n_ctx=n_ctx, position=opts.prompt_position
        ).to(ctx.device)
        if opts.dp_noise_std is not None:
            # The authors' code: the server itself noises the clean embeddings it computed.
            generator = _noise_generator(ctx.seed, opts.dp_client)
            noisy = add_fixed_noise(self.learner.token_embeddings, opts.dp_noise_std, generator)
            self.learner.set_token_embeddings(noisy)
        self.control = None if opts.targets == "text" else self._control_targets()
        trainable = [p for p in self.learner.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(trainable, lr=opts.server_lr) if trainable else None
        self.last_server_loss = float("nan")
        self.image_protos: Tensor | None = None
        if ctx.homogeneous:  # one common starting model: client 0's initial weights
            start = {k: v for k, v in uploads[0].items() if not k.startswith("dp_")}
            return self._text_message() | start
        return self._text_message()

    def _control_targets(self) -> Tensor:
        """The fixed targets of a semantic control, drawn from the run's seed."""
        kind = self.opts.targets
        entropy = [self.ctx.seed, TARGETS.index(kind), 0x5E3]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            text = self.learner().float().cpu()
        count, width = text.shape
        if kind == "random":
            return F.normalize(torch.randn(count, width, generator=generator), dim=1)
        if kind == "shuffled":  # class order[i] gets the prototype of class order[i + 1]
            order = torch.randperm(count, generator=generator)
            out = torch.empty_like(text)
            out[order] = text[order.roll(-1)]
            return out
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return uniform_anchors(count, width)

    def _text_message(self) -> Message:
        tuning = self.optimizer is not None and self.server_epochs > 0
        with torch.set_grad_enabled(tuning):
            protos = self.learner() if self.control is None else self.control.to(self.ctx.device)
        # The prompts do not change until the next server step, whose first epoch needs
        # exactly these prototypes: keeping their graph saves one PLM forward per round
        # (a third of the server's time at E_s = 1), at the cost of holding its activations.
        self._pending_protos = protos if protos.requires_grad else None
        self.text_protos = protos.detach().float()
        return {"text_protos": self.text_protos, "logit_scale": self.learner.logit_scale.detach()}

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        opts = self.opts
        image_protos, present = aggregate_uploads(uploads, "protos", opts.weighting)
        self.image_protos = image_protos
        if self.optimizer is not None and self.server_epochs > 0 and int(present.sum()) > 1:
            target = F.normalize(image_protos[present].to(self.ctx.device), dim=1)
            labels = torch.arange(target.shape[0], device=target.device)
            for epoch in range(self.server_epochs):
                pending, self._pending_protos = self._pending_protos, None
                protos = pending if epoch == 0 and pending is not None else self.learner()
                text = F.normalize(protos[present], dim=1)
                # rows: text prototypes, columns: image prototypes (scaled before the product,
                # as every record so far was computed)
                logits = self.learner.logit_scale.exp() * text @ target.T
                if opts.infonce_direction == "image_to_text":
                    logits = logits.T
                loss = F.cross_entropy(logits, labels)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
            self.last_server_loss = float(loss.detach())
        if self.ctx.homogeneous:
            self.average = average_model_messages(list(uploads.values()))

    def message(self) -> Message:
        text = self._text_message()
        return text | self.average if self.ctx.homogeneous else text

    def round_metrics(self) -> dict[str, float]:
        return {"server_loss": self.last_server_loss, "tau": self.learner.tau}

    def artifacts(self) -> dict[str, Tensor]:
        out = {"global_prototypes": self.text_protos}
        if self.image_protos is not None:
            out["image_prototypes"] = self.image_protos
        return out

    def state_dict(self) -> dict:
        return {
            "learner": {
                k: v for k, v in self.learner.state_dict().items() if "ctx" in k or "logit" in k
            },
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "last_server_loss": self.last_server_loss,
            "image_protos": self.image_protos,
        }

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"], strict=False)
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.last_server_loss = state["last_server_loss"]
        self.image_protos = state["image_protos"]
        self._text_message()


def _revision(algo_options: dict[str, Any]) -> int:
    # Only prototype_source="training" changed (see the module docstring).
    return 1 if algo_options.get("prototype_source") == "training" else 0


def _check_config(options: FedTSPOptions, config: Any) -> None:
    private = options.dp_epsilon is not None or options.dp_noise_std is not None
    if private and options.dp_client >= config.num_clients:
        raise ValueError(
            f"dp_client={options.dp_client} is invalid; the run has clients "
            f"0..{config.num_clients - 1}"
        )
    classes = dataset_info(config.dataset).classes
    if options.description_set is not None and config.population is None and classes:
        # The file against the dataset's classes now, not after the data has loaded (its
        # prompts' lengths need the text encoder and are checked when the server builds).
        validate_descriptions(
            resolve_description_set(options.description_set), list(classes), k=None
        )


def _feature_width(options: FedTSPOptions) -> int:
    return text_encoder_width(options.text_encoder)  # image features meet text prototypes


FedTSP = register(
    Algorithm(
        "fedtsp",
        FedTSPClient,
        FedTSPServer,
        FedTSPOptions,
        settings=("htfl", "gfl"),
        revision_of=_revision,
        feature_width=_feature_width,
        check_config=_check_config,
    )
)


@dataclass
class FedTSPFTOptions(FineTuneOptions, FedTSPOptions):
    pass


@dataclass
class FedTSPFTState(FedTSPState, FineTuned):
    pass


class FedTSPFTClient(HeadFineTuning, FedTSPClient):
    State = FedTSPFTState


# FedTSP with FedAvg of the whole model (its GFL form), then head fine-tuning (``fedtsp.algorithms.finetune``).
FedTSPFT = register(
    dataclasses.replace(
        FedTSP, name="fedtsp-ft", Client=FedTSPFTClient, Options=FedTSPFTOptions, settings=("pfl",)
    )
)
