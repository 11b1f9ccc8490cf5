"""NVIDIA's PTX assembler (ptxas) where no GPU is: the kernel runner of the compile-only devices
(``null:sm_80``, ``null:sm_90a``), which compiles a kernel test's kernel to PTX for the
architecture, assembles it, checks what a launch would refuse and raises ``Assembled``; and
``ptxas_usage`` for tests that read a kernel's registers and spills."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from poot.backend import Assembled, Buffer, Kernel, compile_kernel, shared_layout, target
from poot.errors import DeviceUnavailable

__all__ = ["find_ptxas", "ptxas_usage", "assembler", "OPT_IN_SHARED", "NO_PTXAS"]

# dynamic workgroup memory a workgroup may have on each architecture's GPUs (the opt-in maximum:
# A100's 163 KiB, H100/H200's 227 KiB)
OPT_IN_SHARED = {"sm_80": 166912, "sm_90a": 232448}
NO_PTXAS = "no ptxas here (pip install nvidia-cuda-nvcc-cu12, or the CUDA toolkit)"


def find_ptxas() -> str | None:
    """NVIDIA's PTX assembler, for checks of the PTX that codegen emits where no GPU is (registers,
    spills, PTX the driver would refuse): the CUDA toolkit's on PATH, else the one in PyPI's
    ``nvidia-cuda-nvcc-cu12`` where that is installed; None where neither is."""
    path = shutil.which("ptxas")
    if path:
        return path
    try:
        import nvidia.cuda_nvcc as nvcc  # type: ignore[import-not-found]
    except ImportError:
        return None
    for base in getattr(nvcc, "__path__", []):
        exe = os.path.join(base, "bin", "ptxas")
        if os.access(exe, os.X_OK):
            return exe
    return None


def ptxas_usage(ptx: bytes, arch: str) -> tuple[int, int, str]:
    """``ptx`` assembled by ``find_ptxas()`` for ``arch`` (sm_90a, say): (registers a thread, bytes of
    spill stores and loads, ptxas's report); AssertionError with its message where it refuses it."""
    exe = find_ptxas()
    assert exe is not None, NO_PTXAS
    r = subprocess.run([exe, f"-arch={arch}", "-v", "-o", os.devnull, "-"], input=ptx, capture_output=True)
    out = r.stderr.decode(errors="replace")
    assert r.returncode == 0, f"ptxas refused the PTX for {arch}: {out}"
    regs = int(re.search(r"Used (\d+) registers", out).group(1))  # type: ignore[union-attr]
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    return regs, spills, out


def assembler(arch: str) -> Callable[..., None]:
    """The kernel runner of ``null:ARCH``: compiles a kernel for ``nvptx:ARCH``, assembles it with
    ptxas, checks what a launch would refuse (registers times threads past the SM's 65,536,
    workgroup memory past the opt-in maximum) and raises ``Assembled``, which ends the case as
    passed. ``DeviceUnavailable`` where ptxas is not installed."""
    if find_ptxas() is None:
        raise DeviceUnavailable(NO_PTXAS)
    tgt = target(f"nvptx:{arch}")

    def run(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
        missing = [p.name for p in k.params if not isinstance(p, Buffer) and p.name not in scalars]
        assert not missing, f"kernel {k.name}: no value for scalars {missing}"
        regs, spills, _ = ptxas_usage(compile_kernel(k, tgt).data, arch)
        assert regs * k.threads <= 65536, f"{k.name}: {regs} registers a thread x {k.threads} threads exceed an SM's 65,536"
        dynamic = shared_layout(k, tgt)[1]
        assert dynamic <= OPT_IN_SHARED[arch], f"{k.name}: {dynamic} bytes of workgroup memory, more than {arch} gives a workgroup"
        raise Assembled(f"{k.name} assembled for {arch}: {regs} registers, {spills} bytes spilled")

    return run
