"""The small homogeneous model that FML, FedKD and FedMRL share across clients, and the part of
those methods that handles it (`SharedModelClient` and `SharedModelServer`, the halves they
build on; this module registers no algorithm).

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

Options all three share (`SharedModelOptions`), defaults from the authors' fork: the copies
are averaged uniformly (``weighting="uniform"``; the papers weight by train size), and each
model's gradient norm is clipped at 10 before every step (``grad_clip``; none: the papers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtsp.algorithms.aggregation import WEIGHTINGS, fedavg, normalized_weights
from fedtsp.algorithms.base import ClientHalf, Half, Message, RunContext, ServerHalf
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import SAMPLES_KEY, load_shared_weights, shared_weights
from fedtsp.core.options import option
from fedtsp.models.families import ARCHITECTURES, ClientModel, build_model, client_architecture

T = TypeVar("T")
FAMILY_FIRST = "first"
KL_REDUCTIONS = ("batchmean", "mean")


def shared_arch_names() -> list[str]:
    """``"first"`` (the run family's first architecture) or any registered architecture."""
    return [FAMILY_FIRST, *sorted(ARCHITECTURES)]


@dataclass
class SharedModelOptions:
    weighting: str = option(
        "uniform", "shared-model average: uniform (authors' code) or samples", choices=WEIGHTINGS
    )
    grad_clip: float | None = option(
        10.0,
        "clip each model's gradient norm (authors' code: 10); none: no clipping (paper)",
        "> 0",
    )
    shared_arch: str = option(
        "first",
        "shared model: first (the family's first architecture, authors' code) or a name",
        choices=shared_arch_names,
    )


# ---- the shared model ------------------------------------------------------------------


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


def clip_each(modules: Sequence[nn.Module], max_norm: float | None) -> None:
    """Clip the gradient norm of each module on its own, as the authors' fork does."""
    if max_norm is not None:
        for module in modules:
            torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)


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


class SharedModelHalf(Half):
    """What both halves build: the shared model, from the options and the run context."""

    def shared_width(self) -> int | None:
        """The shared model's feature width (None: the run's feature_dim)."""
        return None

    def new_shared_model(self, facts: ClientFacts) -> ClientModel:
        """The shared model, identical on every call (built under one seed)."""
        return build_shared_model(self.ctx, self.opts.shared_arch, facts, self.shared_width())


class SharedModelClient(SharedModelHalf, ClientHalf):
    """Each client trains its own model and its copy of the shared model (``state.shared``),
    uploads the copy and loads the average in place. Subclasses add how the two models learn
    together."""

    def init_client(self, client: Client) -> Any:
        """A ``State`` holding only this client's copy of the shared model."""
        return self.State(self.new_shared_model(client.facts()))

    def client_parameters(self, client: Client) -> list[Any]:
        return [*client.model.parameters(), *client.state.shared.parameters()]

    def clipped_modules(self, client: Client) -> list[nn.Module]:
        """The modules whose gradient norms are clipped each on its own before every step."""
        return [client.model, client.state.shared]

    def before_step(self, client: Client) -> None:
        clip_each(self.clipped_modules(client), self.opts.grad_clip)

    def upload(self, client: Client) -> Message:
        return upload_with_count(client, shared_weights(client.state.shared), self.opts.weighting)

    def receive(self, client: Client, message: Message) -> None:
        load_shared_weights(client.state.shared, message)

    def analysis_artifacts(self, clients: list[Client]) -> dict[str, Tensor]:
        # One global model: its class-mean features over all clients' train data are the
        # run's global class prototypes (an analysis artifact, never a message).
        return {"global_prototypes": class_mean_features(clients[0].state.shared, clients)}


class SharedModelServer(SharedModelHalf, ServerHalf):
    """Averages the clients' copies (FedAvg, by ``weighting``); every client gets the average
    (``message()`` sends ``average``, which a subclass may set to another form, e.g. FedKD's
    compressed mean update)."""

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> None:
        # Every copy starts identical, so nothing is sent; the server needs only the names.
        self.keys = list(shared_weights(self.new_shared_model(facts[0])))

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        rows = list(uploads.values())
        self.average = fedavg(rows, client_weights(rows, self.opts.weighting), self.keys)

    def message(self) -> Message:
        return self.average
