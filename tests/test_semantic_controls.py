"""FedTSP's semantic controls: fixed targets that keep the text's geometry or spread but not
its meaning (random unit vectors, shuffled text prototypes, AlignFed's simplex anchors)."""

from __future__ import annotations

import pytest
import torch

from fedtsp.algorithms import get_algorithm, resolve_options
from fedtsp.algorithms.base import RunContext
from fedtsp.data import dataset_info


def _targets(kind: str, seed: int = 0) -> torch.Tensor:
    """The first broadcast's class targets of a CIFAR-10 FedTSP server (fixed prompts)."""
    opts = resolve_options("fedtsp", {"targets": kind, "trainable_prompts": False})
    classes = list(dataset_info("cifar10").classes)
    ctx = RunContext("cifar10", classes, 384, 4, 2, torch.device("cpu"), seed)
    return get_algorithm("fedtsp").Server(opts, ctx).setup([], {})["text_protos"]


def test_shuffled_keeps_every_text_prototype_but_gives_no_class_its_own():
    text, shuffled = _targets("text"), _targets("shuffled")
    same = torch.cdist(shuffled, text) < 1e-6  # (class, text class) equal rows
    assert same.sum(1).tolist() == [1] * 10  # each row is one of the text prototypes ...
    assert same.sum(0).tolist() == [1] * 10  # ... each used once (a permutation) ...
    assert not same.diagonal().any()  # ... and none on its own class
    # Geometry kept: the same multiset of pairwise similarities.
    sims = lambda t: torch.sort((t @ t.T).flatten()).values  # noqa: E731
    assert torch.allclose(sims(text), sims(shuffled), atol=1e-6)


def test_random_targets_are_unit_vectors_fixed_by_the_seed():
    first, again, other = _targets("random", 0), _targets("random", 0), _targets("random", 1)
    assert torch.allclose(first.norm(dim=1), torch.ones(10))
    assert torch.equal(first, again) and not torch.equal(first, other)
    # In 384 dimensions random directions are nearly orthogonal, unlike related class names.
    off = ~torch.eye(10, dtype=torch.bool)
    assert (first @ first.T)[off].abs().max() < 0.3


def test_simplex_anchors_are_spread_evenly_on_the_sphere():
    anchors = _targets("simplex")
    assert torch.allclose(anchors.norm(dim=1), torch.ones(10), atol=1e-5)
    off = (anchors @ anchors.T)[~torch.eye(10, dtype=torch.bool)]
    # A regular simplex of 10 points has every cosine at -1/9.
    assert off.max() - off.min() < 0.02 and off.mean() == pytest.approx(-1 / 9, abs=0.01)


def test_a_control_with_trainable_prompts_is_refused():
    with pytest.raises(ValueError, match="trainable_prompts=False"):
        resolve_options("fedtsp", {"targets": "random"})
