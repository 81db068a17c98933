"""FedGH (Yi, Wang, Liu, Shi and Yu, ACM Multimedia 2023): a generalized global header.

After local training (plain cross-entropy) each client uploads the class-mean features
of the classes it holds; the server trains one global head ``Linear(d, C)`` on those
(prototype, class) pairs with cross-entropy and sends it back, and every client replaces
its own head with it.

Defaults are those of the runs behind the paper's Table 1 (the authors' FedGH script leaves
HtFLlib's defaults in place): ``server_epochs`` = 100 epochs of plain SGD (lr 0.01, a fresh
optimiser every round) over the uploaded pairs in shuffled mini-batches of ``server_batch``
= 100 (the clients' batch size). With ~60 uploaded prototypes per round one epoch is a
single SGD step, which leaves the head near its random initialisation. The server's head
starts as a copy of client 0's head, sent once in the set-up message, so every client
starts from the same head. Evaluation uses each client's head, which is the global head
received at the end of the previous round.

Revision 1 (run keys): ``server_epochs`` defaulted to 1 before; those records are not reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtsp.algorithms.aggregation import unweighted_class_means
from fedtsp.algorithms.base import Algorithm, ClientHalf, Message, ServerHalf, register
from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import load_head, message_head
from fedtsp.core.options import option


@dataclass
class FedGHOptions:
    server_lr: float = option(0.01, "SGD learning rate of the global head", "> 0")
    server_epochs: int = option(
        100, "server epochs over the uploaded (prototype, class) pairs (HtFLlib -se)", ">= 1"
    )
    server_batch: int = option(100, "server mini-batch of uploaded prototypes", ">= 1")


class FedGHClient(ClientHalf):
    start_from = "head"

    def upload(self, client: Client) -> Message:
        means, counts = client.class_prototypes()
        present = counts > 0
        return {"protos": means[present], "present": present}

    def receive(self, client: Client, message: Message) -> None:
        load_head(client, message["head.weight"], message["head.bias"])


class FedGHServer(ServerHalf):
    server_state = ("head", "class_means")

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message:
        weight, bias = message_head(uploads[0])
        self.head = nn.Linear(weight.shape[1], weight.shape[0]).to(self.ctx.device)
        self.head.load_state_dict({"weight": weight, "bias": bias})
        self.class_means: Tensor | None = None
        return self.message()

    @torch.no_grad()
    def _fit(self, protos: Tensor, labels: Tensor) -> tuple[float, float]:
        logits = self.head(protos)
        acc = float((logits.argmax(1) == labels).float().mean())
        return float(F.cross_entropy(logits, labels)), acc

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        protos, labels, self.class_means, _ = unweighted_class_means(
            list(uploads.values()), self.ctx.num_classes, self.ctx.device
        )
        loss_before, acc_before = self._fit(protos, labels)
        # Plain SGD keeps no state, so a fresh optimiser per round is exact on resume.
        optimizer = torch.optim.SGD(self.head.parameters(), lr=self.opts.server_lr)
        for _ in range(self.opts.server_epochs):
            for idx in (
                torch.randperm(labels.shape[0]).to(labels.device).split(self.opts.server_batch)
            ):
                loss = F.cross_entropy(self.head(protos[idx]), labels[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        loss_after, acc_after = self._fit(protos, labels)
        self.metrics = {
            "server_loss_before": loss_before,
            "server_loss_after": loss_after,
            "proto_acc_before": acc_before,
            "proto_acc_after": acc_after,
        }

    def message(self) -> Message:
        return {"head.weight": self.head.weight.detach(), "head.bias": self.head.bias.detach()}

    def artifacts(self) -> dict[str, Tensor]:
        out = {
            "global_head": self.head.weight.detach(),
            "global_head_bias": self.head.bias.detach(),
        }
        if self.class_means is not None:
            out["global_prototypes"] = self.class_means
        return out


FedGH = register(Algorithm("fedgh", FedGHClient, FedGHServer, FedGHOptions, revision=1))
