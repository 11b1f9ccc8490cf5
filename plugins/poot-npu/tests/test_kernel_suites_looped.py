"""Every device kernel-suite case in the looped form an AIE core runs: the suites run with
``POOT_TEST_DEVICE=null:xdna2``, whose kernel runner turns each case's kernel into loops
(``grid_to_loops``), compiles that for the host and runs it over the case's grid, so each case's
own assertions hold the looped form to the CPU oracle; each is reported as a case here. (Cases
that need subgroups of 8 lanes or more skip: a core has none.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from poot.testing.device_suites import DeviceSuite, case_id, device_run_or_skip, suite_cases
from poot.testing.kernels import DEVICE_KERNEL_SUITES, GPU_SCHEDULES

SUITE = DeviceSuite("null:xdna2", DEVICE_KERNEL_SUITES + GPU_SCHEDULES, str(Path(__file__).resolve().parents[3]))

CASES = suite_cases(SUITE)


def test_the_device_run_has_every_case():
    """The device run happens here where CI expects it (``POOT_EXPECT_DEVICE_RUNS``), and its
    suites have their cases (a suite that collected few would pass below): 200 or more here."""
    device_run_or_skip(SUITE.device)
    assert len(CASES) >= 200, len(CASES)


@pytest.mark.slow
@pytest.mark.device_suite(SUITE)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_case_runs_looped(case, device_suites):
    device_suites.check(SUITE, case)
