"""Client processes: one run's clients split over worker processes, one thread each.

The in-process simulator runs its clients one after the other, each model step on every
core. Small models at batch 100 spread poorly over intra-op threads, while N processes
with one thread each keep N cores busy (the exact and exact-procs columns of
``benchmarks/results/speed_vs_htfllib.md``). :class:`ClientPool` is the simulator's
transport for that case (``run_experiment(..., client_workers=N)``, ``fedtsp run
--client-workers N``):

- each of N workers (forked from a server process that imported this module once) holds
  a fixed share of the clients (model, data, optimiser,
  method state), balanced by their estimated work per round (forward FLOPs of the client's
  architecture x its training and test samples; longest first onto the least loaded);
- a round: every worker runs its share's client halves phase by phase, as the simulator
  does (``client_round.clients_round``); the replies come back and the server half runs
  here; each message goes to the worker holding its client;
- the clients' states come back here for a checkpoint (``snapshot``) and at the end of
  the run, where the record's analysis artefacts read them.

Every client's draws are a function of (seed, round, client) (``client_round``), so a
run's history equals the simulator's at one intra-op thread, key for key (with more
threads, float sums may round differently). The record notes the number of workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch.utils.flop_counter import FlopCounterMode

from fedtsp.algorithms import Message
from fedtsp.algorithms.base import ClientHalf
from fedtsp.algorithms.clients import Client
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.core.threads import single_thread_worker
from fedtsp.engine.client_round import ClientReply, GlobalTest, RoundWork, clients_round, deliver_to

if TYPE_CHECKING:
    from fedtsp.engine.simulation import InProcess


class ClientWorkerError(RuntimeError):
    """A client process ended unexpectedly, or raised an error that could not travel back."""


def check_client_workers(workers: Any) -> int:
    """``workers`` as a positive int, or a one-line ConfigError."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"client_workers={workers!r} is invalid; must be an integer >= 1")
    return workers


def forward_flops(client: Client) -> int:
    """FLOPs of one training image's forward pass through the client's model."""
    model = client.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(client.train_x[:1] if client.num_train else client.test_x[:1])
    finally:
        model.train(was_training)
    return max(int(counter.get_total_flops()), 1)


def client_shares(clients: list[Client], workers: int, local_epochs: int) -> list[list[int]]:
    """Client indices per worker, balanced by the round's estimated work: forward FLOPs x
    (3 x training samples x epochs + test samples); longest first, onto the least loaded."""
    flops: dict[str, int] = {}
    cost = {}
    for c in clients:
        arch = c.model.arch
        if arch not in flops:
            flops[arch] = forward_flops(c)
        cost[c.index] = flops[arch] * (3 * c.num_train * local_epochs + len(c.test_y))
    shares: list[list[int]] = [[] for _ in range(min(workers, len(clients)))]
    loads = [0] * len(shares)
    for index in sorted(cost, key=lambda i: (-cost[i], i)):
        w = loads.index(min(loads))
        shares[w].append(index)
        loads[w] += cost[index]
    return [sorted(s) for s in shares]


def _context() -> multiprocessing.context.BaseContext:
    """Workers fork from a server process that imported this module once, so a pool after
    the first starts in a fraction of a second instead of importing torch again."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _serve(conn: Connection, payload: bytes) -> None:
    """A client process: answer the pool's requests until told to stop."""
    single_thread_worker()
    config, clients, algorithm, global_test = pickle.loads(payload)
    while True:
        request, arg = conn.recv()
        if request == "stop":
            return
        try:
            answer = _answer(request, arg, config, clients, algorithm, global_test)
            conn.send(("ok", answer))
        except Exception as exc:  # every failure goes back to the pool, which raises it
            try:
                error = pickle.dumps(exc)
            except Exception:  # an exception that cannot travel: its name and message do
                error = pickle.dumps(ClientWorkerError(f"{type(exc).__name__}: {exc}"))
            conn.send(("error", (error, traceback.format_exc())))


def _answer(
    request: str,
    arg: Any,
    config: RunConfig,
    clients: list[Client],
    algorithm: ClientHalf,
    global_test: GlobalTest | None,
) -> Any:
    if request == "round":
        return clients_round(algorithm, clients, config, arg, global_test)
    if request == "deliver":
        return deliver_to(algorithm, clients, arg)
    if request == "states":
        return {c.index: c.state_dict() for c in clients}
    raise ValueError(f"unknown request {request!r}")


class ClientPool:
    """The simulator's transport with the client halves in ``workers`` processes.

    The workers start on first use, from the clients as they are then (fresh, or loaded
    from a checkpoint), and stop at :meth:`close`. After an error the pool is spent: close
    it (``run_experiment`` does).
    """

    def __init__(self, local: InProcess, workers: int) -> None:
        self.local = local  # the clients, set up or restored here before the workers start
        self.failures = local.failures
        self.workers = check_client_workers(workers)
        self._conns: list[Connection] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._shares: list[list[int]] = []

    def _start(self) -> None:
        if self._conns:
            return
        local = self.local
        self._shares = client_shares(local.clients, self.workers, local.config.local_epochs)
        ctx = _context()
        by_index = {c.index: c for c in local.clients}
        for share in self._shares:
            payload = pickle.dumps(
                (local.config, [by_index[i] for i in share], local.half, local.global_test)
            )
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, payload), daemon=True)
            proc.start()
            theirs.close()
            self._conns.append(mine)
            self._procs.append(proc)

    def _ask(self, requests: list[tuple[str, Any]]) -> list[Any]:
        """Send every worker its request, then collect the answers (they work meanwhile)."""
        for w, request in enumerate(requests):
            try:
                self._conns[w].send(request)
            except OSError:
                self._fail(w)
        answers = []
        for w, conn in enumerate(self._conns):
            try:
                status, answer = conn.recv()
            except EOFError:
                self._fail(w)
            if status == "error":
                error, trace = answer
                exc = pickle.loads(error)
                exc.add_note(f"in the process of clients {self._shares[w]}:\n{trace}")
                raise exc
            answers.append(answer)
        return answers

    def _fail(self, worker: int) -> NoReturn:
        """A worker that is gone (killed, out of memory): say which clients it held."""
        proc = self._procs[worker]
        proc.join(timeout=1)
        code = "" if proc.exitcode is None else f" (exit code {proc.exitcode})"
        raise ClientWorkerError(f"the process of clients {self._shares[worker]} ended{code}")

    def client_round(self, work: RoundWork) -> dict[int, ClientReply]:
        self._start()
        replies: dict[int, ClientReply] = {}
        for answer in self._ask([("round", work)] * len(self._shares)):
            replies |= answer
        return dict(sorted(replies.items()))

    def deliver(self, messages: dict[int, Message]) -> float:
        self._start()
        requests = [("deliver", {i: messages[i] for i in s if i in messages}) for s in self._shares]
        return float(sum(self._ask(requests)))

    def set_up(self, rng: dict[str, Any]) -> dict[int, Any]:
        return self.local.set_up(rng)  # here, before the workers start from these clients

    def restore(
        self, rng: dict[str, Any], states: dict[int, Any], pending: dict[int, Message]
    ) -> None:
        self.local.restore(rng, states, pending)

    def snapshot(self) -> tuple[dict[int, Any], dict[int, Message]]:
        if not self._conns:
            return self.local.snapshot()
        states: dict[int, dict[str, Any]] = {}
        for answer in self._ask([("states", None)] * len(self._shares)):
            states |= answer
        return dict(sorted(states.items())), {}

    def analysis_artifacts(self) -> dict[str, torch.Tensor]:
        """Over every client, once their states are back here."""
        states, _ = self.snapshot()
        for client in self.local.clients:
            client.load_state_dict(states[client.index])
        return self.local.analysis_artifacts()

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a worker that died already
                conn.send(("stop", None))
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self._conns, self._procs = [], []
