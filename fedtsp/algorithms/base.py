"""The algorithm interface: the few hooks in which federated methods differ.

A method is one subclass holding only what makes it different. Its hooks form two halves
that share nothing but messages: the engine (:mod:`fedtsp.engine.loop`) calls the server
half (``setup``, ``aggregate``, ``configure``, ``round_metrics``, ``artifacts``,
``record_extras``, ``state_dict``) on one object and the client half (``init_client``,
``setup_upload``, ``client_parameters``, ``prepare_evaluation``, ``predict``, ``train_loss``
/ ``local_loss``, ``before_step``, ``upload``, ``receive``, ``analysis_artifacts``) on
another. Set-up, then once per round:

    set-up: client: init_client (its State), setup_upload -> server: setup(facts, uploads)
    client: evaluate (predict) -> local training (train_loss, with local_loss as the usual
    extra term; before_step between each backward pass and optimiser step) -> upload
    server: aggregate -> configure (one message per client) -> client: receive

The server learns of the clients only their ``ClientFacts`` (sizes, label counts,
architecture) and their messages. A client hook may read the method's options, the run
context and the client (its ``state``, an instance of the method's ``State`` dataclass, and
its ``round``), never what a server hook set on ``self``.

Defaults: a baseline's options default to what produced the paper's Table 1 (the authors'
scripts and their fork of HtFLlib), its own paper's variant being an option; FedTSP's
default to its paper, the authors' code choices being options. ``revision`` is bumped when
that changes what a method's earlier records mean.

Messages are plain ``dict[str, Tensor]``. Server state lives on the server's algorithm
object (``state_dict``), per-client state in ``client.state`` so that both can be
checkpointed and moved to another process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import head_message, model_message
from fedtsp.algorithms.options import build_options, describe_options

Message = dict[str, Tensor]


@dataclass
class RunContext:
    """Facts about the run that every algorithm may need."""

    dataset: str
    class_names: list[str]
    feature_dim: int
    num_clients: int
    rounds: int
    device: torch.device
    seed: int
    setting: str = "htfl"  # htfl, gfl or pfl (RunConfig.setting)
    # A population's planted group of every client (RunConfig.population), else None: the
    # ground truth clustered methods are scored against, and the oracle's clusters.
    groups: list[int] | None = None
    family: str = ""  # RunConfig.family: which architecture each client index has

    @property
    def homogeneous(self) -> bool:
        """Every client has the same architecture (gfl / pfl), so whole models can be averaged."""
        return self.setting != "htfl"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


@dataclass
class NoOptions:
    """Algorithms without hyperparameters of their own."""


@dataclass
class NoState:
    """Algorithms that keep nothing per client beyond the model and optimiser."""


@dataclass
class ClassTargets:
    """A client's state in methods that pull towards the server's per-class targets
    (prototypes, logits, anchors): the last ones received, and which classes have one."""

    targets: Tensor | None = None
    present: Tensor | None = None  # None: every class

    def take(self, broadcast: Message, key: str, present_key: str | None, device: Any) -> None:
        self.targets = broadcast[key].to(device)
        if present_key is not None:
            self.present = broadcast[present_key].to(device)


class Algorithm:
    """Base class; the defaults describe plain local training with a personal model."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    # Settings the method is defined for (RunConfig.setting rejects the others).
    settings: ClassVar[tuple[str, ...]] = ("htfl",)
    # Bumped when a change of defaults or of the method's code gives its earlier run records
    # another meaning: a revision > 0 enters the run key, so those records are never reused.
    revision: ClassVar[int] = 0
    # The per-client state (a dataclass; modules in it are checkpointed as weights).
    State: ClassVar[type] = NoState
    # The server's common start, if any: client 0's initial "model" or "head", which client 0
    # sends in set-up (as a Flower server asks one client for its initial parameters).
    start_from: ClassVar[str | None] = None
    # The server attributes a checkpoint keeps (set in ``setup``, changed by the server hooks).
    server_state: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def key_revision(cls, algo_options: dict[str, Any]) -> int:
        """The revision a run with these (non-default) options hashes with; a method whose
        change touched only some options' code overrides this."""
        return cls.revision

    def __init__(self, options: Any, ctx: RunContext) -> None:
        self.opts = options
        self.ctx = ctx
        self.metrics: dict[str, Any] = {}  # the server's scalars for this round's history

    # ---- sizing -------------------------------------------------------------------
    @classmethod
    def required_feature_dim(cls, options: Any) -> int | None:
        """A width the method imposes on the feature extractor (None: no constraint)."""
        return None

    # ---- set-up ---------------------------------------------------------------------
    def init_client(self, client: Client) -> Any:
        """The client's state before round 0 (client half; it may also fit the model to the
        method, e.g. a fixed head)."""
        return self.State()

    def setup_upload(self, client: Client) -> Message:
        """What a client sends in set-up (client half): by default client 0's start."""
        if client.index != 0 or self.start_from is None:
            return {}
        if self.start_from == "head":
            return head_message(client.model)
        return model_message(client.model)

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message | None:
        """The server's set-up from the clients' facts and set-up uploads; may return a first
        broadcast."""
        return None

    def client_parameters(self, client: Client) -> list[Any]:
        """Parameters (or optimiser parameter groups) the client's local SGD updates."""
        return list(client.model.parameters())

    # ---- client side ----------------------------------------------------------------
    def train_loss(self, client: Client, x: Tensor, y: Tensor) -> Tensor:
        feats = client.model.features(x)
        logits = client.model.head(feats)
        loss = F.cross_entropy(logits, y)
        extra = self.local_loss(client, x, y, feats, logits)
        return loss if extra is None else loss + extra

    def local_loss(
        self, client: Client, x: Tensor, y: Tensor, feats: Tensor, logits: Tensor
    ) -> Tensor | None:
        """Extra term added to the client's cross-entropy (None: nothing)."""
        return None

    def before_step(self, client: Client) -> None:
        """Called after each backward pass, before the optimiser step (e.g. gradient clipping)."""

    def prepare_evaluation(self, client: Client, round_index: int) -> None:
        """Called before a client is evaluated (e.g. "-FT" methods fine-tune a head copy)."""

    def predict(self, client: Client, x: Tensor) -> Tensor:
        """Logits used for evaluation (default: the client's own head)."""
        return client.model(x)

    def upload(self, client: Client) -> Message:
        """What a client sends after local training."""
        return {}

    def receive(self, client: Client, broadcast: Message) -> None:
        """What a client does with the server's reply."""

    # ---- server side ----------------------------------------------------------------
    def server_step(self, uploads: list[Message], round_index: int) -> Message:
        """Aggregate the uploads of one round (client order); return the one broadcast for
        every client. Methods that send each client its own message override ``aggregate``
        and ``configure`` instead."""
        return {}

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        """Fold one round's uploads (client id -> upload, in client order) into the server
        state; by default through ``server_step``."""
        self._pending_broadcast = self.server_step(list(uploads.values()), round_index)

    def configure(self, round_index: int, client_ids: list[int]) -> dict[int, Message]:
        """The message each client receives before round ``round_index``: what the last
        ``aggregate`` computed (it draws no randomness, so the engine may call it anywhere)."""
        broadcast = getattr(self, "_pending_broadcast", {})
        return dict.fromkeys(client_ids, broadcast)

    def round_metrics(self) -> dict[str, float]:
        """Scalars the server wants in this round's history (e.g. its own loss): by default
        what its hooks put in ``self.metrics``."""
        return dict(self.metrics)

    def artifacts(self) -> dict[str, Tensor]:
        """Tensors worth keeping with the run record (e.g. global class prototypes)."""
        return {}

    def analysis_artifacts(self, clients: list[Client]) -> dict[str, Tensor]:
        """Analysis tensors only a simulator holding every client can compute (client half;
        never a message, skipped on Flower)."""
        return {}

    def record_extras(self) -> dict[str, Any]:
        """JSON facts the server adds to the run record (e.g. the clusters it found)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The server attributes named in ``server_state`` (modules as their state dicts)."""
        saved = {name: getattr(self, name) for name in self.server_state}
        return {
            k: v.state_dict() if isinstance(v, torch.nn.Module) else v for k, v in saved.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` onto a server that ran ``setup`` (modules in place)."""
        for name in self.server_state:
            current = getattr(self, name, None)
            if isinstance(current, torch.nn.Module):
                current.load_state_dict(state[name])
            else:
                setattr(self, name, state[name])


# ---- registry -------------------------------------------------------------------------
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    if not cls.name or cls.name in ALGORITHMS:
        raise ValueError(f"algorithm name {cls.name!r} is empty or registered twice")
    ALGORITHMS[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def get_algorithm(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}"
        ) from None


def resolve_options(name: str, values: dict[str, Any]) -> Any:
    """The algorithm's Options from a dict (see `fedtsp.algorithms.options`); ConfigError."""
    return build_options(get_algorithm(name).Options, name, values)


def options_help(name: str) -> list[tuple[str, Any, str]]:
    """(option, default, help) for each option of an algorithm, for --help and the docs."""
    return describe_options(get_algorithm(name).Options)
