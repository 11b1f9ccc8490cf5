"""Device runs (``poot.testing.device_suites``) report each case as it ended on the device: a pass,
a skip with its reason, a failure with its report; a static skip is left out of the run, and a run
that dies fails the cases it had not reported."""

from __future__ import annotations

import pytest

from poot.testing.device_suites import NOT_RUN, DeviceSuite, DeviceSuites, device_run_or_skip, device_unavailable, suite_cases

SUITE_FILE = """
import os, pytest

def test_sees_the_device():
    assert os.environ["POOT_TEST_DEVICE"] == "null:sm_90a"

def test_skips():
    pytest.skip("not on this device")

@pytest.mark.parametrize("x", [1, 2])
def test_fails_once(x):
    assert x == 1, "two is not one"

@pytest.mark.skipif(True, reason="never here")
def test_static_skip():
    pass

def test_dies():
    os._exit(3)

def test_after_death():
    pass
"""


def test_each_case_reports_as_it_ended(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE_FILE)
    suite = DeviceSuite("null:sm_90a", ("test_suite.py",), str(tmp_path))
    if device_unavailable(suite.device):
        pytest.skip("no ptxas here: the device name this test uses is not available")
    cases = suite_cases(suite)
    assert cases != [NOT_RUN] and [c.split("::")[1] for c in cases] == [
        "test_sees_the_device",
        "test_skips",
        "test_fails_once[1]",
        "test_fails_once[2]",
        "test_dies",
        "test_after_death",
    ]
    runs = DeviceSuites()
    try:
        runs.add(suite)
        runs.check(suite, cases[0])  # passes
        with pytest.raises(pytest.skip.Exception, match="not on this device"):
            runs.check(suite, cases[1])
        runs.check(suite, cases[2])
        with pytest.raises(pytest.fail.Exception, match="two is not one") as e:
            runs.check(suite, cases[3])
        assert "test_fails_once[2]" in str(e.value)
        with pytest.raises(pytest.fail.Exception, match=r"ended \(exit 3\) before .*test_dies"):
            runs.check(suite, cases[4])
        with pytest.raises(pytest.fail.Exception, match="test_after_death"):
            runs.check(suite, cases[5])
        assert any("2 passed, 1 skipped, 1 failed" in line for line in runs.summary())
    finally:
        runs.close()


def test_a_device_ci_expects_fails_where_it_cannot_run(monkeypatch):
    monkeypatch.setenv("POOT_EXPECT_DEVICE_RUNS", "null:sm_90a")
    with pytest.raises(pytest.skip.Exception, match="vulkan:7"):
        device_run_or_skip("vulkan:7")
    monkeypatch.setenv("POOT_EXPECT_DEVICE_RUNS", "null:sm_90a,vulkan:7")
    with pytest.raises(AssertionError, match="vulkan:7 must run its suites here"):
        device_run_or_skip("vulkan:7")
