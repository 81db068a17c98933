"""FedETF (Li et al., "No Fear of Classifier Biases: Neural Collapse Inspired Federated
Learning with Synthetic and Fixed Classifier", ICCV 2023) and its personalised form
FedETF-Per.

The classifier is a fixed simplex equiangular tight frame (ETF): C unit vectors in R^d with
pairwise cosine -1/(C-1), the geometry classifiers converge to under neural collapse. Every
client classifies ``s * <w_c, normalize(P f(x))>``: the features pass a trainable projection
layer P (d x d), are L2-normalised and compared with the ETF columns, scaled by a learnable
temperature ``s`` (starting at 10). The ETF is built once from the run seed and never
trained or sent; body, projection and temperature are averaged with FedAvg. Local training
uses the balanced loss of the paper: cross-entropy on logits shifted by the log of the
client's class prior (``balanced_loss``), which counters the local label skew.

FedETF-Per (``fedetf-per``, setting pfl): each client starts a personal linear classifier at
the scaled ETF and fine-tunes it on its normalised projected features before evaluation (the
package's "-FT" mechanism, ``fedtsp.algorithms.finetune``). The paper's local adaptation
also fine-tunes the projection layer; here, as for every PFL "-FT" method of Table 3, only
the classifier adapts. Its bias starts at the client's log class prior (``prior_bias``): the
balanced loss trains prior-free logits, and adding log p(y) is the correction for a test
split drawn from the client's own label distribution; a few epochs of head fine-tuning at
lr 0.01 move a zero bias too little to learn it (measured at cpu scale: 10.1 % without it,
the global model's level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtsp.algorithms.averaging import FedAvgClient, FedAvgServer
from fedtsp.algorithms.base import Algorithm, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.finetune import FineTuned, FineTuneOptions, HeadFineTuning
from fedtsp.core.options import option

SCALE_INIT = 10.0


def simplex_etf(num_classes: int, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """A (dim, num_classes) simplex ETF: unit-norm columns, pairwise cosine -1/(C-1).

    ``sqrt(C/(C-1)) * U (I - 11^T/C)`` with U a random (dim, C) matrix of orthonormal columns,
    which needs dim >= C.
    """
    c = num_classes
    if c < 2 or dim < c:
        raise ValueError(
            f"a simplex ETF of {c} classes needs 2 <= classes <= feature width, got width {dim}"
        )
    u, _ = torch.linalg.qr(torch.randn(dim, c, generator=generator, dtype=torch.float64))
    centred = torch.eye(c, dtype=torch.float64) - 1.0 / c
    return (math.sqrt(c / (c - 1)) * u @ centred).float()


class ETFHead(nn.Module):
    """Projection -> L2 normalisation -> fixed ETF, times a learnable temperature."""

    def __init__(self, etf: Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = etf.shape
        self.proj = nn.Linear(self.in_features, self.in_features)
        self.log_scale = nn.Parameter(torch.tensor(math.log(SCALE_INIT)))
        self.register_buffer("etf", etf.clone())

    def normalized(self, feats: Tensor) -> Tensor:
        return F.normalize(self.proj(feats), dim=1)

    def forward(self, feats: Tensor) -> Tensor:
        return self.log_scale.exp() * self.normalized(feats) @ self.etf.to(feats.dtype)


@dataclass
class FedETFOptions:
    balanced_loss: bool = option(True, "cross-entropy on prior-adjusted logits (paper)")


@dataclass
class FedETFState:
    log_prior: Tensor  # log p(y) of the client's training labels (the balanced loss)


class FedETFClient(FedAvgClient):
    State = FedETFState

    def shares(self, key: str) -> bool:
        return key != "head.etf"  # fixed and known to all: never sent

    def init_client(self, client: Client) -> FedETFState:
        # The fixed ETF is a function of the run seed: every client builds the same one.
        seed = int(np.random.SeedSequence([self.ctx.seed, 0xE7F]).generate_state(1)[0])
        etf = simplex_etf(
            self.ctx.num_classes, self.ctx.feature_dim, torch.Generator().manual_seed(seed)
        )
        client.model.head = ETFHead(etf).to(client.device)
        counts = client.class_counts().float()
        return self.State(torch.log(counts / counts.sum() + 1e-12))

    def train_loss(self, client: Client, x: Tensor, y: Tensor) -> Tensor:
        logits = client.model(x)
        if self.opts.balanced_loss:
            logits = logits + client.state.log_prior.to(logits.dtype)
        return F.cross_entropy(logits, y)


FedETF = register(Algorithm("fedetf", FedETFClient, FedAvgServer, FedETFOptions, settings=("gfl",)))


@dataclass
class FedETFPerOptions(FineTuneOptions, FedETFOptions):
    prior_bias: bool = option(True, "start the personal classifier's bias at log p(y) (else 0)")


@dataclass
class FedETFPerState(FineTuned, FedETFState):  # fields: log_prior, then ft_head
    pass


class FedETFPerClient(HeadFineTuning, FedETFClient):
    State = FedETFPerState

    def ft_features(self, client: Client, x: Tensor) -> Tensor:
        return client.model.head.normalized(client.model.features(x))

    def ft_initial_head(self, client: Client) -> tuple[Tensor, Tensor]:
        head = client.model.head
        weight = (head.log_scale.exp() * head.etf.T).detach().float()
        if self.opts.prior_bias:
            return weight, client.state.log_prior.to(weight.device).float().clone()
        return weight, torch.zeros(weight.shape[0], device=weight.device)


FedETFPer = register(
    Algorithm("fedetf-per", FedETFPerClient, FedAvgServer, FedETFPerOptions, settings=("pfl",))
)
