"""The pytest plugin with poot's shared fixtures (loaded by the repository's root conftest)."""

from __future__ import annotations

import numpy as np
import pytest

from .random import fresh_seed


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator with a fresh seed per test; the seed is printed so a failure can be replayed
    with POOT_TEST_SEED=<seed>."""
    seed = fresh_seed()
    print(f"random seed {seed} (replay with POOT_TEST_SEED={seed})")
    return np.random.default_rng(seed)
