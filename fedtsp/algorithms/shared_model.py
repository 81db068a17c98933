"""The small homogeneous model that FML, FedKD and FedMRL share across clients (a helper module,
not an algorithm).

Each client keeps, beside its heterogeneous personal model, its own copy of one small model of
a common architecture in its state (``shared``); the server averages the copies (FedAvg) and
every client loads the average in place. All copies start identical: the model is built
under a seed derived from the run seed, by every client for itself (and by the server, for
the names and shapes it averages), so nothing needs to be sent before round 0.

Which architecture: ``shared_arch="first"`` (the default) is the first architecture of the
run's model family (client 0's), which is what the FedTSP authors' fork of HtFLlib builds for
all three methods (``BaseHeadSplit(args, 0)``): ResNet-4 under HtFE9, ResNet-10 under HtFE3,
FedAvgCNN under HtFE2/4/8, the half-width FedAvgCNN under htfe-cpu. None of the three papers
fixes a shared architecture for these families, so the code that produced the FedTSP paper's
Table 1 decides. Any registered architecture name (e.g. ``fedavgcnn``) can be chosen instead.
The shared model is a ``ClientModel`` (``features`` pooled to ``feature_dim``, linear ``head``),
so it has exactly the structure of a client model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtsp.aggregation import normalized_weights
from fedtsp.models.families import ARCHITECTURES, ClientModel, build_model, client_architecture

if TYPE_CHECKING:
    from fedtsp.algorithms.base import Message, RunContext
    from fedtsp.clients import Client, ClientFacts

T = TypeVar("T")
FAMILY_FIRST = "first"
KL_REDUCTIONS = ("batchmean", "mean")
SAMPLES_KEY = "num_samples"


# ---- the shared model ------------------------------------------------------------------
def check_kl_reduction(value: str) -> None:
    """Raise ValueError unless ``value`` is one of KL_REDUCTIONS."""
    if value not in KL_REDUCTIONS:
        raise ValueError(f"kl_reduction={value!r} is invalid; choose {KL_REDUCTIONS}")


def check_shared_arch(value: str) -> None:
    """Raise ValueError unless ``value`` is ``"first"`` or a registered architecture."""
    if value != FAMILY_FIRST and value not in ARCHITECTURES:
        raise ValueError(
            f"shared_arch={value!r} is invalid; choose {FAMILY_FIRST} (the family's first "
            f"architecture) or one of {', '.join(sorted(ARCHITECTURES))}"
        )


@contextlib.contextmanager
def seeded(ctx: RunContext, tag: int) -> Iterator[None]:
    """Draw from torch's global RNG under a seed fixed by (run seed, tag), then restore it."""
    seed = int(np.random.SeedSequence([ctx.seed, tag]).generate_state(1)[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def nth_draw(ctx: RunContext, tag: int, n: int, make: Callable[[], T]) -> T:
    """The ``n``-th (from 0) of the objects ``make()`` draws one after another under
    ``seeded(ctx, tag)``: client n's share of one seeded stream, built by that client alone."""
    with seeded(ctx, tag):
        for _ in range(n + 1):
            made = make()
    return made


def build_shared_model(
    ctx: RunContext, arch: str, facts: ClientFacts, feature_dim: int | None = None
) -> ClientModel:
    """The shared model for images shaped as ``facts`` says, built under a fixed seed: the
    same weights on every call. ``arch``: an architecture, or ``"first"``, the run family's
    first architecture (client 0's)."""
    if arch == FAMILY_FIRST:
        arch = client_architecture(ctx.family, 0)
    with seeded(ctx, tag=0x5EED):
        model = build_model(
            arch,
            ctx.num_classes,
            feature_dim=feature_dim or ctx.feature_dim,
            in_channels=facts.in_channels,
            image_size=facts.image_size,
        )
    return model.to(ctx.device)


def set_training(module: nn.Module, mode: bool) -> None:
    # The simulator switches only the personal model between train and eval mode; a shared
    # model with BatchNorm or dropout must follow it.
    if module.training != mode:
        module.train(mode)


def check_grad_clip(value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"grad_clip={value} is invalid; must be > 0 (or none: no clipping)")


def clip_each(modules: Sequence[nn.Module], max_norm: float | None) -> None:
    """Clip the gradient norm of each module on its own, as the authors' fork does."""
    if max_norm is not None:
        for module in modules:
            torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)


# ---- FedAvg of the shared weights -------------------------------------------------------
def shared_weights(module: nn.Module) -> dict[str, Tensor]:
    """The floating-point state (parameters and e.g. BatchNorm statistics) as copies.

    Integer buffers (BatchNorm's batch counter) stay local: they are not averaged.
    """
    return {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}


@torch.no_grad()
def load_shared_weights(module: nn.Module, weights: dict[str, Tensor]) -> None:
    """Copy ``weights`` into the module in place (the optimiser holds its parameter objects)."""
    state = module.state_dict()
    for name, value in weights.items():
        state[name].copy_(value)


def upload_with_count(client: Client, message: Message, weighting: str) -> Message:
    """Add the client's train size, which the server needs for a sample-weighted average."""
    if weighting == "samples":
        message[SAMPLES_KEY] = torch.tensor(client.num_train, dtype=torch.int64)
    return message


def client_weights(uploads: Sequence[Message], weighting: str) -> Tensor:
    """Normalised aggregation weights: train sizes (``samples``) or equal (``uniform``)."""
    sizes = [u[SAMPLES_KEY] for u in uploads] if weighting == "samples" else [1] * len(uploads)
    return normalized_weights(sizes, weighting)


# ---- losses and analysis -----------------------------------------------------------------
def distill_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    reduction: str = "batchmean",
) -> Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) * T^2; the teacher is not detached here.

    ``reduction="batchmean"`` is the KL divergence per sample; ``"mean"`` divides it by the
    number of classes as well (``nn.KLDivLoss()``'s default in HtFLlib).
    """
    t = temperature
    log_p = F.log_softmax(student_logits.float() / t, dim=1)
    q = F.softmax(teacher_logits.float() / t, dim=1)
    if reduction == "mean":  # spelt out: torch warns that its "mean" will become "batchmean"
        return F.kl_div(log_p, q, reduction="sum") / log_p.numel() * (t * t)
    return F.kl_div(log_p, q, reduction=reduction) * (t * t)


@torch.inference_mode()
def class_mean_features(
    model: ClientModel, clients: Sequence[Client], batch_size: int = 1000
) -> Tensor:
    """Per-class mean of ``model.features`` over all clients' train data, (C, d).

    An analysis artifact computed in the simulator, never transmitted. Classes no client
    holds get a zero row.
    """
    set_training(model, False)
    sums: Tensor | None = None
    counts = torch.zeros(clients[0].num_classes, dtype=torch.float64)
    for client in clients:
        for lo in range(0, client.num_train, batch_size):
            x = client.train_x[lo : lo + batch_size]
            y = client.train_y[lo : lo + batch_size]
            with client.autocast():
                feats = model.features(x).float()
            if sums is None:
                sums = torch.zeros(client.num_classes, feats.shape[1], device=feats.device)
            sums.index_add_(0, y, feats)
        counts += client.class_counts().double().cpu()
    assert sums is not None, "no client has training data"
    return (sums.double().cpu() / counts.clamp(min=1).unsqueeze(1)).float()
