"""Every shared GPU schedule case compiled for RDNA 3 and linked where no AMD GPU is: the suite runs
with ``POOT_TEST_DEVICE=null:gfx1100`` (wave32, so the 32-lane cases run too), whose kernel runner
compiles each case's kernel for ``amdgcn:gfx1100``, links it with ld.lld, reads the code object's
metadata back and checks it against the kernel (arguments in order, LDS within 64 KiB, registers
within what its waves may have), each case reported as a case here. On an AMD GPU the same suite
runs its sums against the oracle (``scripts/rocm-check``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.testing.device_suites import DeviceSuite, case_id, device_run_or_skip, suite_cases
from poot.testing.kernels import GPU_SCHEDULES

SUITE = DeviceSuite("null:gfx1100", GPU_SCHEDULES, str(Path(__file__).resolve().parents[3]))

CASES = suite_cases(SUITE)


def test_the_device_run_has_every_case():
    """The device run happens here where CI expects it (``POOT_EXPECT_DEVICE_RUNS``), and its suite
    has its cases (a suite that collected few would pass below): 450 or more here."""
    device_run_or_skip(SUITE.device)
    assert len(CASES) >= 450, CASES


@pytest.mark.slow
@pytest.mark.device_suite(SUITE)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_case_links_for_gfx1100(case, device_suites):
    device_suites.check(SUITE, case)
