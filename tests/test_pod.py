"""`poot pod run` against a real Ray cluster: a head started here (CPU only) takes this source tree as a
job, runs `poot check --device cpu` from it, and the results come back home; a job that fails is
reported as one; damaged results are refused."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ray = pytest.importorskip("ray", reason="Ray (pip install 'poot[pod]') runs the local cluster")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on loopback with its job server (the dashboard), in a temporary folder of its own
    (a short path: Ray's sockets live there)."""
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    dash = _free_port()
    cmd = [sys.executable, "-m", "ray.scripts.scripts"]
    start = cmd + [
        "start",
        "--head",
        f"--port={_free_port()}",
        "--num-cpus=2",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--ray-client-server-port={_free_port()}",
        "--include-dashboard=true",
        "--disable-usage-stats",
        f"--temp-dir={tmp}",
        "--object-store-memory=100000000",
    ]
    r = subprocess.run(start, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield f"http://127.0.0.1:{dash}"
    finally:
        subprocess.run(cmd + ["stop", "--force"], capture_output=True, timeout=120)


def _pod(address: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "poot.cli", "pod", "run", "--address", address, "--tree", str(ROOT), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_a_pod_run_of_poot_check_brings_its_results_home(ray_head, smollm2_path, tmp_path):
    r = _pod(ray_head, tmp_path, "--", "check", "--device", "cpu")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # the job ran the shipped tree, its log streamed here, and its check.json came back
    assert "from the tree at" in r.stdout and "poot check on cpu: all" in r.stdout
    assert "POOT-POD-RESULTS" not in r.stdout  # the results' own lines are taken out of the log
    done = [l for l in r.stdout.splitlines() if l.startswith("poot pod: 1 result file in ")]
    assert done, r.stdout[-2000:]
    folder = tmp_path / done[0].split(" in ", 1)[1].split(":")[0]
    doc = json.loads((folder / "check.json").read_text())
    assert doc["device"] == "cpu" and doc["passed"] is True
    assert {c["part"] for c in doc["results"]} == {"kernels", "models", "checkpoint", "bench"}
    assert all(c["status"] == "pass" for c in doc["results"])


def test_a_failed_pod_job_is_reported_as_one(ray_head, tmp_path):
    r = _pod(ray_head, tmp_path, "--", "check", "--device", "nosuch:0")
    assert r.returncode == 1
    assert "unknown device 'nosuch:0'" in r.stdout  # the job's own log, streamed
    assert "failed: poot exited with 1" in r.stderr


def test_pod_errors_name_what_is_wrong(tmp_path):
    port = _free_port()  # nothing listens there
    r = subprocess.run(
        [sys.executable, "-m", "poot.cli", "pod", "run", "--address", f"http://127.0.0.1:{port}", "--", "devices"], capture_output=True, text=True
    )
    assert r.returncode == 1 and f"no Ray job server answers at http://127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "poot.cli", "pod", "run", "--address", "http://127.0.0.1:1"], capture_output=True, text=True)
    assert r.returncode == 1 and "needs a command after '--'" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "poot.cli", "pod", "run", "--address", "http://x", "--tree", str(tmp_path), "--", "devices"], capture_output=True, text=True
    )
    assert r.returncode == 1 and "is not a poot source tree" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "poot.cli", "pod", "run", "--address", "http://x", "--env", "NOEQUALS", "--", "devices"], capture_output=True, text=True
    )
    assert r.returncode == 1 and "--env NOEQUALS: give NAME=VALUE" in r.stderr


def test_damaged_results_are_refused():
    from poot.pod import PodError, results_from_log
    from poot.pod.remote import MARKER

    data = os.urandom(1000)
    text = base64.b64encode(data).decode()
    good = f"noise\n{MARKER} 0 {text[:600]}\nmore noise\n{MARKER} 1 {text[600:]}\n{MARKER} end {hashlib.sha256(data).hexdigest()} 1000 3\n"
    assert results_from_log(good) == (data, 3)
    assert results_from_log("a job that ended before sending any\n") is None
    with pytest.raises(PodError, match="damaged"):
        results_from_log(good.replace(f"{MARKER} 1 {text[600:]}", f"{MARKER} 1 {text[600:-4]}AAAA"))
    with pytest.raises(PodError, match="pieces missing"):
        results_from_log(good.replace(f"{MARKER} 0 ", f"{MARKER} 7 "))


def test_a_shipped_tree_leaves_out_what_git_ignores_there(tmp_path):
    """``tree_excludes``: the fixed list, and each path git ignores in the tree, by .gitignore or by
    .git/info/exclude (which Ray does not read): a 60 MB folder ignored only there had made the
    upload pass Ray's 100 MB limit. Tracked and untracked files stay; outside git, the fixed list."""
    from poot.pod import EXCLUDES, tree_excludes

    assert tree_excludes(tmp_path) == EXCLUDES  # not a checkout
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / ".git" / "info" / "exclude").write_text("/parts/\n")
    for name in ("kept.py", "new.py", "run.log", "parts/a.bin", "parts/b.bin"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "a[1].log").write_text("x")
    git("add", "kept.py", ".gitignore")
    got = tree_excludes(tmp_path)
    assert got[: len(EXCLUDES)] == EXCLUDES and sorted(got[len(EXCLUDES) :]) == ["/a\\[1\\].log", "/parts/", "/run.log"], got  # globs literal
    # a tree inside a larger checkout: its own ignored paths, relative to it; the root's anchored
    # patterns do not reach into it
    (tmp_path / ".gitignore").write_text("*.log\n/build/\n")
    sub = tmp_path / "vendor" / "poot"
    for name in ("build/kept.py", "out.log", "parts/c.bin"):
        (sub / name).parent.mkdir(parents=True, exist_ok=True)
        (sub / name).write_text("x")
    git("add", "vendor/poot/build/kept.py")
    assert sorted(tree_excludes(sub)[len(EXCLUDES) :]) == ["/out.log"], tree_excludes(sub)
