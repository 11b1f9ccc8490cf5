"""Running kernels on the host target in tests: compile (cached on disk), load, run a grid, with
outputs poisoned first so that an element a kernel never wrote shows up as NaN (or a sentinel)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..codegen import compile_kernel, host_target
from ..codegen.host_jit import HostKernel
from ..kernel.ir import Buffer, Kernel

__all__ = ["run_host", "poisoned"]

_LOADED: dict[str, HostKernel] = {}


def poisoned(shape: Sequence[int], dtype: type = np.float32) -> np.ndarray:
    """An output buffer filled with NaN (floats) or a sentinel (ints): unwritten elements stay so."""
    if np.dtype(dtype).kind == "f":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype)


def run_host(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, float | int] | None = None, threads: int = 2) -> None:
    key = repr(k)
    hk = _LOADED.get(key)
    if hk is None:
        hk = _LOADED[key] = HostKernel(k, compile_kernel(k, host_target()))
    missing = [p.name for p in k.params if isinstance(p, Buffer) and p.name not in buffers]
    if missing:
        raise KeyError(f"kernel {k.name}: no array for buffers {missing}")
    hk.run(grid, buffers, scalars, threads=threads)
