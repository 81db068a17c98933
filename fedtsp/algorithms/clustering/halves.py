"""Clustered FL: one model per cluster of clients, FedAvg inside each cluster (not a method:
the two halves that FedAvg in fixed clusters, FMCL, PACFL, IFCA and CFL share).

The server keeps a cluster per client and one model per cluster; it sends each client its
cluster's model (``configure``: one message per client); a client trains the whole model
with cross-entropy and uploads its floating-point state with its train size; the server
averages each cluster's uploads, sample-weighted (a cluster nobody trained in keeps its
model).

One initialisation protocol for every clustered method (the oracle, FedAvg, FMCL, PACFL,
CFL and IFCA alike): cluster k starts from ``cluster_start(k)``, client 0's initial weights
for k = 0 (as a FedAvg server sends its global model in round 0) and, for k >= 1, a model
drawn under a seed fixed by (run seed, k). So the oracle's group k and IFCA's model k start
from the same weights, and no method gets independent starts the others lack.

Evaluation is personalised (setting ``pfl``): every client scores the model of its cluster
on its own test split, before the next round's training.

Methods that find their clusters from a one-shot descriptor (FMCL's signatures, PACFL's
subspaces) have every client send it in set-up and cluster before round 0, so that round 0
already trains each cluster's own start; its bytes count in the set-up's upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from fedtsp.algorithms.base import ClientHalf, Message, RunContext, ServerHalf
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.clustering.oneshot import ClusteringOptions, canonical_labels
from fedtsp.algorithms.model_messages import (
    MODEL_PREFIX,
    average_model_messages,
    load_model_message,
    model_message,
    with_sample_count,
)
from fedtsp.algorithms.shared_model import seeded
from fedtsp.core.options import option
from fedtsp.models.families import build_model

CLUSTER_START_TAG = 0x1FCA  # cluster k >= 1 starts from the model drawn under (seed, tag + k)


def cluster_start(ctx: RunContext, facts: ClientFacts, start: Message, k: int) -> Message:
    """Cluster k's initial model: the common start (client 0's weights) for k = 0, else a
    model of client 0's architecture drawn under a seed fixed by (run seed, k)."""
    if k == 0:
        return start
    with seeded(ctx, tag=CLUSTER_START_TAG + k):
        model = build_model(
            facts.arch,
            ctx.num_classes,
            feature_dim=ctx.feature_dim,
            in_channels=facts.in_channels,
            image_size=facts.image_size,
        )
    return model_message(model.to(ctx.device))


@dataclass
class ClusteringFields:
    """The one-shot clustering of a distance matrix (`fedtsp.algorithms.clustering.oneshot`)."""

    method: str = option("agglomerative", "agglomerative (on the distances) or kmeans (on MDS)")
    linkage: str = option("average", "agglomerative linkage: average, complete or single")
    num_clusters: int | None = option(None, "a fixed k; none: chosen by `selection`")
    selection: str = option("silhouette", "silhouette (best k in 2..max_clusters) or threshold")
    max_clusters: int = option(10, "largest k the silhouette selection tries")
    min_silhouette: float = option(0.1, "below this best silhouette: one cluster")
    distance_threshold: float = option(0.5, "selection=threshold: dendrogram cut")

    def clustering(self) -> ClusteringOptions:
        return ClusteringOptions(
            method=self.method,
            linkage=self.linkage,
            num_clusters=self.num_clusters,
            selection=self.selection,
            max_clusters=self.max_clusters,
            min_silhouette=self.min_silhouette,
            distance_threshold=self.distance_threshold,
        )

    def validate(self) -> None:
        self.clustering().validate()


@dataclass
class ClusterClientState:
    cluster: int = 0  # IFCA: the model this client picked last


class ClusteredClient(ClientHalf):
    """Trains its cluster's model and uploads it; a one-shot method adds its descriptor to
    the set-up upload (``extra_upload``)."""

    State = ClusterClientState
    start_from = "model"
    communicates = True  # False: Local, nothing is sent

    def setup_upload(self, client: Client) -> Message:
        if not self.communicates:
            return {}
        return super().setup_upload(client) | self.extra_upload(client)

    def extra_upload(self, client: Client) -> dict[str, Tensor]:
        """What a one-shot method's clients send in set-up, for the server to cluster."""
        return {}

    def upload(self, client: Client) -> Message:
        if not self.communicates:
            return {}
        return with_sample_count(client, model_message(client.model))

    def receive(self, client: Client, message: Message) -> None:
        if message:
            load_model_message(client.model, message)


class ClusteredServer(ServerHalf):
    """Per-cluster FedAvg; subclasses decide the clusters (``initial_assignment``,
    ``cluster_from``)."""

    server_state = ("start", "models", "assignment", "diagnostics")
    communicates = True  # False: Local, nothing is sent

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message | None:
        self.start = {k: v for k, v in uploads[0].items() if k.startswith(MODEL_PREFIX)}
        self.diagnostics: dict[str, Any] = {}
        found = self.initial_assignment()
        if found is None:
            found = canonical_labels(self.cluster_from(uploads))
        self.assignment = np.asarray(found, dtype=np.int64)
        self.models: dict[int, Message] = {}
        if self.communicates:
            for k in sorted(set(self.assignment.tolist())):
                self.models[k] = cluster_start(self.ctx, facts[0], self.start, k)
        return None

    def first_messages(self, client_ids: list[int], first: Message | None) -> dict[int, Message]:
        return self.configure(-1, client_ids)  # each client its cluster's start

    def initial_assignment(self) -> np.ndarray | None:
        """The clusters known before training (None: found from the set-up uploads)."""
        return None

    def cluster_from(self, uploads: dict[int, Message]) -> np.ndarray:
        """The clusters from the set-up uploads' descriptors (one-shot methods)."""
        raise NotImplementedError

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        if not self.communicates:
            return
        for k in sorted(set(self.assignment.tolist())):
            members = [uploads[i] for i in uploads if self.assignment[i] == k]
            if members:
                self.models[k] = average_model_messages(members)

    def configure(self, round_index: int, client_ids: list[int]) -> dict[int, Message]:
        if not self.communicates:
            return dict.fromkeys(client_ids, {})
        return {i: self.models[int(self.assignment[i])] for i in client_ids}

    def round_metrics(self) -> dict[str, Any]:
        return {"num_clusters": int(len(set(self.assignment.tolist())))}

    def record_extras(self) -> dict[str, Any]:
        return {"assignment": self.assignment.tolist(), "clustering": self.diagnostics}


def jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """A clustering's diagnostics (arrays, int-keyed dicts) as JSON-ready values."""
    out = {}
    for key, value in info.items():
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, dict):
            value = {str(k): v for k, v in value.items()}
        out[key] = value
    return out
