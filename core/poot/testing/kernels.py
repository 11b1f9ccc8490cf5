"""Running kernels on the host target in tests: compile (cached on disk), load, run a grid, with
outputs poisoned first so that an element a kernel never wrote shows up as NaN (or a sentinel)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from ..codegen import compile_kernel, host_target
from ..codegen.host_jit import HostKernel
from ..kernel.ir import Buffer, Kernel

__all__ = ["run_host", "poisoned", "kernel_suites_on"]

_LOADED: dict[str, HostKernel] = {}
_RUNNERS: dict[str, object] = {}


def poisoned(shape: Sequence[int], dtype: type = np.float32) -> np.ndarray:
    """An output buffer filled with NaN (floats) or a sentinel (ints): unwritten elements stay so."""
    if np.dtype(dtype).kind == "f":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype)


def _device_runner():  # type: ignore[no-untyped-def]
    """The runner of ``POOT_TEST_DEVICE`` (a device name), from the plugin that owns it."""
    name = os.environ.get("POOT_TEST_DEVICE")
    if not name or name == "cpu":
        return None
    if name not in _RUNNERS:
        from ..plugins import host
        from ..runtime import get_device

        dev = get_device(name)
        if not dev.available():
            raise RuntimeError(f"POOT_TEST_DEVICE={name}: {dev.available()}")
        runner = host().hook.poot_kernel_runner(device=dev)
        if runner is None:
            raise RuntimeError(f"POOT_TEST_DEVICE={name}: no installed plugin runs single kernels there")
        _RUNNERS[name] = runner
    return _RUNNERS[name]


def run_host(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, float | int] | None = None, threads: int = 2) -> None:
    """Run ``k`` on the host, or on ``POOT_TEST_DEVICE`` when that names another device."""
    runner = _device_runner()
    if runner is not None:
        missing = [p.name for p in k.params if isinstance(p, Buffer) and p.name not in buffers]
        if missing:
            raise KeyError(f"kernel {k.name}: no array for buffers {missing}")
        runner(k, grid, buffers, scalars or {})
        return
    key = repr(k)
    hk = _LOADED.get(key)
    if hk is None:
        hk = _LOADED[key] = HostKernel(k, compile_kernel(k, host_target()))
    missing = [p.name for p in k.params if isinstance(p, Buffer) and p.name not in buffers]
    if missing:
        raise KeyError(f"kernel {k.name}: no array for buffers {missing}")
    hk.run(grid, buffers, scalars, threads=threads)


KERNEL_SUITES = ("tests/test_kernels_host.py", "tests/test_kernels_host_schedules.py")


def kernel_suites_on(device: str, root: str | os.PathLike) -> tuple[int, int, str]:
    """Run the kernel test suites of the source tree at ``root`` with ``POOT_TEST_DEVICE=device`` in a
    fresh interpreter: (passed, skipped, the output's tail). A failure raises AssertionError with the tail."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib -ra",
                        *(os.path.join(root, s) for s in KERNEL_SUITES)],
                       env={**os.environ, "POOT_TEST_DEVICE": device}, cwd=root, capture_output=True, text=True, timeout=2400)
    tail = r.stdout[-4000:]
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    assert r.returncode == 0 and "failed" not in summary, tail
    passed = re.search(r"(\d+) passed", summary)
    skipped = re.search(r"(\d+) skipped", summary)
    return int(passed.group(1)) if passed else 0, int(skipped.group(1)) if skipped else 0, tail
