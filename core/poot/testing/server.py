"""`poot serve` as a real process on loopback, for the server's tests and benchmarks."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import httpx

__all__ = ["free_port", "start_server", "stop_server", "metrics", "wait_idle", "ServerFailed"]


class ServerFailed(RuntimeError):
    """The server did not come up; the message holds the end of its output."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str = "SmolLM2", *flags: str, context: int = 1024, timeout: float = 300) -> tuple[subprocess.Popen, str]:
    """Start ``poot serve model`` on a free port and wait until ``/health`` answers 200; returns the
    process and the base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "poot.cli", "serve", model, "--port", str(port), "--context", str(context), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            out = proc.stdout.read() if proc.stdout else ""
            raise ServerFailed(f"the server did not come up:\n{out[-3000:]}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, as a service manager stops it; killed only if it has not stopped in 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def metrics(base: str) -> dict[str, float]:
    """The server's Prometheus gauges and counters named ``poot_*``."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(poot_[a-z_]+) ([0-9.e+-]+)$", text, re.M)}


def wait_idle(base: str, timeout: float = 30) -> dict[str, float]:
    """Wait until no KV block is held, nothing runs and nothing is queued; returns the metrics, or
    raises ``AssertionError`` with them if that does not happen within ``timeout`` seconds."""
    deadline = time.time() + timeout
    while True:
        m = metrics(base)
        if m["poot_kv_blocks_used"] == 0 and m["poot_running_sequences"] == 0 and m["poot_queue_depth"] == 0:
            return m
        if time.time() > deadline:
            raise AssertionError(f"the server is not idle after {timeout} s: {m}")
        time.sleep(0.2)
