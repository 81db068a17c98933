"""Flower ServerApp and ClientApp (Message API) driving any fedtsp algorithm.

Messages (``dst``: who receives it):

* ``query.hello`` (node): which client (``partition-id``) the node holds;
* ``query.setup`` (node, a fresh run): the run description; the node sets up its client
  from its node file and answers with the client's facts and set-up upload;
* a resumed run's first round instead carries the run description and each client's saved
  state;
* ``train`` / ``evaluate`` (node): round t with the previous server broadcast as an
  ArrayRecord; the reply carries the evaluation counts, the training loss and timings
  (ConfigRecord) and the client's upload (ArrayRecord). ``evaluate`` closes the run:
  evaluation only, as the simulator's last round;
* ``query.state`` (node, when the server's schedule saves a checkpoint): the client's state
  as its last round left it.

The server side is the engine's one driver (``engine.driver.drive``) over
:class:`FlowerTransport`, as the simulator's is over its in-process transport.

``server_app`` / ``client_app`` read the work folder from the run config (``workdir``), as
``flwr run`` passes it; :func:`make_apps` binds one explicitly (Flower's simulation engine).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedtsp.algorithms import Message as AlgoMessage
from fedtsp.algorithms.clients import ClientFacts
from fedtsp.core.results import RunStore
from fedtsp.engine.client_round import ClientReply, RoundWork, SetupReply
from fedtsp.engine.driver import drive, run_record
from fedtsp.engine.flower.workdir import (
    ClientFailureError,
    Failure,
    NodeRuntime,
    arrays_to_message,
    from_bytes,
    message_to_arrays,
    server_run,
    to_bytes,
)

log = logging.getLogger("fedtsp.engine.flower")

CONNECT_TIMEOUT = 300.0  # seconds to wait for every SuperNode to register
_STATE_KEY = "fedtsp"
# Node-side cache: (run id, node id) -> (state marker, runtime). A process that served the
# node's last message reuses its objects; any other process rebuilds from Context.state.
_NODES: dict[tuple[int, int], tuple[int, NodeRuntime]] = {}


def _arrays(message: AlgoMessage | None) -> ArrayRecord:
    arrays = message_to_arrays(message)
    return ArrayRecord({k: Array(v) for k, v in arrays.items()}) if arrays else ArrayRecord()


def _message_from(record: ArrayRecord, device: Any) -> AlgoMessage:
    if len(record) == 0:
        return {}
    return arrays_to_message({k: v.numpy() for k, v in record.items()}, device)


# ---- server -----------------------------------------------------------------------------
def _exchange(
    grid: Grid,
    targets: dict[int, int],
    contents: dict[int, RecordDict],
    message_type: str,
    group: str,
    timeout: float,
) -> tuple[dict[int, Message], dict[int, str]]:
    """Send one message per client; return replies and a reason for each missing one."""
    messages = [
        Message(
            contents[i],
            dst_node_id=node,
            message_type=message_type,
            group_id=group,
            ttl=max(timeout * 2, 60.0),
        )
        for i, node in targets.items()
    ]
    by_node = {node: i for i, node in targets.items()}
    replies: dict[int, Message] = {}
    failed: dict[int, str] = {}
    # Own pull loop: Flower's deployment Grid.send_and_receive sleeps 3 s between pulls,
    # which would dominate a CPU-scale round; 0.1 s keeps the overhead small.
    pending = set(grid.push_messages(messages))
    received: list[Message] = []
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        batch = list(grid.pull_messages(pending))
        received.extend(batch)
        pending -= {m.metadata.reply_to_message_id for m in batch}
        if pending:
            time.sleep(0.1)
    for reply in received:
        index = by_node.get(reply.metadata.src_node_id)
        if index is None:
            continue
        if reply.has_error():
            failed[index] = f"error reply (code {reply.error.code}): {_short(reply.error.reason)}"
        else:
            replies[index] = reply
    for index in targets:
        if index not in replies and index not in failed:
            failed[index] = f"no reply within {timeout:g} s (node gone or stalled)"
    return replies, failed


def _short(reason: str | None, limit: int = 400) -> str:
    """The gist of a remote traceback: its last line naming the exception, capped."""
    lines = [ln.strip() for ln in (reason or "").splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    text = (named or lines or ["(no reason given)"])[-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise ClientFailureError(
                f"only {len(nodes)} of {count} SuperNodes connected within {timeout:g} s; "
                "start one SuperNode per client"
            )
        time.sleep(0.5)


class FlowerTransport:
    """The engine's transport over a Flower Grid: one message per node per round; the
    server's messages for round t + 1 travel with round t + 1's request."""

    def __init__(
        self,
        grid: Grid,
        targets: dict[int, int],
        run_json: str,
        device: Any,
        timeout: float,
        on_failure: str,
    ) -> None:
        self.grid, self.targets, self.run_json = grid, targets, run_json
        self.device, self.timeout, self.on_failure = device, timeout, on_failure
        self.init: dict[int, ConfigRecord] = {}  # a resumed run's first round: saved states
        self.pending: dict[int, AlgoMessage] = {}
        self.failures: list[Failure] = []

    def set_up(self, rng: dict[str, Any]) -> dict[int, SetupReply]:
        """Every node sets up its client (from its node file's RNG state) and answers with
        its facts and set-up upload."""
        init = ConfigRecord({"run": self.run_json})
        contents = {i: RecordDict({"init": init}) for i in self.targets}
        replies, failed = _exchange(
            self.grid, self.targets, contents, "query.setup", "setup", self.timeout
        )
        if failed:
            reasons = "; ".join(f"client {i}: {why}" for i, why in sorted(failed.items()))
            raise ClientFailureError(f"set-up failed, no round has run: {reasons}")
        return {
            i: SetupReply(
                ClientFacts.from_json(json.loads(str(r.content["facts"]["json"]))),
                _message_from(r.content["upload"], self.device),
            )
            for i, r in sorted(replies.items())
        }

    def restore(
        self, rng: dict[str, Any], states: dict[int, bytes], pending: dict[int, AlgoMessage]
    ) -> None:
        """The saved states go with the first round's messages, and so do the messages the
        clients had not received."""
        self.init = {i: ConfigRecord({"run": self.run_json, "blob": b}) for i, b in states.items()}
        self.pending = dict(pending)

    def deliver(self, messages: dict[int, AlgoMessage]) -> float:
        self.pending = dict(messages)
        return 0.0

    def snapshot(self) -> tuple[dict[int, bytes], dict[int, AlgoMessage]]:
        """Every node's state, asked for now (``query.state``), and the undelivered messages."""
        contents = {i: RecordDict() for i in self.targets}
        replies, failed = _exchange(
            self.grid, self.targets, contents, "query.state", "state", self.timeout
        )
        if failed:
            raise ClientFailureError(f"nodes did not send their state for a checkpoint: {failed}")
        states = {i: bytes(r.content["state"]["blob"]) for i, r in sorted(replies.items())}
        return states, dict(self.pending)

    def analysis_artifacts(self) -> dict[str, Any]:
        return {}  # they need every client in one place: the simulator's only

    def close(self) -> None:
        """The nodes belong to Flower."""

    def client_round(self, work: RoundWork) -> dict[int, ClientReply]:
        records: dict[int, ArrayRecord] = {}  # one record per distinct message object
        contents = {}
        for i in self.targets:
            message = self.pending.get(i)
            if id(message) not in records:
                records[id(message)] = _arrays(message)
            spec = {
                "round": work.round,
                "train": work.train,
                "global_eval": work.global_eval,
                "gfl_client": -1 if work.gfl_client is None else work.gfl_client,
                # receive() runs after every server step, before round 0 only if set-up sent one
                "has_broadcast": message is not None,
            }
            content = {"broadcast": records[id(message)], "round": ConfigRecord(spec)}
            if i in self.init:  # a resumed run's first round also ships the client's state
                content["init"] = self.init[i]
            contents[i] = RecordDict(content)
        kind = "train" if work.train else "evaluate"
        replies, failed = _exchange(
            self.grid, self.targets, contents, kind, str(work.round), self.timeout
        )
        self.pending, self.init = {}, {}  # shipped; free the memory
        for index, reason in sorted(failed.items()):
            failure = Failure(index, self.targets.pop(index), work.round, reason)
            self.failures.append(failure)
            log.error("%s", failure.sentence())
        if failed and (self.on_failure == "stop" or not self.targets):
            raise _StopRun
        return {
            i: ClientReply.from_json(
                json.loads(str(r.content["reply"]["json"])),
                _message_from(r.content["upload"], self.device) if "upload" in r.content else None,
            )
            for i, r in replies.items()
        }


class _StopRun(Exception):
    """Clients failed and the failure policy ends the run."""


def _handshake(grid: Grid, num_clients: int, timeout: float) -> dict[int, int]:
    """Which node holds which client: each node names its partition-id."""
    nodes = _wait_for_nodes(grid, num_clients, CONNECT_TIMEOUT)
    hello = {n: RecordDict() for n in nodes}
    replies, failed = _exchange(grid, {n: n for n in nodes}, hello, "query.hello", "hello", timeout)
    if failed:
        raise ClientFailureError(f"SuperNodes did not answer the handshake: {failed}")
    targets: dict[int, int] = {}
    for node, reply in replies.items():
        index = int(reply.content["node"]["partition-id"])
        if not 0 <= index < num_clients or index in targets:
            raise ClientFailureError(
                f"node {node} reports partition-id={index}; each of 0..{num_clients - 1} "
                "must be held by exactly one SuperNode"
            )
        targets[index] = node
    missing = sorted(set(range(num_clients)) - set(targets))
    if missing:
        raise ClientFailureError(f"no SuperNode holds client(s) {missing}")
    log.info("nodes: %s", {i: targets[i] for i in sorted(targets)})
    return targets


def serve(grid: Grid, workdir: str | Path) -> dict[str, Any]:
    """The ServerApp's body: map nodes to clients, then the engine's driver runs the run
    (set-up or resume, rounds, checkpoints, record) over this grid."""
    wall_start = time.perf_counter()
    spec, run = server_run(workdir)
    cfg, store = run.config, RunStore(spec["out"])
    timeout = float(spec["round_timeout"])
    targets = _handshake(grid, cfg.num_clients, timeout)
    transport = FlowerTransport(
        grid, targets, json.dumps(spec), cfg.device, timeout, spec["on_failure"]
    )
    nodes = {"nodes": {str(i): targets[i] for i in sorted(targets)}}

    def extra() -> dict[str, Any]:
        failures = {"failures": [vars(f) for f in transport.failures]}
        return {"engine": spec["engine"]} | nodes | failures

    def record(history: list[dict], status: str, more: dict[str, Any] | None = None) -> dict:
        wall = time.perf_counter() - wall_start
        return run_record(run, history, status, wall, _environment(), extra() | (more or {}))

    def keep(t: int, row: dict[str, Any], history: list[dict]) -> None:
        # What a launcher in another process reads while the run goes on (and where it stops).
        status = "interrupted" if spec["stop_after"] == t + 1 else "running"
        store.save_incomplete(record(history, status))
        log.info("round %d: acc %.4f", t, row["acc"])

    so_far: dict[str, list[dict]] = {"history": []}  # the rounds done, for a failure record

    def after_round(t: int, row: dict[str, Any], history: list[dict]) -> None:
        so_far["history"] = history
        keep(t, row, history)

    try:
        return drive(
            run,
            transport,
            store,
            resume=spec["resume"],
            stop_after=spec["stop_after"],
            checkpoint_every=spec["checkpoint_every"],
            environment=_environment(),
            extra=extra,
            after_round=after_round,
            wall_start=wall_start,
        )
    except Exception as exc:
        if not transport.failures:
            raise
        history = so_far["history"]
        if not isinstance(exc, _StopRun):
            reason = f"the server step failed without them: {exc}"
            transport.failures.append(Failure(-1, -1, len(history), reason))
        message = (
            f"{'; '.join(f.sentence() for f in transport.failures)}; the run stops here "
            f"(on_failure={spec['on_failure']}); the {len(history)} round(s) evaluated so far "
            f"are kept in {store.incomplete_path(run.key)}"
        )
        store.save_incomplete(record(history, "failed", {"error": message}))
        raise ClientFailureError(message) from None


def _environment() -> dict[str, Any]:
    try:
        import flwr

        return {"flwr": flwr.__version__}
    except ImportError:  # pragma: no cover - the adapter is only used with flwr
        return {"flwr": None}


# ---- node ---------------------------------------------------------------------------------
def _node_runtime(context: Context) -> NodeRuntime:
    saved = context.state[_STATE_KEY]
    marker = int(saved["marker"])
    cached = _NODES.get((context.run_id, context.node_id))
    if cached is not None and cached[0] == marker:
        return cached[1]
    run = json.loads(str(saved["run"]))
    node = NodeRuntime.build(run, int(saved["index"]), str(saved["data-file"]), saved["blob"])
    _NODES[(context.run_id, context.node_id)] = (marker, node)
    return node


def _persist(context: Context, node: NodeRuntime) -> None:
    saved = context.state[_STATE_KEY]
    marker = int(saved["marker"]) + 1
    saved["marker"] = marker
    saved["blob"] = node.blob()
    _NODES[(context.run_id, context.node_id)] = (marker, node)


def _partition_id(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ValueError("this SuperNode has no partition-id in its --node-config")
    return int(context.node_config["partition-id"])


def _data_file(context: Context, workdir: str | None, index: int) -> str:
    if "data-file" in context.node_config:
        return str(context.node_config["data-file"])
    if workdir is None:
        raise ValueError("give the SuperNode data-file=... in --node-config")
    return str(Path(workdir) / f"node-{index}.npz")


def make_apps(workdir: str | Path | None = None) -> tuple[ServerApp, ClientApp]:
    """A ServerApp/ClientApp pair; ``workdir`` None: read it from the run config."""
    bound = None if workdir is None else str(Path(workdir).resolve())

    def _workdir(context: Context) -> str | None:
        return bound or (
            str(context.run_config["workdir"]) if "workdir" in context.run_config else None
        )

    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        path = _workdir(context)
        if path is None:
            raise ValueError("run config has no 'workdir'; pass --run-config 'workdir=\"...\"'")
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        serve(grid, path)

    client = ClientApp()

    @client.query("hello")
    def _hello(msg: Message, context: Context) -> Message:
        content = RecordDict({"node": ConfigRecord({"partition-id": _partition_id(context)})})
        return Message(content, reply_to=msg)

    def _init(msg: Message, context: Context) -> NodeRuntime:
        """The node's client, set up afresh (``query.setup``) or from a saved state (the
        first round of a resumed run)."""
        init = msg.content["init"]
        run = json.loads(str(init["run"]))
        index = _partition_id(context)
        data_file = _data_file(context, _workdir(context), index)
        blob = init.get("blob")
        node = NodeRuntime.build(run, index, data_file, blob)  # checks the data now
        context.state[_STATE_KEY] = ConfigRecord(
            {"run": str(init["run"]), "index": index, "data-file": data_file, "marker": 0}
        )
        _persist(context, node)
        return node

    @client.query("setup")
    def _setup(msg: Message, context: Context) -> Message:
        reply = _init(msg, context).setup_reply
        assert reply is not None, "a fresh set-up always has a reply"
        facts = ConfigRecord({"json": json.dumps(reply.facts.to_json())})
        content = RecordDict({"facts": facts, "upload": _arrays(reply.upload)})
        return Message(content, reply_to=msg)

    def _round(msg: Message, context: Context) -> Message:
        node = _init(msg, context) if "init" in msg.content else _node_runtime(context)
        spec = msg.content["round"]
        gfl_client = int(spec["gfl_client"])
        work = RoundWork(
            round=int(spec["round"]),
            train=bool(spec["train"]),
            global_eval=bool(spec["global_eval"]),
            gfl_client=None if gfl_client < 0 else gfl_client,
        )
        message = _message_from(msg.content["broadcast"], node.config.device)
        reply = node.round(work, message if spec["has_broadcast"] else None)
        _persist(context, node)
        content = RecordDict({"reply": ConfigRecord({"json": json.dumps(reply.to_json())})})
        if work.train:
            content["upload"] = _arrays(reply.upload)
        return Message(content, reply_to=msg)

    @client.query("state")
    def _state(msg: Message, context: Context) -> Message:
        """The client's state as the last round left it, for the server's checkpoint."""
        blob = context.state[_STATE_KEY]["blob"]
        return Message(RecordDict({"state": ConfigRecord({"blob": blob})}), reply_to=msg)

    client.train()(_round)
    client.evaluate()(_round)
    return server, client


# The app bundle's components (see fedtsp.engine.flower.launch.write_app): work folder from run config.
server_app, client_app = make_apps()

__all__ = ["client_app", "from_bytes", "make_apps", "serve", "server_app", "to_bytes"]
