"""The kernel test suites (every synthesized kernel against the CPU oracle, fresh random inputs,
poisoned outputs) run again with ``POOT_TEST_DEVICE=vulkan:0``: on lavapipe in CI. The host-only
lane attention schedule is skipped there (GPU plans never use it); everything else must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.testing.fixtures import device_or_skip, subgroups_or_skip
from poot.testing.kernels import GPU_SCHEDULES, kernel_suites_on

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_every_kernel_case_passes_on_vulkan():
    device_or_skip("vulkan:0")
    passed, skipped, tail = kernel_suites_on("vulkan:0", ROOT)
    assert passed >= 260 and skipped <= 32, tail  # skipped: only the host lane attention cases (4 layouts x 4 masks and pools, one pass and split)
    print(f"vulkan:0 kernel suites: {passed} passed, {skipped} skipped")


def test_subgroup_schedules_pass_on_vulkan():
    """The GPU schedule suite's cases that the device's subgroups allow (on lavapipe, 8 lanes: the
    norms that sum by subgroup reductions and the Q4_K GEMVs' activation quantizer)."""
    subgroups_or_skip("vulkan:0")
    passed, skipped, tail = kernel_suites_on("vulkan:0", ROOT, GPU_SCHEDULES)
    assert passed >= 12, tail
    print(f"vulkan:0 GPU schedule suite: {passed} passed, {skipped} skipped")
