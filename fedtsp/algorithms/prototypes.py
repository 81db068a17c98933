"""Class targets that several methods share: the client that pulls towards them and
uploads class-mean features (FedProto's and FedTSP's), the class-wise average of uploaded class means
(the server of FedProto, FedPCL and FedDistill), nearest-prototype logits (FedProto and FedTGP's optional
evaluation) and anchors spread uniformly on the sphere (AlignFed's, and FedTSP's simplex
control)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import aggregate_uploads
from fedtsp.algorithms.base import ClassTargets, ClientHalf, Message, ServerHalf
from fedtsp.algorithms.clients import Client, ClientFacts

EVAL_MODES = ("head", "prototype")
# AlignFed's anchor construction (its options' defaults): SGD steps, learning rate, temperature.
ANCHOR_ITERS, ANCHOR_LR, ANCHOR_TAU = 100_000, 0.1, 0.5


def nearest_prototype_logits(
    client: Client, x: Tensor, protos: Tensor, present: Tensor | None = None
) -> Tensor:
    """-||f(x) - P_c|| per class (HtFLlib's prototype evaluation); absent classes get -inf."""
    dist = torch.cdist(client.model.features(x).float(), protos.float())
    return -dist if present is None else (-dist).masked_fill(~present, float("-inf"))


class PrototypeClient(ClientHalf):
    """The client of FedProto and FedTSP: it pulls its features towards the class targets
    it received (``pull``, weighted by ``opts.lam``) and uploads its class-mean features
    from ``opts.prototype_source`` (``Client.prototypes``)."""

    State = ClassTargets

    def pull(self, client: Client, y: Tensor, feats: Tensor) -> Tensor:
        """The unweighted pull term of a batch (the client has targets)."""
        raise NotImplementedError

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        if self.opts.prototype_source == "training":
            client.record_class_sums(feats, y)
        if not client.state.pulls(self.opts.lam):
            return None
        return self.opts.lam * self.pull(client, y, feats)

    def upload(self, client: Client) -> Message:
        means, counts = client.prototypes(self.opts.prototype_source)
        return {"protos": means, "counts": counts}

    def receive(self, client: Client, message: Message) -> None:
        client.state.take(message, "protos", "present", client.device)


class PrototypeAverage(ServerHalf):
    """The server of FedProto and FedPCL (and FedDistill, for class logits): the clients'
    per-class means (``key``, with ``counts``) averaged per class over the clients holding
    it (``opts.weighting``); every client receives them with the mask of the classes some
    client holds."""

    key, artifact = "protos", "global_prototypes"
    server_state = ("global_protos",)

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> None:
        self.global_protos: Tensor | None = None

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        self.global_protos, self.present = aggregate_uploads(uploads, self.key, self.opts.weighting)

    def message(self) -> Message:
        return {self.key: self.global_protos, "present": self.present}

    def artifacts(self) -> dict[str, Tensor]:
        protos = self.global_protos
        return {} if protos is None else {self.artifact: protos}


def uniform_anchors(
    num_classes: int,
    dim: int,
    iters: int = ANCHOR_ITERS,
    lr: float = ANCHOR_LR,
    tau: float = ANCHOR_TAU,
) -> Tensor:
    """Unit-norm (C, d) anchors spread by SGD on the mean log-sum-exp of cosine / tau.

    Draws the start from torch's global RNG. Every gradient is a combination of the
    current anchors, so the iterate never leaves the span of the start: the loop runs on
    C x r coordinates (r = rank <= C) and maps back at the end.
    """
    start = F.normalize(torch.rand(num_classes, dim) * 2 - 1, dim=1).double().numpy()
    basis, coords = np.linalg.qr(start.T)  # start.T = basis @ coords
    z = coords.T.copy()  # (C, r): anchor i = z[i] @ basis.T
    off_diag = ~np.eye(num_classes, dtype=bool)
    scale = 1.0 / (num_classes * tau)
    for _ in range(iters):
        norm = np.sqrt((z * z).sum(1, keepdims=True))
        a = z / norm
        logits = np.where(off_diag, a @ a.T / tau, -np.inf)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = (p + p.T) @ a * scale  # d loss / d a
        grad -= a * (a * grad).sum(1, keepdims=True)  # back through the normalisation
        z -= lr * grad / norm
    anchors = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ basis.T
    return torch.from_numpy(anchors).float()
