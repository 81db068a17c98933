"""The one seeding rule of every engine: seeds derived from integers, and all three RNGs set.

A round's randomness is a function of (seed, round) alone and a client's batch order of
(seed, round, client), through `derive_seed`, so a resumed run, another engine or another
process repeats it exactly; `seed_everything` sets Python's, NumPy's and torch's RNG at once.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def derive_seed(*parts: int) -> int:
    """A 32-bit seed from integers, independent of any global random state."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, object]:
    """The three global RNGs' state, to continue their stream elsewhere (`set_rng_state`)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, object]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
