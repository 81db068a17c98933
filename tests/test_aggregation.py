"""Server aggregation rules: the numbers are the hand-computed weighted means."""

from __future__ import annotations

import pytest
import torch

from fedtsp.algorithms.aggregation import aggregate_prototypes, fedavg, normalized_weights


def test_fedavg_is_the_sample_weighted_mean():
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([4.0, 8.0])}]
    weights = normalized_weights([30, 10])
    assert weights.tolist() == [0.75, 0.25]
    assert torch.allclose(fedavg(states, weights)["w"], torch.tensor([1.75, 3.5]))
    uniform = fedavg(states, normalized_weights([30, 10], "uniform"))["w"]
    assert torch.allclose(uniform, torch.tensor([2.5, 5.0]))
    with pytest.raises(ValueError, match="weighting='median' is invalid"):
        normalized_weights([1], "median")


def test_prototype_average_counts_only_holders():
    protos = [torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[3.0, 0.0], [0.0, 2.0]])]
    counts = [torch.tensor([1, 0]), torch.tensor([3, 5])]
    mean, present = aggregate_prototypes(protos, counts, "samples")
    assert torch.allclose(mean, torch.tensor([[2.5, 0.0], [0.0, 2.0]]))  # (1*1 + 3*3) / 4
    assert present.tolist() == [True, True]
    uniform, _ = aggregate_prototypes(protos, counts, "uniform")
    assert torch.allclose(uniform, torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
