"""Loading host kernels into a process whose address space is fragmented.

A host kernel's code reaches its constants (LLVM's constant pools, ``.rodata``) by 32-bit
PC-relative offsets. MCJIT's loader mapped each section apart, so in a long-lived process with large
mappings around (a GPU driver's, a model's) the code and its constants could land more than 2 GB
apart, and the loader then aborted the whole process on an assertion (``poot check`` on an H100 did).
``HostKernel`` links objects with JITLink, which places an object's sections in one block. This
test builds the layout that made the old loader abort (one-page holes 3 GB apart, every other gap
filled) in a child process, loads a kernel there and runs it against numpy.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
    reason="the layout is built from /proc/self/maps and mmap flags as Linux on x86-64 and AArch64 number them",
)

CHILD = textwrap.dedent(
    """
    import ctypes, mmap, sys
    import numpy as np
    from poot.backend import HostKernel, compile_kernel, host_target
    from poot.kernel.library.norms import rms_norm
    from poot.testing.kernels import poisoned

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    PRIVATE_ANON, NORESERVE, FIXED_NOREPLACE, PAGE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, 0x4000, 0x100000, mmap.PAGESIZE
    FAILED = ctypes.c_void_p(-1).value

    kern = rms_norm.instantiate(BLOCK=128)
    art = compile_kernel(kern, host_target())

    def fill_gaps():
        # every gap between the mappings of the mmap area reserved (no memory: PROT_NONE, NORESERVE)
        spans = []
        for line in open("/proc/self/maps"):
            f = line.split()
            if len(f) > 5 and f[5].startswith("[") and f[5] != "[heap]":
                continue
            a, b = (int(v, 16) for v in f[0].split("-"))
            if a >= 1 << 46:
                spans.append((a, b))
        filled = 0
        for (_, a1), (b0, _) in zip(spans, spans[1:]):
            if b0 > a1:
                filled += libc.mmap(a1, b0 - a1, 0, PRIVATE_ANON | NORESERVE | FIXED_NOREPLACE, -1, 0) == a1
        return filled

    holes, filled = [], 0
    for _ in range(3):  # a page, then 3 GB reserved below it, top-down
        holes.append(libc.mmap(None, PAGE, 3, PRIVATE_ANON, -1, 0))
        if libc.mmap(None, 3 << 30, 0, PRIVATE_ANON | NORESERVE, -1, 0) in (None, FAILED):
            holes.append(None)
        filled += fill_gaps()
    # the layout needs mmap's top-down placement, which e.g. an unlimited stack turns off
    if None in holes or FAILED in holes or not filled or min(abs(a - b) for a, b in zip(holes, holes[1:])) < 3 << 30:
        print("skip: the address space could not be laid out (holes", [hex(h or 0) for h in holes], "gaps filled", filled, ")")
        sys.exit(0)
    for h in holes:
        libc.munmap(h, PAGE)
    hk = HostKernel(kern, art)

    rng = np.random.default_rng(int(sys.argv[1]))
    rows, cols = 5, 300
    x = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.5, 4, (rows, 1)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    y = poisoned((rows, cols))
    hk.run((rows,), {"x": x, "w": w, "y": y}, {"cols": cols, "eps": 1e-5})
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    print("ok")
    """
)


def test_a_kernel_loads_and_runs_where_free_pages_lie_gigabytes_apart(rng):
    r = subprocess.run([sys.executable, "-c", CHILD, str(int(rng.integers(1 << 31)))], capture_output=True, text=True, timeout=300)
    if r.returncode == 0 and r.stdout.startswith("skip:"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"exit {r.returncode}: {r.stderr[-2000:]}"
