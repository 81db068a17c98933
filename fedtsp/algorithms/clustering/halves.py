"""Clustered FL: one model per cluster of clients, FedAvg inside each cluster (not a method:
the two halves that FedAvg in fixed clusters, FMCL, PACFL, IFCA and CFL share).

The server keeps a cluster per client and one model per cluster; it sends each client its
cluster's model (``configure``: one message per client); a client trains the whole model
with cross-entropy and uploads its floating-point state with its train size; the server
averages each cluster's uploads, sample-weighted (a cluster nobody trained in keeps its
model). Every client starts from one model (client 0's initial weights, as a FedAvg server
sends its global model in round 0).

Evaluation is personalised (setting ``pfl``): every client scores the model of its cluster
on its own test split, before the next round's training.

Methods that find their clusters from a one-shot upload (FMCL's signatures, PACFL's
subspaces) send it with the first upload of round 0 and cluster before that round's
averaging. Round 0's training starts from the one common model in every cluster, so this
is the same as clustering in a set-up exchange before training, without a message type of
its own; its bytes count in round 0's upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from fedtsp.algorithms.base import ClientHalf, Message, ServerHalf
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.clustering.oneshot import ClusteringOptions, canonical_labels
from fedtsp.algorithms.model_messages import (
    average_model_messages,
    load_model_message,
    model_message,
    with_sample_count,
)
from fedtsp.core.options import option


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
    sent_descriptor: bool = False  # a one-shot method's descriptor went with an upload
    cluster: int = 0  # IFCA: the model this client picked last


class ClusteredClient(ClientHalf):
    """Trains its cluster's model and uploads it; subclasses may add to the first upload
    (``extra_upload``)."""

    State = ClusterClientState
    start_from = "model"
    communicates = True  # False: Local, nothing is sent

    def upload(self, client: Client) -> Message:
        if not self.communicates:
            return {}
        message = with_sample_count(client, model_message(client.model))
        if not client.state.sent_descriptor:
            client.state.sent_descriptor = True
            message |= self.extra_upload(client)
        return message

    def extra_upload(self, client: Client) -> dict[str, Tensor]:
        """What a one-shot method adds to a client's first upload."""
        return {}

    def receive(self, client: Client, message: Message) -> None:
        if message:
            load_model_message(client.model, message)


class ClusteredServer(ServerHalf):
    """Per-cluster FedAvg; subclasses decide the clusters (``initial_assignment``,
    ``cluster_from``)."""

    server_state = ("start", "models", "assignment", "diagnostics")
    communicates = True  # False: Local, nothing is sent

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message | None:
        self.start = dict(uploads[0])
        self.models: dict[int, Message] = {}
        found = self.initial_assignment()
        self.assignment = None if found is None else np.asarray(found, dtype=np.int64)
        self.diagnostics: dict[str, Any] = {}
        return self.start if self.communicates else None

    def initial_assignment(self) -> np.ndarray | None:
        """The clusters known before any upload (None: found from the first uploads)."""
        return None

    def cluster_from(self, uploads: dict[int, Message]) -> np.ndarray:
        """The clusters from the first round's uploads (one-shot methods)."""
        raise NotImplementedError

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        if self.assignment is None:
            self.assignment = canonical_labels(self.cluster_from(uploads))
        if not self.communicates:
            return
        for k in sorted(set(self.assignment.tolist())):
            members = [uploads[i] for i in uploads if self.assignment[i] == k]
            if members:
                self.models[k] = average_model_messages(members)

    def configure(self, round_index: int, client_ids: list[int]) -> dict[int, Message]:
        if not self.communicates:
            return dict.fromkeys(client_ids, {})
        return {i: self.models.get(int(self.assignment[i]), self.start) for i in client_ids}

    def round_metrics(self) -> dict[str, Any]:
        return {"num_clusters": int(len(set(self.assignment.tolist())))}

    def record_extras(self) -> dict[str, Any]:
        found = None if self.assignment is None else self.assignment.tolist()
        return {"assignment": found, "clustering": self.diagnostics}


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
