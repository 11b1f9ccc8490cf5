"""Every NVIDIA schedule case compiled and assembled where no GPU is: the GPU schedule suites (the
shared ones and NVIDIA's own) run with ``POOT_TEST_DEVICE=null:sm_90a``, the compile-only Hopper,
whose kernel runner compiles each case's first kernel to PTX, assembles it with ptxas, and checks
it against what a launch would refuse (registers times threads, workgroup memory), each case
reported as a case here. On a GPU the same suites run their
sums against the oracle (``scripts/gpu-check``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.testing.device_suites import DeviceSuite, case_id, device_run_or_skip, suite_cases

# the shared GPU schedules and NVIDIA's own kernels, from the repository's root
NVIDIA_SCHEDULES = ("tests/test_kernels_gpu_schedules.py", "plugins/poot-ptx/tests/test_kernels_mma.py", "plugins/poot-ptx/tests/test_kernels_wgmma.py")
SUITE = DeviceSuite("null:sm_90a", NVIDIA_SCHEDULES, str(Path(__file__).resolve().parents[3]))

CASES = suite_cases(SUITE)


def test_the_device_run_has_every_case():
    """The device runs here where CI expects it (``POOT_EXPECT_DEVICE_RUNS``), and its suites have
    their cases (a suite that collected few would pass below): 800 or more here."""
    device_run_or_skip(SUITE.device)
    assert len(CASES) >= 800, CASES


@pytest.mark.slow
@pytest.mark.device_suite(SUITE)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_case_assembles_for_sm_90a(case, device_suites):
    device_suites.check(SUITE, case)
