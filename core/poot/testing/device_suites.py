"""The kernel test suites run again on other devices, each case reported as a case of this run.

A device suite is a set of test files (or node ids) run with ``POOT_TEST_DEVICE`` naming a device, in
a fresh interpreter, so the device is chosen before a test module is imported and a driver's crash
takes down only that interpreter. Its cases are collected there too, and the test that stands for
them here is parametrized by them: each passes, skips with the device run's reason, or fails with the
device run's report, under its own name. Cases a device cannot be given (a static skip such as "needs
32-lane subgroups", or a case marked ``device_independent``) are left out of its suite.

The runs start when collection ends, beside the rest of the suite with a core left for it, and side
by side on every core once this run only waits for them (Mesa and NVIDIA's assembler compile on one thread each).
This module is a pytest plugin (the repository's conftest loads it): the scheduling hooks run in the
outer run; the reporting hook in a device run, where ``POOT_CASE_REPORT`` names the file it writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["DeviceSuite", "suite_cases", "case_id", "device_unavailable", "device_run_or_skip", "NOT_RUN"]

REPORT_ENV = "POOT_CASE_REPORT"
SUITE_ENV = "POOT_DEVICE_SUITE"  # set in a device run: static skips and device-independent cases are left out
NOT_RUN = "not-run-here"  # the one case of a suite whose device is not here
RUN_TIMEOUT = 3600.0  # seconds a device run may take before its remaining cases fail


@dataclass(frozen=True)
class DeviceSuite:
    """Test files or node ids (``suites``, relative to ``root``) to run with ``POOT_TEST_DEVICE=device``."""

    device: str
    suites: tuple[str, ...]
    root: str

    def args(self) -> list[str]:
        return [*self.suites, "-p", "no:cacheprovider", "-p", "poot.testing.device_suites", "-o", "addopts=--import-mode=importlib"]

    def env(self) -> dict[str, str]:
        return {**os.environ, "POOT_TEST_DEVICE": self.device, SUITE_ENV: "1"}


def device_unavailable(device: str) -> str | None:
    """Why kernels cannot run on ``device`` here, or None where they can: the device is here and
    available, and an installed plugin runs single kernels on it (``poot_kernel_runner``; for a
    compile-only ``null:ARCH`` device, one that compiles and assembles them, which may
    need its toolchain)."""
    from ..errors import DeviceUnavailable
    from ..plugins import host
    from ..runtime import get_device

    try:
        dev = get_device(device)
    except DeviceUnavailable as e:
        return f"no device {device} here: {e}"
    reason = dev.available()
    if not reason:
        return f"{device} is unavailable: {reason}"
    try:
        runner = host().hook.poot_kernel_runner(device=dev)
    except DeviceUnavailable as e:
        return f"{device} runs no kernels here: {e}"
    return None if runner is not None else f"no installed plugin runs single kernels on {device}"


def device_run_or_skip(device: str) -> None:
    """Skip, saying why, where kernels cannot run on ``device`` here; fail instead where
    ``POOT_EXPECT_DEVICE_RUNS`` (a comma-separated list, set by CI) names it."""
    reason = device_unavailable(device)
    if reason:
        assert device not in os.environ.get("POOT_EXPECT_DEVICE_RUNS", "").split(","), f"{device} must run its suites here: {reason}"
        pytest.skip(reason)


def suite_cases(suite: DeviceSuite) -> list[str]:
    """The node ids of ``suite``'s cases on its device, collected in a fresh interpreter; ``[NOT_RUN]``
    where the device is not here (that case skips, saying why). A suite that fails to collect raises
    with the collector's output."""
    if device_unavailable(suite.device):
        return [NOT_RUN]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *suite.args()], env=suite.env(), cwd=suite.root, capture_output=True, text=True, timeout=600
    )
    ids = [line.strip() for line in r.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if r.returncode not in (0, 5) or not ids:
        raise RuntimeError(f"collecting {' '.join(suite.suites)} for {suite.device} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    return ids


def case_id(case: str) -> str:
    """A device case's name in this run: its node id less the ``tests/`` folder."""
    return case.removeprefix("tests/")


@dataclass
class _Case:
    outcome: str = "passed"
    text: str = ""
    seconds: float = 0.0
    done: bool = False


@dataclass
class _Run:
    """One device run: its process, its report file read as it grows, the cases reported so far."""

    suite: DeviceSuite
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0
    cases: dict[str, _Case] = field(default_factory=dict)
    _offset: int = 0
    _log: Any = None

    @property
    def report(self) -> Path:
        return self.folder / "cases.jsonl"

    @property
    def log(self) -> Path:
        return self.folder / "output.log"

    def start(self) -> None:
        self._log = open(self.log, "wb")
        env = {**self.suite.env(), REPORT_ENV: str(self.report)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "--durations=10", *self.suite.args()],
            env=env,
            cwd=self.suite.root,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.started = time.monotonic()

    def running(self) -> bool:
        if self.proc is None or self.ended:
            return False
        if self.proc.poll() is None:
            return True
        self.ended = time.monotonic()
        self._log.close()
        return False

    def read(self) -> None:
        if not self.report.exists():
            return
        with open(self.report, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.decode().splitlines():
            r = json.loads(line)
            case = self.cases.setdefault(r["nodeid"], _Case())
            case.seconds += r["duration"]
            if r["outcome"] == "failed" and case.outcome != "failed":
                case.outcome, case.text = "failed", f"{r['when']}: {r['text']}"
            elif r["outcome"] == "skipped" and case.outcome == "passed":
                case.outcome, case.text = "skipped", r["text"]
            if r["when"] == "teardown":
                case.done = True

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_bytes()[-chars:].decode(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.running():
            self.proc.kill()  # type: ignore[union-attr]
            self.proc.wait()  # type: ignore[union-attr]
            self.running()


class DeviceSuites:
    """The device runs of one test session: started in collection order, as many at once as the
    cores allow (all but one while other tests run here), each case's result handed to its test."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="poot-device-suites-"))
        self.runs: dict[DeviceSuite, _Run] = {}
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def add(self, suite: DeviceSuite) -> None:
        if suite not in self.runs and not device_unavailable(suite.device):
            folder = self.folder / f"{len(self.runs)}-{suite.device.replace(':', '-')}"
            folder.mkdir()
            self.runs[suite] = _Run(suite, folder)

    def poll(self, waiting: bool = False) -> None:
        """Start pending runs while fewer than the cores allow are running (all of them while this
        run waits on a case, else one less)."""
        limit = self.cores if waiting else max(1, self.cores - 1)
        busy = sum(r.running() for r in self.runs.values())
        for r in self.runs.values():
            if busy >= limit:
                break
            if r.proc is None:
                r.start()
                busy += 1

    def check(self, suite: DeviceSuite, case: str) -> None:
        """Wait for ``case`` of ``suite`` and pass, skip or fail as it did on the device."""
        reason = device_unavailable(suite.device)
        if reason or case == NOT_RUN:
            pytest.skip(reason or f"{suite.device}: its cases were collected where it was not available")
        self.add(suite)
        run = self.runs[suite]
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            run.read()
            got = run.cases.get(case)
            if got is not None and got.done:
                break
            if run.proc is not None and not run.running():
                run.read()
                got = run.cases.get(case)
                if got is not None and got.done:
                    break
                pytest.fail(
                    f"{suite.device}: the device run ended (exit {run.proc.returncode}) before {case} reported; its output's tail:\n{run.tail()}", pytrace=False
                )
            if time.monotonic() > deadline:
                run.stop()
                pytest.fail(f"{suite.device}: the device run took over {RUN_TIMEOUT:.0f} s; stopped before {case} reported", pytrace=False)
            self.poll(waiting=True)
            time.sleep(0.05)
        if got.outcome == "skipped":
            pytest.skip(f"on {suite.device}: {got.text}")
        if got.outcome == "failed":
            pytest.fail(f"{case} on {suite.device}:\n{got.text}", pytrace=False)

    def summary(self) -> list[str]:
        lines = []
        for run in self.runs.values():
            if run.proc is None:
                continue
            run.running()
            run.read()
            counts = {o: sum(c.done and c.outcome == o for c in run.cases.values()) for o in ("passed", "skipped", "failed")}
            took = (run.ended or time.monotonic()) - run.started
            ended = "" if run.proc.returncode in (None, 0, 1) else f", the run ended with exit {run.proc.returncode}"
            lines.append(
                f"{run.suite.device}: {counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed in {took:.0f} s{ended} "
                f"({' '.join(run.suite.suites)})"
            )
            slow = sorted(run.cases.items(), key=lambda kv: -kv[1].seconds)[:5]
            lines += [f"    {c.seconds:7.2f}s {nodeid}" for nodeid, c in slow]
        return lines

    def close(self) -> None:
        for run in self.runs.values():
            run.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


_KEY = pytest.StashKey[DeviceSuites]()


def _suites(config: pytest.Config) -> DeviceSuites | None:
    return config.stash.get(_KEY, None)


# -- the outer run: start the device runs, hand each case its result --------------------------------


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(REPORT_ENV):
        config.stash[_KEY] = DeviceSuites()


def pytest_collection_finish(session: pytest.Session) -> None:
    suites = _suites(session.config)
    if suites is None or session.config.option.collectonly:
        return
    for item in session.items:
        mark = item.get_closest_marker("device_suite")
        if mark is not None:
            suites.add(mark.args[0])
    suites.poll()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    suites = _suites(item.config)
    if suites is not None and suites.runs:
        suites.poll()


@pytest.fixture(scope="session")
def device_suites(request: pytest.FixtureRequest) -> DeviceSuites:
    """The session's device runs: ``device_suites.check(suite, case)`` passes, skips or fails as
    ``case`` did on ``suite``'s device."""
    suites = _suites(request.config)
    assert suites is not None, "device suites are not run inside a device run"
    return suites


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    suites = _suites(config)
    if suites is not None and suites.runs:
        terminalreporter.section("device runs")
        for line in suites.summary():
            terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    suites = _suites(config)
    if suites is not None:
        suites.close()


# -- a device run: leave out what the device cannot be given, report each phase of each case -------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get(SUITE_ENV):
        return
    keep, drop = [], []
    for item in items:
        static_skip = item.get_closest_marker("skip") is not None or any(
            m.args and isinstance(m.args[0], bool) and m.args[0] for m in item.iter_markers("skipif")
        )
        (drop if static_skip or item.get_closest_marker("device_independent") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A case that ended by assembling its kernel (``Assembled``: a compile-only device, ``POOT_TEST_DEVICE=null:ARCH``)
    passed: compiling and assembling is what such a run checks."""
    outcome = yield
    from .kernels import Assembled

    report = outcome.get_result()
    if call.excinfo is not None and isinstance(call.excinfo.value, Assembled):
        report.outcome, report.longrepr = "passed", None
        report.user_properties.append(("assembled", str(call.excinfo.value)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.outcome == "skipped" and hasattr(report, "wasxfail"):
        text = f"xfail: {report.wasxfail}"
    else:
        text = report.longreprtext if report.outcome == "failed" else ""
    rec = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text[-20000:], "duration": report.duration}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
