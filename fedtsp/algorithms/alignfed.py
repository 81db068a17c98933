"""AlignFed (Zhu, Liu, Tang and Niu, IEEE Transactions on Mobile Computing, 2024).

The server builds fixed class anchors once, spread uniformly over the unit hypersphere,
and clients add ``lambda(t)`` times a contrastive loss that pulls every feature to its
class's anchor, with lambda decaying from ``lam_start`` to ``lam_end`` over the run.
Feature extractors stay personal; the small heads are averaged (FedAvg, weighted by sample
counts) every round and sent back to all clients.

Client loss (``client_loss``), with s_ic = cos(f(x_i), a_c) / temperature on a batch of B:

- ``"anchor_softmax"`` (default; the authors' code behind Table 1): for each anchor c a
  softmax over the batch's samples, -log(exp(s_ic) / sum_j exp(s_jc)) averaged over the
  positives i of class c, then averaged over all C anchors, an anchor without positives in
  the batch counting 0.
- ``"sample_softmax"``: for each sample a cross-entropy over the C anchors,
  CE(s_i, y_i), averaged over the batch. At the same lambda its gradient is about C / k
  times the default's (k = classes in the batch).

Anchors (paper: "Aligning before Aggregating: Enabling Communication Efficient
Cross-Domain Federated Learning via Consistent Feature Extraction"): start uniform in
[-1, 1], L2-normalise, then ``anchor_iters`` SGD steps on the mean over anchors of the
log-sum-exp of their cosine similarities to the other anchors over ``anchor_tau``. The
self-similarity (always 1) is left out of the log-sum-exp. The gradient is written out
and the steps run in the span of the initial anchors (at most C dimensions, which every
step stays in), in float64 numpy: identical to autograd SGD up to rounding, and 100,000
steps take about 2 s for C = 10 instead of minutes.

Revision 1 (run keys): ``"sample_softmax"`` was the only form before.

Departures: the anchors and the server's initial head (a copy of client 0's) are sent
once in the set-up message, so every client starts from the same head; the weight
lambda(t) is computed on each client from the number of broadcasts it has received.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import fedavg, normalized_weights
from fedtsp.algorithms.base import Algorithm, ClientHalf, Message, ServerHalf, register
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import message_head
from fedtsp.algorithms.prototypes import ANCHOR_ITERS, ANCHOR_LR, ANCHOR_TAU, uniform_anchors
from fedtsp.core.options import option

CLIENT_LOSSES = ("anchor_softmax", "sample_softmax")


@dataclass
class AlignFedOptions:
    lam_start: float = option(20.0, "anchor-loss weight lambda(0)", "> 0")
    lam_end: float = option(
        2.0, "anchor-loss weight reached after all rounds (geometric decay)", "> 0"
    )
    temperature: float = option(1.0, "temperature of the client's cosine-to-anchor softmax", "> 0")
    anchor_iters: int = option(
        ANCHOR_ITERS, "SGD steps that spread the anchors on the sphere", ">= 0"
    )
    anchor_lr: float = option(ANCHOR_LR, "learning rate of the anchor construction", "> 0")
    anchor_tau: float = option(ANCHOR_TAU, "temperature of the anchors' uniformity loss", "> 0")
    client_loss: str = option(
        "anchor_softmax",
        "anchor_softmax (authors' code) or sample_softmax (per-sample CE)",
        choices=CLIENT_LOSSES,
    )


def anchor_loss(feats: Tensor, y: Tensor, anchors: Tensor, temperature: float, form: str) -> Tensor:
    """The client's alignment term (see the module docstring for the two forms)."""
    sims = F.normalize(feats.float(), dim=1) @ anchors.T / temperature  # (B, C); unit anchors
    if form == "sample_softmax":
        return F.cross_entropy(sims, y)
    log_p = sims.log_softmax(dim=0)  # per anchor, over the batch's samples
    positives = F.one_hot(y, anchors.shape[0]).to(log_p.dtype)
    per_anchor = (log_p * positives).sum(0) / positives.sum(0).clamp(min=1)
    return -per_anchor.mean()


@dataclass
class AlignFedState:
    anchors: Tensor | None = None  # from the set-up message
    round: int = 0  # broadcasts received since then


def anchor_weight(opts: AlignFedOptions, rounds: int, round_index: int) -> float:
    """lambda(t) = lam_start * (lam_end / lam_start) ** (t / R)."""
    ratio = round_index / max(rounds, 1)
    return opts.lam_start * math.exp(math.log(opts.lam_end / opts.lam_start) * ratio)


class AlignFedClient(ClientHalf):
    State = AlignFedState
    start_from = "head"

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        anchors = client.state.anchors
        if anchors is None:
            return None
        loss = anchor_loss(feats, y, anchors, self.opts.temperature, self.opts.client_loss)
        return anchor_weight(self.opts, self.ctx.rounds, client.state.round) * loss

    def upload(self, client: Client) -> Message:
        head = client.model.head
        return {
            "head.weight": head.weight.detach().clone(),  # a snapshot, not a view
            "head.bias": head.bias.detach().clone(),
            "num_samples": torch.tensor(client.num_train),
        }

    def receive(self, client: Client, message: Message) -> None:
        if "anchors" in message:  # the one-time set-up message
            client.state.anchors = message["anchors"].to(client.device)
            client.state.round = 0
        else:
            client.state.round += 1
        head = client.model.head
        with torch.no_grad():  # in place: the client's optimiser holds these parameters
            head.weight.copy_(message["head.weight"])
            head.bias.copy_(message["head.bias"])


class AlignFedServer(ServerHalf):
    server_state = ("anchors", "head")

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        opts = self.opts
        anchors = uniform_anchors(
            self.ctx.num_classes,
            self.ctx.feature_dim,
            opts.anchor_iters,
            opts.anchor_lr,
            opts.anchor_tau,
        )
        self.anchors = anchors.to(self.ctx.device)
        weight, bias = message_head(uploads[0])
        self.head = {"weight": weight, "bias": bias}
        return {"anchors": self.anchors, **self.message()}

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        rows = list(uploads.values())
        weights = normalized_weights([u["num_samples"] for u in rows])
        mean = fedavg(rows, weights, ["head.weight", "head.bias"])
        self.head = {key: mean[f"head.{key}"].to(self.ctx.device) for key in ("weight", "bias")}
        self.metrics = {"anchor_lam": anchor_weight(self.opts, self.ctx.rounds, round_index)}

    def message(self) -> Message:
        return {"head.weight": self.head["weight"], "head.bias": self.head["bias"]}

    def artifacts(self) -> dict[str, Tensor]:
        return {"global_prototypes": self.anchors}


AlignFed = register(
    Algorithm("alignfed", AlignFedClient, AlignFedServer, AlignFedOptions, revision=1)
)
