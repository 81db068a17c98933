"""FedGen (Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021), in the heterogeneous-model form of HtFLlib.

The server holds a conditional feature generator G(z, y) -> R^d; clients add
``gen_weight * CE(head(G(z, y)), y)`` on generated features, labels drawn from the global
label distribution, so their heads learn the federation's feature distribution. As in
HtFLlib the heads are also averaged (sample-weighted) and sent back (``share_head``), and all
heads start from client 0's.

Generator: ``[one_hot(y), z] -> Linear(noise_dim + C, hidden_dim) -> BatchNorm1d -> ReLU ->
Linear(hidden_dim, d)``. Its batch norm always uses batch statistics (HtFLlib never switches
the generator to eval mode), so it has no running buffers to send.

Defaults are those of the runs behind the paper's Table 1 (the authors' FedGen script with
HtFLlib's code). There the server trains a generator every round but never saves it: the
clients load the randomly initialised generator saved at start-up, so the paper's FedGen
numbers come from a **frozen random generator** (``frozen_generator=True``, the label counts
read from the clients at set-up, the term added from round 0), with U[0, 1) noise
(``noise="uniform"``).

``frozen_generator=False`` is FedGen's own method: ``server_epochs`` Adam steps per round
(a fresh Adam every round, as in HtFLlib) on batches of ``server_batch`` labels drawn from
the global label counts, so that the ensemble of the uploaded heads classifies G(z, y) as y.
Each generated sample's ensemble weights client k by its share of that sample's class, as
in the paper (``ensemble_weighting="class_counts"``; HtFLlib weights by train size,
``"client_size"``); the paper's diversity term has weight ``diversity_weight`` (FedGen's own
code: 1). Clients add the term once the first trained generator has arrived (a random one
carries no class information). Departure, needed for it to work at all: the ensemble's
cross-entropy falls without bound as generated features grow (the logits are linear in
them), so at the authors' generator lr 0.1 the features grew to 45-260 in norm against 7-15
for real ones and the clients' heads diverged. The trained generator's outputs are
therefore rescaled to the clients' mean real-feature norm: each client measures it on its
training forward passes (no extra pass) and uploads it with its head. FedGen's clients
also decay the term's weight over rounds; like HtFLlib, ``gen_weight`` stays constant.

Revision 1 (run keys): the defaults were the trained, unbounded generator with Gaussian noise.
Revision 2: the engine's seeding rule (each client's training draws from (seed, round,
client), the server step from (seed, round)) changed the noise and label draws, which had
followed the previous clients' draws in the same process; now every engine draws alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtsp.algorithms.aggregation import fedavg, normalized_weights
from fedtsp.algorithms.base import (
    Algorithm,
    ClientHalf,
    Message,
    RunContext,
    ServerHalf,
    register,
)
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import (
    HEAD_KEYS,
    head_message,
    load_model_message,
    message_head,
)
from fedtsp.core.options import option

_GEN = "gen."  # prefix of the generator's tensors in a broadcast
_PROTO_SAMPLES = 64  # generated samples per class for the class-mean artifact


@dataclass
class FedGenOptions:
    noise_dim: int = option(32, "width of the generator's noise input z", ">= 1")
    hidden_dim: int = option(512, "width of the generator's hidden layer", ">= 1")
    generator_lr: float = option(0.1, "Adam learning rate of the server's generator", "> 0")
    server_epochs: int = option(100, "generator training steps per round", ">= 0")
    # >= 2: the generator's batch norm needs two samples.
    server_batch: int = option(100, "generated samples per generator training step", ">= 2")
    gen_weight: float = option(1.0, "weight of the clients' CE on generated features", ">= 0")
    share_head: bool = option(True, "average the heads too, as HtFLlib's FedGen does")
    ensemble_weighting: str = option(
        "class_counts",
        "trained generator's head ensemble: class_counts (paper) or client_size",
        choices=("class_counts", "client_size"),
    )
    noise: str = option(
        "uniform",
        "generator noise: uniform (authors' code) or gaussian (paper)",
        choices=("gaussian", "uniform"),
    )
    diversity_weight: float = option(0.0, "weight of FedGen's diversity term (HtFLlib: 0)", ">= 0")
    frozen_generator: bool = option(
        True, "keep the random initial generator, as the authors' runs did; false: train it"
    )


class FeatureGenerator(nn.Module):
    """G(z, y): a one-hidden-layer MLP on the concatenated one-hot label and noise."""

    def __init__(
        self, noise_dim: int, num_classes: int, hidden_dim: int, feature_dim: int, noise: str
    ) -> None:
        super().__init__()
        self.noise_dim, self.num_classes, self.noise = noise_dim, num_classes, noise
        self.net = nn.Sequential(
            nn.Linear(noise_dim + num_classes, hidden_dim),
            nn.BatchNorm1d(hidden_dim, track_running_stats=False),
            nn.ReLU(),
            nn.Linear(hidden_dim, feature_dim),
        )

    def forward(self, labels: Tensor, norm: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Features for ``labels`` (N,) and the noise that produced them.

        ``norm``: rescale every feature to this L2 norm (the trained generator's bound).
        """
        shape, device = (labels.shape[0], self.noise_dim), labels.device
        eps = torch.randn(shape, device=device)
        if self.noise == "uniform":
            eps = torch.rand(shape, device=device)
        onehot = F.one_hot(labels, self.num_classes).float()
        feats = self.net(torch.cat([onehot, eps], dim=1))
        if norm is not None:
            feats = feats * (norm / feats.norm(dim=1, keepdim=True).clamp_min(1e-12))
        return feats, eps


def diversity_loss(noise: Tensor, feats: Tensor) -> Tensor:
    """FedGen's diversity term: exp(-mean_ij ||z_i - z_j||^2 / k * |g_i - g_j|_1 / d).

    Small when samples with distant noise get distant features (it fights mode collapse).
    """
    noise_dist = torch.cdist(noise, noise).pow(2) / noise.shape[1]
    feat_dist = torch.cdist(feats, feats, p=1) / feats.shape[1]
    return torch.exp(-(noise_dist * feat_dist).mean())


@dataclass
class FedGenState:
    generator: FeatureGenerator  # the server's, loaded from each broadcast that carries it
    norm_sum: Tensor  # this round's sum of real-feature norms (trained generator)
    norm_count: int = 0
    label_counts: Tensor | None = None  # None: no generator received yet
    feature_norm: Tensor | None = None


def new_generator(opts: FedGenOptions, ctx: RunContext) -> FeatureGenerator:
    """A fresh generator (the server trains one; each client holds a copy it loads)."""
    return FeatureGenerator(
        opts.noise_dim, ctx.num_classes, opts.hidden_dim, ctx.feature_dim, opts.noise
    ).to(ctx.device)


class FedGenClient(ClientHalf):
    State = FedGenState
    start_from = "head"

    def init_client(self, client: Client) -> FedGenState:
        # The generator's weights come with the messages.
        return FedGenState(
            new_generator(self.opts, self.ctx), torch.zeros((), device=client.device)
        )

    def setup_upload(self, client: Client) -> Message:
        return super().setup_upload(client) if self.opts.share_head else {}

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        state = client.state
        if not self.opts.frozen_generator:  # the real-feature norm, from this forward pass
            state.norm_sum += feats.detach().float().norm(dim=1).sum()
            state.norm_count += feats.shape[0]
        counts = state.label_counts
        if counts is None or self.opts.gen_weight == 0:
            return None
        with torch.no_grad():  # the generator is the server's; only the head learns here
            labels = torch.multinomial(counts.float(), y.shape[0], replacement=True)
            generated, _ = state.generator(labels, state.feature_norm)
        out = client.model.head(generated.to(feats.dtype))
        return self.opts.gen_weight * F.cross_entropy(out.float(), labels)

    def upload(self, client: Client) -> Message:
        out = head_message(client.model) | {"counts": client.class_counts()}
        if not self.opts.frozen_generator:  # mean real-feature norm of this round's training
            state = client.state
            count, total = state.norm_count, state.norm_sum
            state.norm_sum, state.norm_count = torch.zeros_like(total), 0
            out["feature_norm"] = total.cpu() / max(count, 1)
            out["norm_count"] = torch.tensor(float(count))
        return out

    def receive(self, client: Client, message: Message) -> None:
        load_model_message(client.model, message)  # the averaged head, if one came
        if "label_counts" in message:
            weights = {k[len(_GEN) :]: v for k, v in message.items() if k.startswith(_GEN)}
            client.state.generator.load_state_dict(weights)
            client.state.label_counts = message["label_counts"].to(client.device)
            if "feature_norm" in message:
                client.state.feature_norm = message["feature_norm"].to(client.device)


class FedGenServer(ServerHalf):
    server_state = (
        "generator",
        "global_head",
        "label_counts",
        "feature_norm",
        "global_protos",
        "metrics",
    )

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        opts = self.opts
        self.generator = new_generator(opts, self.ctx)
        self.global_head: Message | None = None  # a head message (model_messages.HEAD_KEYS)
        self.label_counts: Tensor | None = None
        self.feature_norm: Tensor | None = None  # trained generator only (see the docstring)
        self.global_protos: Tensor | None = None
        if not opts.frozen_generator:
            self.metrics = dict.fromkeys(("generator_loss", "generator_acc"), float("nan"))
        first: Message = {}
        if opts.share_head:  # one common starting head, like the authors' round-0 broadcast
            self.global_head = uploads[0]
            first |= self.global_head
        if opts.frozen_generator:
            self.label_counts = torch.tensor([f.class_counts for f in facts]).sum(0)
            first |= self._generator_message()
        return first

    def _generator_message(self) -> Message:
        weights = {_GEN + k: v.detach() for k, v in self.generator.state_dict().items()}
        norm = {} if self.feature_norm is None else {"feature_norm": self.feature_norm}
        return weights | norm | {"label_counts": self.label_counts}

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        device, rows = self.ctx.device, list(uploads.values())
        heads = [message_head(u) for u in rows]
        weight = torch.stack([w for w, _ in heads]).to(device)  # (K, C, d)
        bias = torch.stack([b for _, b in heads]).to(device)  # (K, C)
        counts = torch.stack([u["counts"] for u in rows]).to(device).float()  # (K, C)
        if self.opts.share_head:  # sample-weighted (FedAvg) mean of the heads
            sizes = normalized_weights(counts.sum(1).tolist())
            self.global_head = fedavg(rows, sizes, HEAD_KEYS)
        if not self.opts.frozen_generator:
            self.label_counts = counts.sum(0).long().cpu()
            seen = torch.stack([u["norm_count"] for u in rows]).to(device)
            norms = torch.stack([u["feature_norm"] for u in rows]).to(device)
            self.feature_norm = (norms * seen).sum() / seen.sum().clamp(min=1)
            self._train_generator(weight, bias, counts)
        self.global_protos = self._class_means()

    def message(self) -> Message:
        out: Message = dict(self.global_head) if self.opts.share_head else {}
        if not self.opts.frozen_generator:  # a frozen one was sent once, in set-up
            out |= self._generator_message()
        return out

    def _ensemble_weights(self, counts: Tensor) -> Tensor:
        """(K, C): how much client k's head counts for a sample of class c."""
        if self.opts.ensemble_weighting == "class_counts":
            return counts / counts.sum(0, keepdim=True).clamp(min=1)
        sizes = counts.sum(1, keepdim=True)
        return (sizes / sizes.sum()).expand_as(counts)

    def _train_generator(self, weight: Tensor, bias: Tensor, counts: Tensor) -> None:
        opts, gen = self.opts, self.generator
        if opts.server_epochs == 0:
            return
        share = self._ensemble_weights(counts)
        label_p = counts.sum(0)
        optimizer = torch.optim.Adam(gen.parameters(), lr=opts.generator_lr)
        gen.train()
        for _ in range(opts.server_epochs):
            labels = torch.multinomial(label_p, opts.server_batch, replacement=True)
            feats, eps = gen(labels, self.feature_norm)
            per_head = torch.einsum("nd,kcd->knc", feats, weight) + bias[:, None, :]
            logits = (share[:, labels].unsqueeze(-1) * per_head).sum(0)
            loss = F.cross_entropy(logits, labels)
            if opts.diversity_weight > 0:
                loss = loss + opts.diversity_weight * diversity_loss(eps, feats)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self.metrics = {
            "generator_loss": float(loss.detach()),
            "generator_acc": float((logits.argmax(1) == labels).float().mean()),
        }

    @torch.no_grad()
    def _class_means(self) -> Tensor:
        """Mean generated feature per class (zero rows for classes nobody holds)."""
        present = (self.label_counts > 0).nonzero().flatten().to(self.ctx.device)
        labels = present.repeat(_PROTO_SAMPLES)  # balanced batch: batch-norm stats are shared
        feats, _ = self.generator(labels, self.feature_norm)
        out = torch.zeros(self.ctx.num_classes, feats.shape[1], device=feats.device)
        out.index_add_(0, labels, feats)
        return out / _PROTO_SAMPLES

    def artifacts(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if self.global_protos is not None:
            out["global_prototypes"] = self.global_protos
        if self.global_head is not None:
            out["global_head"] = message_head(self.global_head)[0]
        return out


FedGen = register(Algorithm("fedgen", FedGenClient, FedGenServer, FedGenOptions, revision=2))
