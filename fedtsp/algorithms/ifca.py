"""IFCA (Ghosh et al., NeurIPS 2020): the server keeps K cluster models, each from its own
initialisation; every client picks the one with the lowest loss on its training data. Model
k starts where every clustered method's cluster k starts (`cluster_start`: client 0's
weights for k = 0, a seeded draw per k >= 1), so IFCA's independent starts are the oracle's.

Every round each client receives all K models, evaluates and trains the one it picks and
uploads it with the pick; the server averages the uploads of each cluster (a cluster nobody
picked keeps its model). K (``num_clusters``) must be given; the FMCL benchmark gives it the
true number of groups unless set (an advantage the automatic methods do not have). The
run's clusters are the picks of the last training round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedtsp.algorithms.base import Algorithm, Message, register
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.clustering.halves import ClusteredClient, ClusteredServer, cluster_start
from fedtsp.algorithms.model_messages import (
    average_model_messages,
    load_model_message,
    model_message,
    with_sample_count,
)
from fedtsp.core.options import option

PICK_KEY = "ifca.cluster"


@dataclass
class IFCAOptions:
    num_clusters: int = option(2, "K, the number of cluster models", ">= 1")


def ifca_assign(losses: np.ndarray) -> np.ndarray:
    """Index of the lowest-loss model per client (rows: clients, columns: models; ties: lowest)."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 2 or losses.shape[1] < 1:
        raise ValueError(f"losses must be (clients, models), got shape {losses.shape}")
    return np.argmin(np.where(np.isfinite(losses), losses, np.inf), axis=1).astype(np.int64)


def _tag(j: int) -> str:
    return f"ifca.{j}."  # cluster model j travels as "ifca.<j>.model.<state key>"


def _model_of(message: Message, j: int) -> Message:
    tag = _tag(j)
    return {k[len(tag) :]: v for k, v in message.items() if k.startswith(tag)}


@torch.inference_mode()
def training_loss(client: Client, batch_size: int = 1000) -> float:
    """Mean cross-entropy of the client's current model on its training data."""
    client.model.eval()
    total = 0.0
    for lo in range(0, client.num_train, batch_size):
        x, y = client.train_x[lo : lo + batch_size], client.train_y[lo : lo + batch_size]
        total += float(F.cross_entropy(client.model(x).float(), y, reduction="sum"))
    return total / max(client.num_train, 1)


class IFCAClient(ClusteredClient):
    def receive(self, client: Client, message: Message) -> None:
        losses = []
        for j in range(self.opts.num_clusters):
            load_model_message(client.model, _model_of(message, j))
            losses.append(training_loss(client))
        pick = int(ifca_assign(np.array([losses]))[0])
        load_model_message(client.model, _model_of(message, pick))
        client.state.cluster = pick

    def upload(self, client: Client) -> Message:
        message = with_sample_count(client, model_message(client.model))
        return message | {PICK_KEY: torch.tensor(client.state.cluster, dtype=torch.int64)}


class IFCAServer(ClusteredServer):
    def initial_assignment(self) -> np.ndarray:
        return np.zeros(self.ctx.num_clients, dtype=np.int64)  # until the first picks

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> None:
        super().setup(facts, uploads)
        self.models = {
            j: cluster_start(self.ctx, facts[0], self.start, j)
            for j in range(self.opts.num_clusters)
        }

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        self.assignment = np.array([int(uploads[i][PICK_KEY]) for i in sorted(uploads)])
        for j in range(self.opts.num_clusters):
            members = [uploads[i] for i in sorted(uploads) if int(uploads[i][PICK_KEY]) == j]
            if members:
                self.models[j] = average_model_messages(members)

    def message(self) -> Message:
        return {_tag(j) + k: v for j, model in self.models.items() for k, v in model.items()}

    def configure(self, round_index: int, client_ids: list[int]) -> dict[int, Message]:
        return dict.fromkeys(client_ids, self.message())  # K models down, the same to all

    def round_metrics(self) -> dict[str, Any]:
        return super().round_metrics() | {"assignment": self.assignment.tolist()}


# Revision 1: model 0 is client 0's weights, models k >= 1 the clustered methods' starts.
IFCA = register(
    Algorithm("ifca", IFCAClient, IFCAServer, IFCAOptions, settings=("pfl",), revision=1)
)
