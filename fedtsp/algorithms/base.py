"""The method interface: a method is a server half and a client half that share nothing but
messages, and the read-only options and run context both are built from.

A method file reads top to bottom: its options, its client state, its ``ClientHalf``
subclass (what a client does), its ``ServerHalf`` subclass (what the server does) and the
``Algorithm`` record that names them, registered. Being two types, a client hook cannot read what a
server hook computed: the attribute does not exist on the object it runs on, on every
transport. Set-up, then once per round:

    set-up: client: init_client (its State), setup_upload -> server: setup(facts, uploads)
    -> first_messages -> client: receive
    client: evaluate (predict) -> local training (train_loss, with local_loss as the usual
    extra term; before_step between each backward pass and optimiser step) -> upload
    server: aggregate -> configure (one message per client; by default ``message()`` to
    all) -> client: receive

The server learns of the clients only their ``ClientFacts`` (sizes, label counts,
architecture) and their messages. A client hook may read the options, the run context and
the client (its ``state``, an instance of the half's ``State`` dataclass, and its
``round``); whatever a client keeps between hooks lives in that state, which is
checkpointed with the client and moves with it to another process.

Defaults: a baseline's options default to what produced the paper's Table 1 (the authors'
scripts and their fork of HtFLlib), its own paper's variant being an option; FedTSP's
default to its paper, the authors' code choices being options. ``revision`` is bumped when
that changes what a method's earlier records mean.

Messages are plain ``dict[str, Tensor]``. Server state lives on the server half (the
attributes its ``server_state`` names are checkpointed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.algorithms.clients import Client, ClientFacts
from fedtsp.algorithms.model_messages import head_message, model_message
from fedtsp.core.options import build_options, describe_options

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

    def take(self, message: Message, key: str, present_key: str | None, device: Any) -> None:
        self.targets = message[key].to(device)
        if present_key is not None:
            self.present = message[present_key].to(device)

    def pulls(self, lam: float) -> bool:
        """Whether local training adds the pull term: targets have arrived and lam > 0."""
        return self.targets is not None and lam != 0


class Half:
    """What both halves of a method read: its options and the run context (never changed)."""

    def __init__(self, options: Any, ctx: RunContext) -> None:
        self.opts = options
        self.ctx = ctx


class ClientHalf(Half):
    """A method's client hooks; the defaults describe plain local training with a personal
    model."""

    # The per-client state (a dataclass; modules in it are checkpointed as weights).
    State: ClassVar[type] = NoState
    # The server's common start, if any: client 0's initial "model" or "head", which client 0
    # sends in set-up (as a Flower server asks one client for its initial parameters).
    start_from: ClassVar[str | None] = None

    def init_client(self, client: Client) -> Any:
        """The client's state before round 0 (it may also fit the model to the method, e.g.
        a fixed head)."""
        return self.State()

    def setup_upload(self, client: Client) -> Message:
        """What a client sends in set-up: by default client 0's start."""
        if client.index != 0 or self.start_from is None:
            return {}
        if self.start_from == "head":
            return head_message(client.model)
        return model_message(client.model)

    def client_parameters(self, client: Client) -> list[Any]:
        """Parameters (or optimiser parameter groups) the client's local SGD updates."""
        return list(client.model.parameters())

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

    def receive(self, client: Client, message: Message) -> None:
        """What a client does with the server's message."""

    def analysis_artifacts(self, clients: list[Client]) -> dict[str, Tensor]:
        """Analysis tensors only a simulator holding every client can compute (never a
        message, skipped on Flower)."""
        return {}


class ServerHalf(Half):
    """A method's server hooks; the defaults send nothing."""

    # The attributes a checkpoint keeps (set in ``setup``, changed by ``aggregate``).
    server_state: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.metrics: dict[str, Any] = {}  # the server's scalars for this round's history

    def setup(self, facts: list[ClientFacts], uploads: dict[int, Message]) -> Message | None:
        """Set up from the clients' facts and set-up uploads; may return a first message for
        every client."""
        return None

    def first_messages(self, client_ids: list[int], first: Message | None) -> dict[int, Message]:
        """What each client receives after set-up: by default ``setup``'s message to all
        (nothing where it returned None); a method whose clients start apart (clustered FL:
        each cluster's own start) tailors it. It draws no randomness."""
        return {} if first is None else dict.fromkeys(client_ids, first)

    def aggregate(self, round_index: int, uploads: dict[int, Message]) -> None:
        """Fold one round's uploads (client id -> upload, in client order) into the state."""

    def message(self) -> Message:
        """The one message every client receives after ``aggregate`` (from the state)."""
        return {}

    def configure(self, round_index: int, client_ids: list[int]) -> dict[int, Message]:
        """The message each client receives before round ``round_index``: by default
        ``message()`` to all; methods that tailor one per client override this. It draws
        no randomness, so the engine may call it anywhere."""
        return dict.fromkeys(client_ids, self.message())

    def round_metrics(self) -> dict[str, float]:
        """Scalars the server wants in this round's history (e.g. its own loss): by default
        what its hooks put in ``self.metrics``."""
        return dict(self.metrics)

    def artifacts(self) -> dict[str, Tensor]:
        """Tensors worth keeping with the run record (e.g. global class prototypes)."""
        return {}

    def record_extras(self) -> dict[str, Any]:
        """JSON facts the server adds to the run record (e.g. the clusters it found)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The attributes named in ``server_state`` (modules as their state dicts)."""
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


@dataclass(frozen=True)
class Algorithm:
    """A registered method: its name, its two halves and what the engine needs to know of it."""

    name: str
    Client: type[ClientHalf]
    Server: type[ServerHalf]
    Options: type = NoOptions
    # Settings the method is defined for (RunConfig.setting rejects the others).
    settings: tuple[str, ...] = ("htfl",)
    # Bumped when a change of defaults or of the method's code gives its earlier run records
    # another meaning: a revision > 0 enters the run key, so those records are never reused.
    revision: int = 0
    # The revision a run with these (non-default) options hashes with, for a method whose
    # change touched only some options' code (default: ``revision``).
    revision_of: Callable[[dict[str, Any]], int] | None = None
    # A width the method imposes on the feature extractor, from its resolved options.
    feature_width: Callable[[Any], int] | None = None
    # Checks of the resolved options against the run's config (e.g. a client index within
    # the run's clients), made before any data loads; raise ValueError.
    check_config: Callable[[Any, Any], None] | None = None

    def key_revision(self, algo_options: dict[str, Any]) -> int:
        return self.revision if self.revision_of is None else self.revision_of(algo_options)

    def required_feature_dim(self, options: Any) -> int | None:
        """The width the method imposes (None: no constraint)."""
        return None if self.feature_width is None else self.feature_width(options)


# ---- registry -------------------------------------------------------------------------
ALGORITHMS: dict[str, Algorithm] = {}


def register(method: Algorithm) -> Algorithm:
    if not method.name or method.name in ALGORITHMS:
        raise ValueError(f"algorithm name {method.name!r} is empty or registered twice")
    ALGORITHMS[method.name] = method
    return method


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}"
        ) from None


def resolve_options(name: str, values: dict[str, Any]) -> Any:
    """The algorithm's Options from a dict (see `fedtsp.core.options`); ConfigError."""
    return build_options(get_algorithm(name).Options, name, values)


def options_help(name: str) -> list[tuple[str, Any, str]]:
    """(option, default, help) for each option of an algorithm, for --help and the docs."""
    return describe_options(get_algorithm(name).Options)
