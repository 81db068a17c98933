"""Run configuration: one validated dataclass that fully determines a federated run.

Everything that changes the result lives here (and therefore in the run's hash); things
that only say *where* to read or write (data path, output folder) do not. A leaf module: it
checks each value on its own (`RunConfig.validate`); what needs the dataset, model and
algorithm registries, or the machine, is checked one layer up (`fedtsp.engine.runspec.check_run`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from fedtsp.core.errors import UserError

DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
# htfl: heterogeneous client models (Table 1); gfl / pfl: one architecture for every client,
# scored by the global model on the official test set (gfl) or per client after
# personalisation (pfl) (Table 3).
SETTINGS = ("htfl", "gfl", "pfl")
# Order of each local epoch's mini-batches: "shuffled", a fresh permutation every epoch;
# "fixed", the stored order every epoch (HtFLlib's DataLoader(shuffle=False)).
BATCH_ORDERS = ("shuffled", "fixed")
# Client models' initial weights: "independent", drawn one after another from the run's
# seed; "shared", torch reseeded with the run's seed before each model, so clients of one
# architecture start identical (HtFLlib seeds torch with 0 before building each client).
CLIENT_INITS = ("independent", "shared")
# Image memory layouts by their command-line name -> channels_last (None: the device decides).
LAYOUTS: dict[str, bool | None] = {"auto": None, "channels-last": True, "nchw": False}
# Clients with fewer training samples than one batch: "train" on that one partial batch;
# "skip" training them, as HtFLlib's DataLoader(drop_last=True) does (it yields no batch).
UNDERSIZED_CLIENTS = ("train", "skip")
# Flower engines: what a failed client does, and the seconds a round waits for its replies.
FAILURE_POLICIES = ("stop", "continue")
ROUND_TIMEOUT = 3600.0
# Fields added after the first run records: at these defaults they stay out of the run's
# hash, so the records made before they existed keep their keys.
# channels_last=False is how every record before the field was made (NCHW images).
_HASH_NEUTRAL_DEFAULTS: dict[str, Any] = {
    "setting": "htfl",
    "channels_last": False,
    "batch_order": "shuffled",
    "client_init": "independent",
    "undersized_clients": "train",
    "population": None,
}


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the value and what is allowed."""


@dataclass
class RunConfig:
    # data and partition (PROTOCOL.md, "Federated protocol")
    dataset: str = "cifar10"
    alpha: float = 0.1
    num_clients: int = 20
    fraction: float = 1.0
    min_client_samples: int | None = None  # None: the authors' rule, scaled by `fraction`
    partition_seed: int = 1
    train_ratio: float = 0.75
    # Clients drawn from a population with planted groups (fedtsp.data.populations) instead
    # of a Dirichlet partition of `dataset` (then its first dataset; alpha is not used).
    population: str | None = None
    # federated setting (see SETTINGS) and models
    setting: str = "htfl"
    family: str = "htfe9"
    feature_dim: int | None = None  # None: the algorithm decides (FedTSP: text-encoder width)
    # algorithm and its own options (validated against the algorithm's Options dataclass)
    algorithm: str = "fedtsp"
    algo_options: dict[str, Any] = field(default_factory=dict)
    # local training and rounds
    rounds: int = 300
    local_epochs: int = 5
    batch_size: int = 100
    lr: float = 0.01
    seed: int = 0
    batch_order: str = "shuffled"  # see BATCH_ORDERS
    client_init: str = "independent"  # see CLIENT_INITS
    undersized_clients: str = "train"  # see UNDERSIZED_CLIENTS
    global_eval_every: int = 0  # 0: never; k: every k rounds and after the last round
    # execution
    device: str = "cpu"
    precision: str = "fp32"
    # Image memory layout: None picks the faster one for the device (fedtsp.data.device_images)
    channels_last: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        return cls(**values)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def key(self, extra: dict[str, Any] | None = None, revision: int = 0) -> str:
        """Stable 16-hex-digit hash of the config (plus e.g. the dataset checksum).

        ``revision``: the method's key revision (`Algorithm.key_revision`); at 0 it stays out
        of the hash, so unrevised methods keep their keys.
        """
        config = {
            k: v
            for k, v in self.to_dict().items()
            if k not in _HASH_NEUTRAL_DEFAULTS or v != _HASH_NEUTRAL_DEFAULTS[k]
        }
        if revision:
            config["algorithm_revision"] = revision
        return stable_hash({"config": config, "extra": extra or {}})

    def validate(self) -> RunConfig:
        """Check every value on its own (no registry, no data); raise ConfigError."""
        if not self.alpha > 0:
            bad("alpha", self.alpha, "the Dirichlet concentration must be > 0")
        if self.num_clients < 1:
            bad("num_clients", self.num_clients, "need at least 1 client")
        if not 0 < self.fraction <= 1:
            bad("fraction", self.fraction, "the subsample fraction must be in (0, 1]")
        if self.min_client_samples is not None and self.min_client_samples < 1:
            bad("min_client_samples", self.min_client_samples, "must be >= 1 or unset")
        if not 0 < self.train_ratio < 1:
            bad("train_ratio", self.train_ratio, "must be in (0, 1)")
        if self.setting not in SETTINGS:
            bad("setting", self.setting, f"choose one of {', '.join(SETTINGS)}")
        if self.feature_dim is not None and self.feature_dim < 1:
            bad("feature_dim", self.feature_dim, "must be a positive width or unset")
        for name in ("rounds", "local_epochs", "batch_size"):
            if getattr(self, name) < 1:
                bad(name, getattr(self, name), "must be >= 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            bad("lr", self.lr, "the learning rate must be a finite number > 0")
        if self.batch_order not in BATCH_ORDERS:
            bad("batch_order", self.batch_order, f"choose one of {', '.join(BATCH_ORDERS)}")
        if self.client_init not in CLIENT_INITS:
            bad("client_init", self.client_init, f"choose one of {', '.join(CLIENT_INITS)}")
        if self.undersized_clients not in UNDERSIZED_CLIENTS:
            allowed = ", ".join(UNDERSIZED_CLIENTS)
            bad("undersized_clients", self.undersized_clients, f"choose one of {allowed}")
        if self.global_eval_every < 0:
            bad("global_eval_every", self.global_eval_every, "use 0 (never) or a positive period")
        if self.device.split(":")[0] not in DEVICES:
            bad("device", self.device, f"choose one of {', '.join(DEVICES)} (e.g. cuda:1)")
        if self.channels_last is not None and not isinstance(self.channels_last, bool):
            bad("channels_last", self.channels_last, "must be true, false or unset (auto)")
        if self.precision not in PRECISIONS:
            bad("precision", self.precision, f"choose one of {', '.join(PRECISIONS)}")
        return self


def stable_hash(payload: dict[str, Any]) -> str:
    """The 16-hex-digit key of a JSON-able payload: the one hashing rule of every run store."""
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def bad(name: str, value: Any, allowed: str) -> None:
    """Raise the one-sentence ConfigError naming a field, its value and what is allowed."""
    raise ConfigError(f"{name}={value!r} is invalid; {allowed}")
