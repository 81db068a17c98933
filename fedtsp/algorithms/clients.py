"""A federated client: its data as device tensors, its model, optimiser and the method's
per-client state, and the facts about it that the server may learn in set-up.

Data stays on the client's device for the whole run and is batched with index
permutations, so no per-batch copies or DataLoader workers are involved.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedtsp.core.errors import RunFailedError
from fedtsp.models.families import ClientModel

# Where a client's image prototypes come from: "pass", one pass with the trained model after
# local training (the paper's Eq. 5, and the authors' FedTSP clients); "training", the mean
# over the features of this round's training forward passes, all local epochs (HtFLlib's and
# the fork's FedProto; no extra pass).
PROTOTYPE_SOURCES = ("pass", "training")


class NonFiniteLossError(RunFailedError, FloatingPointError):
    """Local training produced a NaN or infinite loss."""


@dataclass
class EvalResult:
    correct: int
    correct_top5: int
    total: int
    loss_sum: float

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.total, 1)


@dataclass(frozen=True)
class ClientFacts:
    """What a client tells the server in set-up: sizes, label counts and its architecture,
    never its data or its model (the server half sets up from these alone)."""

    index: int
    arch: str
    num_train: int
    class_counts: tuple[int, ...]
    in_channels: int
    image_size: int

    def to_json(self) -> dict[str, Any]:
        return vars(self) | {"class_counts": list(self.class_counts)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClientFacts:
        return cls(**data | {"class_counts": tuple(data["class_counts"])})


@dataclass
class Client:
    index: int
    model: ClientModel
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    # The method's per-client state: an instance of its ``State`` dataclass (set up by the
    # engine through ``Algorithm.init_client``).
    state: Any = None
    round: int = 0  # the round the server's latest request named (set by the engine)
    optimizer: torch.optim.Optimizer | None = None
    model_seconds: float = 0.0  # time inside forward/backward/step, for overhead accounting
    # Mixed-precision context (torch.autocast for bf16); a no-op for the exact fp32 path.
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # False: every epoch visits the training set in its stored order (RunConfig.batch_order).
    shuffle: bool = True
    # False: fewer training samples than one batch give no batch (RunConfig.undersized_clients).
    train_undersized: bool = True
    # This round's running per-class (sums, seen) of training features (record_class_sums).
    class_sums: tuple[Tensor, Tensor] | None = None

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def device(self) -> torch.device:
        return self.train_x.device

    def class_counts(self) -> Tensor:
        return torch.bincount(self.train_y, minlength=self.num_classes)

    def facts(self) -> ClientFacts:
        return ClientFacts(
            index=self.index,
            arch=self.model.arch,
            num_train=self.num_train,
            class_counts=tuple(int(c) for c in self.class_counts().tolist()),
            in_channels=int(self.train_x.shape[1]),
            image_size=int(self.train_x.shape[-1]),
        )

    def batches(self, batch_size: int, generator: torch.Generator) -> list[Tensor]:
        """Index batches of one epoch, shuffled unless ``self.shuffle`` is False.

        The trailing partial batch is dropped (as the authors' DataLoader does), unless it
        would be the only batch and ``self.train_undersized`` holds, so that tiny clients
        still train.
        """
        if self.shuffle:
            perm = torch.randperm(self.num_train, generator=generator, device="cpu")
            perm = perm.to(self.device)
        else:
            perm = torch.arange(self.num_train, device=self.device)
        full = self.num_train // batch_size
        if full == 0:
            return [perm] if self.train_undersized else []
        return list(perm[: full * batch_size].split(batch_size))

    def train(
        self,
        loss_fn: Any,
        epochs: int,
        batch_size: int,
        generator: torch.Generator,
        before_step: Callable[[Client], None] | None = None,
    ) -> float:
        """Run local epochs with ``loss_fn(client, x, y)``; return the mean batch loss
        (NaN when the client has no batch to train on).

        ``before_step(client)`` runs after each backward pass (e.g. gradient clipping).
        """
        assert self.optimizer is not None, "client has no optimiser"
        self.model.train()
        total = torch.zeros((), device=self.device)
        steps = 0
        for _ in range(epochs):
            for idx in self.batches(batch_size, generator):
                x, y = self.train_x[idx], self.train_y[idx]
                start = time.perf_counter()
                with self.autocast():
                    loss = loss_fn(self, x, y)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if before_step is not None:
                    before_step(self)
                self.optimizer.step()
                self.model_seconds += time.perf_counter() - start
                total += loss.detach().float()
                steps += 1
        if steps == 0:
            return float("nan")
        mean = float(total) / steps
        # One check per client instead of per step: a NaN propagates into the sum.
        if not math.isfinite(mean):
            raise NonFiniteLossError(f"local training loss became {mean} on client {self.index}")
        return mean

    @torch.inference_mode()
    def evaluate(self, predict: Any, x: Tensor, y: Tensor, batch_size: int = 1000) -> EvalResult:
        """Top-1/top-5 counts of ``predict(client, x)`` on the given data."""
        self.model.eval()
        correct = correct5 = 0
        loss_sum = 0.0
        k = min(5, self.num_classes)
        start = time.perf_counter()
        for lo in range(0, int(y.shape[0]), batch_size):
            xb, yb = x[lo : lo + batch_size], y[lo : lo + batch_size]
            with self.autocast():
                logits = predict(self, xb)
            logits = logits.float()
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            top = logits.topk(k, dim=1).indices
            correct += int((top[:, 0] == yb).sum())
            correct5 += int((top == yb[:, None]).any(dim=1).sum())
        self.model_seconds += time.perf_counter() - start
        return EvalResult(correct, correct5, int(y.shape[0]), loss_sum)

    @torch.inference_mode()
    def class_prototypes(
        self, encode: Callable[[Tensor], Tensor] | None = None, batch_size: int = 1000
    ) -> tuple[Tensor, Tensor]:
        """Per-class mean of ``encode(x)`` (default: the features, Eq. 5) over the train split
        and the per-class counts. Classes the client does not hold get a zero row, count 0.
        """
        self.model.eval()
        encode = encode or self.model.features
        start = time.perf_counter()
        sums: Tensor | None = None
        for lo in range(0, self.num_train, batch_size):
            with self.autocast():
                feats = encode(self.train_x[lo : lo + batch_size]).float()
            if sums is None:
                sums = torch.zeros(self.num_classes, feats.shape[1], device=self.device)
            sums.index_add_(0, self.train_y[lo : lo + batch_size], feats)
        self.model_seconds += time.perf_counter() - start
        counts = self.class_counts()
        assert sums is not None, "client has no training data"
        means = sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)
        return means, counts

    def record_class_sums(self, values: Tensor, y: Tensor) -> None:
        """Add one training batch's features (or logits) to this round's per-class sums."""
        if self.class_sums is None:
            sums = torch.zeros(self.num_classes, values.shape[1], device=values.device)
            self.class_sums = (sums, torch.zeros(self.num_classes, device=values.device))
        sums, seen = self.class_sums
        sums.index_add_(0, y, values.detach().float())
        seen.index_add_(0, y, torch.ones_like(y, dtype=seen.dtype))

    def prototypes(self, source: str, width: int | None = None) -> tuple[Tensor, Tensor]:
        """Per-class mean features and per-class counts, from `source` (PROTOTYPE_SOURCES).

        "pass": the counts are the train split's class counts. "training" uses (and clears)
        the sums of `record_class_sums` since the last call, and the counts are the features
        each mean holds: a class whose samples all fell in dropped partial batches has count
        0, so it is not uploaded as a zero "prototype" (as in the authors' code, where only
        the classes met in training get a prototype). A client that trained on no batch
        sends zeros with count 0; ``width`` is then their width (default: the feature width).
        """
        if source == "pass":
            return self.class_prototypes()
        if self.class_sums is None:
            width = width or self.model.feature_dim
            zeros = torch.zeros(self.num_classes, width, device=self.device)
            return zeros, torch.zeros_like(self.class_counts())
        (sums, seen), self.class_sums = self.class_sums, None
        return sums / seen.clamp(min=1).unsqueeze(1), seen.round().long()

    def state_dict(self) -> dict[str, Any]:
        # Modules in the algorithm's state (e.g. a shared model) are saved as weights only.
        state = {
            k: {_MODULE_KEY: v.state_dict()} if isinstance(v, torch.nn.Module) else v
            for k, v in vars(self.state).items()
        }
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "state": state,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.model.load_state_dict(saved["model"])
        if self.optimizer is not None and saved["optimizer"] is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        for key, value in saved["state"].items():
            if isinstance(value, dict) and _MODULE_KEY in value:
                # Load in place: the optimiser holds this module's parameter objects.
                getattr(self.state, key).load_state_dict(value[_MODULE_KEY])
            else:
                setattr(self.state, key, value)


_MODULE_KEY = "__module_state__"
