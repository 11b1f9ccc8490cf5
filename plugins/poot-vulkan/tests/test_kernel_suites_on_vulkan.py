"""The kernel test suites (every synthesized kernel against the CPU oracle, fresh random inputs,
poisoned outputs) run again with ``POOT_TEST_DEVICE=vulkan:0``: on lavapipe in CI. The host-only
lane attention schedule is skipped there (GPU plans never use it); everything else must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.errors import DeviceUnavailable
from poot.runtime import get_device
from poot.testing.kernels import kernel_suites_on

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_every_kernel_case_passes_on_vulkan():
    try:
        dev = get_device("vulkan:0")
    except DeviceUnavailable as e:
        pytest.skip(f"no Vulkan device here: {e}")
    if not dev.available():
        pytest.skip(f"vulkan:0 is unavailable: {dev.available()}")
    passed, skipped, tail = kernel_suites_on("vulkan:0", ROOT)
    assert passed >= 178 and skipped <= 12, tail  # skipped: only the host lane attention cases
    print(f"vulkan:0 kernel suites: {passed} passed, {skipped} skipped")
