"""The client half of a round, the same on every transport: receive, evaluate, train, upload.

The in-process simulator runs these steps for all clients in memory; a Flower node runs
them for its one client. Both report a :class:`ClientReply`, the only thing (besides the
upload) that goes back to the server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fedtsp.algorithms.base import Algorithm, Message
from fedtsp.clients import Client, EvalResult, NonFiniteLossError
from fedtsp.config import RunConfig
from fedtsp.seeding import derive_seed, seed_everything

GlobalTest = tuple[torch.Tensor, torch.Tensor]
TRAINING_STREAM = 1  # tells a client's training seed from its batch-order seed


@dataclass(frozen=True)
class RoundWork:
    """What the server asks of every client in round ``round``."""

    round: int
    train: bool  # False in the closing round: evaluation only
    global_eval: bool  # also score on the global test set
    gfl_client: int | None = None  # gfl: this client's copy is the global model; score it


@dataclass
class ClientReply:
    """One client's report of one round: evaluation counts, training loss, upload, timings."""

    index: int
    evaluation: EvalResult
    global_acc: float | None = None
    gfl: EvalResult | None = None
    train_loss: float | None = None
    upload: Message | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Everything but the upload (that travels as arrays), as JSON-ready values."""
        out = {k: v for k, v in vars(self).items() if k != "upload"}
        out["evaluation"] = vars(self.evaluation)
        out["gfl"] = None if self.gfl is None else vars(self.gfl)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], upload: Message | None) -> ClientReply:
        gfl = data["gfl"]
        return cls(
            **data
            | {
                "evaluation": EvalResult(**data["evaluation"]),
                "gfl": None if gfl is None else EvalResult(**gfl),
                "upload": upload,
            }
        )


def evaluate_client(
    algorithm: Algorithm, client: Client, work: RoundWork, global_test: GlobalTest | None
) -> ClientReply:
    """Score the client's model before its training (the authors' protocol)."""
    start = time.perf_counter()
    algorithm.prepare_evaluation(client, work.round)  # e.g. "-FT" methods tune a head copy
    reply = ClientReply(
        client.index, client.evaluate(algorithm.predict, client.test_x, client.test_y)
    )
    if global_test is not None and work.global_eval:
        reply.global_acc = client.evaluate(algorithm.predict, *global_test).accuracy
    if global_test is not None and work.gfl_client == client.index:
        reply.gfl = client.evaluate(algorithm.predict, *global_test)
    reply.timings["evaluate"] = time.perf_counter() - start
    return reply


def train_client(
    algorithm: Algorithm, client: Client, config: RunConfig, round_index: int
) -> float:
    """Local epochs. Their randomness is a function of (seed, round, client) alone, whatever
    ran before them in this process: the batch order has its own generator, and the global
    RNGs (a method's noise, dropout) are reseeded, so every engine trains alike."""
    generator = torch.Generator().manual_seed(derive_seed(config.seed, round_index, client.index))
    seed_everything(derive_seed(config.seed, round_index, client.index, TRAINING_STREAM))
    try:
        return client.train(
            algorithm.train_loss,
            config.local_epochs,
            config.batch_size,
            generator,
            algorithm.before_step,
        )
    except NonFiniteLossError as exc:
        raise NonFiniteLossError(f"{exc} in round {round_index}; the run stops here") from None


def upload_client(algorithm: Algorithm, client: Client, reply: ClientReply) -> None:
    start = time.perf_counter()
    reply.upload = algorithm.upload(client)
    reply.timings["upload"] = time.perf_counter() - start


def receive_client(algorithm: Algorithm, client: Client, message: Message) -> float:
    """Apply the server's message; return the seconds it took."""
    start = time.perf_counter()
    algorithm.receive(client, message)
    return time.perf_counter() - start
