"""The kernel runner of ``null:xdna2``: a kernel test's kernel in the looped form an AIE core runs
(``grid_to_loops``), compiled for the host and run there over the test's whole grid, so the kernel
suites check the looped form against the CPU oracle with the suites' own assertions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from poot.backend import HostKernel, Kernel, compile_kernel, grid_to_loops, group_range, host_target

__all__ = ["run_looped"]


def run_looped(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
    looped = grid_to_loops(k)
    HostKernel(looped, compile_kernel(looped, host_target())).run((1,), buffers, {**scalars, **group_range(tuple(grid))})
