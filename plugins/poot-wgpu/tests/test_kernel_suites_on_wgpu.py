"""The kernel test suites (every synthesized kernel against the CPU oracle, fresh random inputs,
poisoned outputs) run again with ``POOT_TEST_DEVICE=wgpu:0``: codegen's SPIR-V through naga, on
lavapipe in CI, each case reported as a case here. With them, the GPU schedule suite's cases that the
adapter's subgroups allow (on lavapipe, 8 lanes: the norms that sum by subgroup reductions and the
Q4_K GEMVs' activation quantizer, whose f32-to-i32 conversions naga clamped at 0 until ``for_wgpu``
typed them signed). The host-only lane attention schedule skips there; everything else must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.testing.device_suites import DeviceSuite, case_id, device_run_or_skip, suite_cases
from poot.testing.kernels import DEVICE_KERNEL_SUITES, GPU_SCHEDULES

SUITE = DeviceSuite("wgpu:0", DEVICE_KERNEL_SUITES + GPU_SCHEDULES, str(Path(__file__).resolve().parents[3]))

CASES = suite_cases(SUITE)


def test_the_device_run_has_every_case():
    """The device runs here where CI expects it (``POOT_EXPECT_DEVICE_RUNS``), and its suites have
    their cases (a suite that collected few would pass below): 275 or more here."""
    device_run_or_skip(SUITE.device)
    assert len(CASES) >= 275, CASES


@pytest.mark.slow
@pytest.mark.device_suite(SUITE)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_case_on_wgpu(case, device_suites):
    device_suites.check(SUITE, case)
