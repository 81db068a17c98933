"""The client half of set-up and of a round, the same on every transport: set up (state,
optimiser, facts, set-up upload), then each round receive, evaluate, train, upload.

The in-process simulator runs these steps for all clients in memory; a Flower node runs
them for its one client. Both report a :class:`SetupReply` once and a :class:`ClientReply`
per round, the only things that go back to the server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fedtsp.algorithms.base import ClientHalf, Message
from fedtsp.algorithms.clients import Client, ClientFacts, EvalResult, NonFiniteLossError
from fedtsp.core.config import RunConfig
from fedtsp.core.seeding import derive_seed, seed_everything, set_rng_state

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
class SetupReply:
    """What a client tells the server in set-up."""

    facts: ClientFacts
    upload: Message


def start_client(half: ClientHalf, client: Client, config: RunConfig, rng: dict[str, Any]) -> None:
    """The method's client state and the client's optimiser, fresh. Their draws continue the
    run's stream after the models (``rng``, from ``engine.build.initial_models``), so every
    client on every transport draws alike."""
    set_rng_state(rng)
    client.state = half.init_client(client)
    client.optimizer = torch.optim.SGD(half.client_parameters(client), lr=config.lr)


def set_up_client(
    half: ClientHalf, client: Client, config: RunConfig, rng: dict[str, Any]
) -> SetupReply:
    """A fresh client's set-up: its state and optimiser, then its facts and set-up upload."""
    start_client(half, client, config, rng)
    return SetupReply(client.facts(), half.setup_upload(client))


def restore_client(
    half: ClientHalf, client: Client, config: RunConfig, rng: dict[str, Any], saved: Any
) -> None:
    """A resumed client: set up as a fresh one, then loaded from its saved state
    (``Client.state_dict``, the one encoding of a client's state on every transport)."""
    start_client(half, client, config, rng)
    client.load_state_dict(saved)


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
    half: ClientHalf, client: Client, work: RoundWork, global_test: GlobalTest | None
) -> ClientReply:
    """Score the client's model before its training (the authors' protocol)."""
    start = time.perf_counter()
    half.prepare_evaluation(client, work.round)  # e.g. "-FT" methods tune a head copy
    reply = ClientReply(client.index, client.evaluate(half.predict, client.test_x, client.test_y))
    if global_test is not None and work.global_eval:
        reply.global_acc = client.evaluate(half.predict, *global_test).accuracy
    if global_test is not None and work.gfl_client == client.index:
        reply.gfl = client.evaluate(half.predict, *global_test)
    reply.timings["evaluate"] = time.perf_counter() - start
    return reply


def train_client(half: ClientHalf, client: Client, config: RunConfig, reply: ClientReply) -> None:
    """Local epochs of round ``client.round``; the reply gets their mean loss and time.

    Their randomness is a function of (seed, round, client) alone, whatever ran before them
    in this process: the batch order has its own generator, and the global RNGs (a method's
    noise, dropout) are reseeded, so every engine trains alike."""
    start, t = time.perf_counter(), client.round
    generator = torch.Generator().manual_seed(derive_seed(config.seed, t, client.index))
    seed_everything(derive_seed(config.seed, t, client.index, TRAINING_STREAM))
    try:
        reply.train_loss = client.train(
            half.train_loss,
            config.local_epochs,
            config.batch_size,
            generator,
            half.before_step,
        )
    except NonFiniteLossError as exc:
        raise NonFiniteLossError(f"{exc} in round {t}; the run stops here") from None
    reply.timings["train"] = time.perf_counter() - start


def upload_client(half: ClientHalf, client: Client, reply: ClientReply) -> None:
    start = time.perf_counter()
    reply.upload = half.upload(client)
    reply.timings["upload"] = time.perf_counter() - start


def receive_client(half: ClientHalf, client: Client, message: Message) -> float:
    """Apply the server's message; return the seconds it took."""
    start = time.perf_counter()
    half.receive(client, message)
    return time.perf_counter() - start


def clients_round(
    half: ClientHalf,
    clients: list[Client],
    config: RunConfig,
    work: RoundWork,
    global_test: GlobalTest | None,
) -> dict[int, ClientReply]:
    """The client halves of one round for ``clients`` (all of them in the simulator, a
    worker's share in a client process, one on a Flower node), phase by phase: evaluate all,
    train all, upload all. The global RNG starts from ``(seed, round)``, as the server's
    does. Each reply's ``model`` timing is the time its client spent in model calls."""
    seed_everything(derive_seed(config.seed, work.round))
    model_before = [c.model_seconds for c in clients]
    replies = {}
    for client in clients:
        client.round = work.round
        replies[client.index] = evaluate_client(half, client, work, global_test)
    if work.train:
        for client in clients:
            train_client(half, client, config, replies[client.index])
        for client in clients:
            upload_client(half, client, replies[client.index])
    for client, before in zip(clients, model_before, strict=True):
        replies[client.index].timings["model"] = client.model_seconds - before
    return replies


def deliver_to(half: ClientHalf, clients: list[Client], messages: dict[int, Message]) -> float:
    """Hand each of ``clients`` its message, if it has one; the seconds spent receiving."""
    return sum(receive_client(half, c, messages[c.index]) for c in clients if c.index in messages)
