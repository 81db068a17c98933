"""FedPAC (Xu, Tong and Huang, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration", ICLR 2023), setting pfl.

* Feature alignment: the body is shared (FedAvg, sample-weighted) and every client adds
  ``lam * ||f(x) - P_y||^2`` towards the global class prototypes P (the sample-weighted mean
  of the clients' class-mean features).
* Classifier collaboration: heads stay personal, but after each round the server gives client
  i the combination ``sum_j a_ij head_j`` whose weights minimise the paper's estimate of the
  combined head's test loss, a quadratic form over the probability simplex:

      a_i = argmin_{a >= 0, sum a = 1}  a^T (diag(V) + D_i) a,
      V_j = (1 / n_j) sum_c p_jc tr Cov_jc            (variance of client j's statistics)
      D_i[j, k] = sum_c p_ic (mu_ic - mu_jc) . (mu_ic - mu_kc)   (bias w.r.t. client i's classes)

  with mu_jc, Cov_jc, p_jc the class means, covariances and label proportions of client j's
  features (a class client j lacks has mu_jc = 0). Weights below 1e-3 are dropped and the
  rest renormalised, as in the authors' code. The QP is solved by projected gradient descent
  on the simplex (the authors call cvxpy).

Departures: the paper trains the head for one epoch with the body frozen and then the body
with the head fixed; here both train jointly in each step of the package's one-optimiser
client. The broadcast carries every client's combined head (a real server would send each
client only its own), so the recorded download bytes overstate FedPAC's by the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.aggregation import aggregate_prototypes
from fedtsp.algorithms.averaging import FedAvgClient, FedAvgServer
from fedtsp.algorithms.base import Algorithm, ClassTargets, Message, register
from fedtsp.algorithms.clients import Client
from fedtsp.algorithms.model_messages import HEAD_PREFIX, load_head
from fedtsp.core.options import option

WEIGHT_FLOOR = 1e-3


@dataclass
class FedPACOptions:
    lam: float = option(1.0, "weight of the feature alignment ||f(x) - P_y||^2", ">= 0")


def project_to_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of a vector onto {a >= 0, sum a = 1}."""
    u, _ = torch.sort(v, descending=True)
    css = u.cumsum(0) - 1
    idx = torch.arange(1, len(v) + 1, dtype=v.dtype)
    rho = int((u - css / idx > 0).nonzero().max())
    return (v - css[rho] / (rho + 1)).clamp(min=0)


def simplex_qp(matrix: Tensor, steps: int = 2000) -> Tensor:
    """argmin a^T M a over the probability simplex (M symmetric PSD), by projected gradient."""
    m = matrix.double()
    step = 1.0 / max(float(torch.linalg.eigvalsh(m).max()) * 2, 1e-12)
    a = torch.full((m.shape[0],), 1.0 / m.shape[0], dtype=torch.float64)
    for _ in range(steps):
        a = project_to_simplex(a - step * 2 * (m @ a))
    a = torch.where(a < WEIGHT_FLOOR, torch.zeros_like(a), a)
    return a / a.sum()


@torch.inference_mode()
def feature_statistics(client: Client, batch_size: int = 1000) -> tuple[Tensor, Tensor, Tensor]:
    """Class means (C, d), counts (C,) and V = (1/n) sum_c p_c tr Cov_c of the train features."""
    client.model.eval()
    sums = sq = None
    for lo in range(0, client.num_train, batch_size):
        feats = client.model.features(client.train_x[lo : lo + batch_size]).float()
        y = client.train_y[lo : lo + batch_size]
        if sums is None:
            sums = torch.zeros(client.num_classes, feats.shape[1], device=feats.device)
            sq = torch.zeros(client.num_classes, device=feats.device)
        sums.index_add_(0, y, feats)
        sq.index_add_(0, y, feats.pow(2).sum(1))
    counts = client.class_counts()
    n = counts.clamp(min=1).float()
    means = sums / n.unsqueeze(1)
    trace_cov = sq / n - means.pow(2).sum(1)  # E||f||^2 - ||E f||^2 per class
    prior = counts.float() / counts.sum()
    variance = (prior * trace_cov).sum() / client.num_train
    return means, counts, variance


def combination_weights(means: Tensor, counts: Tensor, variances: Tensor) -> Tensor:
    """(N, N) matrix whose row i holds client i's head-combination weights a_i."""
    means, counts, variances = means.double().cpu(), counts.double().cpu(), variances.double()
    priors = counts / counts.sum(1, keepdim=True)
    rows = []
    for i in range(means.shape[0]):
        diff = means[i].unsqueeze(0) - means  # (N, C, d): mu_ic - mu_jc
        weighted = diff * priors[i].sqrt().view(1, -1, 1)
        flat = weighted.reshape(means.shape[0], -1)
        rows.append(simplex_qp(torch.diag(variances.cpu()) + flat @ flat.T))
    return torch.stack(rows).float()


class FedPACClient(FedAvgClient):
    State = ClassTargets

    def shares(self, key: str) -> bool:
        return not key.startswith(HEAD_PREFIX)  # heads are combined per client, not averaged

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        state = client.state
        if not state.pulls(self.opts.lam):
            return None
        known = state.present[y]
        if not bool(known.any()):
            return None
        return self.opts.lam * F.mse_loss(feats[known].float(), state.targets[y[known]])

    def upload(self, client: Client) -> Message:
        means, counts, variance = feature_statistics(client)
        head = client.model.head
        return super().upload(client) | {
            "protos": means,
            "counts": counts,
            "variance": variance,
            "head_weight": head.weight.detach().float(),
            "head_bias": head.bias.detach().float(),
        }

    def receive(self, client: Client, message: Message) -> None:
        super().receive(client, message)
        if "global_protos" not in message:  # round 0: only the common starting model
            return
        client.state.take(message, "global_protos", "global_present", client.device)
        i = client.index
        load_head(client, message["heads_weight"][i], message["heads_bias"][i])


class FedPACServer(FedAvgServer):
    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        super().aggregate(round_index, uploads)
        rows = list(uploads.values())
        means = torch.stack([u["protos"] for u in rows])
        counts = torch.stack([u["counts"] for u in rows])
        protos, present = aggregate_prototypes(list(means), list(counts), "samples")
        weights = combination_weights(means, counts, torch.stack([u["variance"] for u in rows]))
        heads_w = torch.stack([u["head_weight"] for u in rows])
        heads_b = torch.stack([u["head_bias"] for u in rows])
        w = weights.to(heads_w.device)
        self.combined = {
            "global_protos": protos,
            "global_present": present,
            "heads_weight": torch.einsum("ij,jcd->icd", w, heads_w),
            "heads_bias": w @ heads_b,
        }
        # How much each client leans on the others' heads (0: only its own).
        self.metrics = {"head_weight_on_others": float(1 - weights.diagonal().mean())}

    def message(self) -> Message:
        return super().message() | self.combined


FedPAC = register(Algorithm("fedpac", FedPACClient, FedPACServer, FedPACOptions, settings=("pfl",)))
