"""Options checked from their declaration, and server checkpoints from `server_state`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from fedtsp.algorithms import resolve_options
from fedtsp.algorithms.base import RunContext, ServerHalf
from fedtsp.core.config import ConfigError
from fedtsp.core.options import build_options, option


@dataclass
class ToyOptions:
    share: float = option(0.5, "a share", "(0, 1]")
    steps: int = option(3, "steps", ">= 1")
    mode: str = option("a", "a mode", choices=("a", "b"))
    named: str = option("x", "from a registry filled later", choices=lambda: ["x", "y"])
    cap: float | None = option(None, "unset or positive", "> 0")


def _build(**values: object) -> ToyOptions:
    return build_options(ToyOptions, "toy", values)


def test_declared_ranges_and_choices_accept_their_edges_and_reject_the_rest():
    assert _build(share=1.0, steps=1, mode="b", named="y", cap=0.1).share == 1.0
    assert _build(cap=None).cap is None  # None means unset: never checked
    bad = {
        "share=0.0 is invalid; must be in \\(0, 1\\]": {"share": 0.0},
        "share=1.5 is invalid; must be in \\(0, 1\\]": {"share": "1.5"},
        "steps=0 is invalid; must be >= 1": {"steps": 0},
        "mode='c' is invalid; choose one of a, b": {"mode": "c"},
        "named='z' is invalid; choose one of x, y": {"named": "z"},
        "cap=0.0 is invalid; must be > 0": {"cap": "0"},
        "steps=True is invalid; expected an int": {"steps": True},
        "no option\\(s\\) speed; its options: cap, mode, named, share, steps": {"speed": 1},
    }
    for message, values in bad.items():
        with pytest.raises(ConfigError, match=f"algorithm 'toy'.*{message}"):
            _build(**values)


def test_a_malformed_range_fails_when_the_method_is_defined():
    with pytest.raises(ValueError, match="option bounds '=> 0'"):
        option(1, "x", "=> 0")


def test_registered_methods_check_their_declared_options():
    with pytest.raises(ConfigError, match="energy_end=1.5 is invalid; must be in \\(0, 1\\]"):
        resolve_options("fedkd", {"energy_end": 1.5})
    with pytest.raises(ConfigError, match="grad_clip=-1.0 is invalid; must be > 0"):
        resolve_options("fml", {"grad_clip": "-1"})
    with pytest.raises(ConfigError, match="shared_arch='vgg' is invalid; choose one of first, "):
        resolve_options("fedmrl", {"shared_arch": "vgg"})
    # A rule that ties two fields together stays in validate().
    with pytest.raises(ConfigError, match="set only one"):
        resolve_options("fedtsp", {"dp_epsilon": 1.0, "dp_noise_std": 0.1})


class _Toy(ServerHalf):
    server_state = ("net", "table", "metrics")


def test_server_state_round_trips_and_loads_modules_in_place():
    ctx = RunContext("cifar10", ["a", "b"], 4, 2, 3, torch.device("cpu"), seed=0)
    first, second = _Toy(None, ctx), _Toy(None, ctx)
    torch.manual_seed(0)
    first.net, first.table, first.metrics = nn.Linear(4, 2), torch.arange(3.0), {"loss": 0.5}
    torch.manual_seed(1)
    second.net, second.table = nn.Linear(4, 2), None
    net = second.net
    second.load_state_dict(first.state_dict())
    assert second.net is net  # loaded in place: whoever holds the module sees the weights
    assert torch.equal(second.net.weight, first.net.weight)
    assert torch.equal(second.table, first.table) and second.metrics == {"loss": 0.5}
    assert set(first.state_dict()) == {"net", "table", "metrics"}
