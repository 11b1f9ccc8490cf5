"""The example backend: a device whose kernels compile for a target of the plugin's own
(``host:x86-64-v3``, the generic AVX2 level, not the host's own CPU model) and run in-process.
Only the backend SDK is used."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from poot.backend import Capabilities, Device, HostKernel, Kernel, Target, compile_kernel, host_target


@cache
def baseline_target() -> Target:
    """x86-64-v3 (AVX2, FMA, F16C) with generic tuning where the host runs it: a target other than
    the host's own (its model's tuning and extra features); elsewhere the host's target as is."""
    base = host_target()
    if base.triple.startswith("x86_64") and all(f"+{f}" in base.features.split(",") for f in ("avx2", "fma", "f16c")):
        return dataclasses.replace(base, cpu="x86-64-v3", features="")
    return base


def devices() -> list[Device]:
    caps = Capabilities(
        dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"}),
        compute_units=1,
        max_workgroup_size=1024,
        shared_memory_bytes=256 * 1024,
        subgroup_size=1,
        memory_bytes=1 << 30,
        details=(("llvm cpu", baseline_target().cpu),),
    )
    return [Device("excpu", 0, "example CPU target (x86-64-v3)", target="host", capabilities=caps)]


def kernel_runner() -> Any:
    compiled: dict[str, HostKernel] = {}

    def run(kernel: Kernel, grid: Sequence[int], buffers: Mapping[str, Any], scalars: Mapping[str, Any] | None = None) -> None:
        key = repr(kernel)
        if key not in compiled:
            compiled[key] = HostKernel(kernel, compile_kernel(kernel, baseline_target()))
        compiled[key].run(grid, buffers, scalars or {})

    return run
