"""Single kernels for the kernel tests (``poot_kernel_runner``): on an AMD GPU, one dispatch packet
through the executor's own path (code object, kernarg memory, AQL queue, completion signal); on a
compile-only AMD device (``null:gfx942``, ``null:gfx1100``), the kernel compiled and linked into a
code object whose metadata is read back and checked against what a dispatch needs, ending the case
with ``Assembled``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from poot.backend import Assembled, Buffer, Device, Kernel, compile_kernel, shared_layout
from poot.errors import PootError

from .aql import FENCE_SCOPE_SYSTEM, encode
from .code_object import dispatch, kernargs, read_code_object
from .targets import TARGETS

__all__ = ["linker", "run_rocm"]

VGPRS = {"gfx90a": 512, "gfx942": 512, "gfx1100": 1536, "gfx1151": 1536, "gfx1201": 1536}  # vector registers a SIMD lane has (wave64 on CDNA, wave32 on RDNA 3)


def linker(arch: str) -> Callable[..., None]:
    """The kernel runner of ``null:ARCH``: the kernel compiled for ``amdgcn:ARCH`` and linked by
    ld.lld; its code object's metadata must name the kernel's parameters in order, in a kernarg
    segment that packs them, its workgroup memory must fit the 64 KiB a workgroup may have, and its
    registers the workgroup's waves (CompileError where ld.lld is missing)."""
    tgt = TARGETS[f"amdgcn:{arch}"]

    def run(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
        missing = [p.name for p in k.params if not isinstance(p, Buffer) and p.name not in scalars]
        assert not missing, f"kernel {k.name}: no value for scalars {missing}"
        info = read_code_object(compile_kernel(k, tgt).data, k.name)[k.name]
        assert [a.name for a in info.args] == [p.name for p in k.params], f"{k.name}: metadata arguments {[a.name for a in info.args]}"
        assert info.kernarg_size >= max((a.offset + a.size for a in info.args), default=0)
        assert shared_layout(k, tgt) == ({}, 0), f"{k.name}: workgroup arrays in dynamic memory, which a dispatch here does not size"
        assert info.group_bytes >= sum(s.size * max(1, s.dtype.bits // 8) for s in k.shared), f"{k.name}: LDS smaller than its workgroup arrays"
        assert info.group_bytes <= 64 * 1024, f"{k.name}: {info.group_bytes} bytes of LDS, more than a workgroup has"
        assert info.wavefront == tgt.subgroup, f"{k.name}: wave{info.wavefront}, the target's is wave{tgt.subgroup}"
        assert k.threads <= info.max_workgroup, f"{k.name}: {k.threads} threads, the code object allows {info.max_workgroup}"
        waves_per_simd = -(-k.threads // (info.wavefront * 4))  # a workgroup's waves spread over the CU's 4 SIMDs (2 on RDNA's WGP halves: the same bound)
        assert info.vgprs * waves_per_simd <= VGPRS[arch], f"{k.name}: {info.vgprs} VGPRs x {waves_per_simd} waves a SIMD exceed {VGPRS[arch]}"
        raise Assembled(f"{k.name} linked for {arch}: {info.vgprs} VGPRs, {info.sgprs} SGPRs, {info.group_bytes} bytes of LDS")

    return run


def run_rocm(device: Device) -> Callable[..., None]:
    """The kernel runner of ``rocm:N``: each call loads the kernel (once), copies the buffers to the
    GPU, dispatches one packet over ``grid`` workgroups, waits for its completion signal and copies
    every written buffer back."""
    from .runtime import HsaAgent

    agent = HsaAgent(int(device.index))  # type: ignore[arg-type]
    tgt = TARGETS[f"amdgcn:{agent.arch}"]
    ring = agent.queue(64)
    loaded: dict[str, tuple[Any, int]] = {}

    def run(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
        key = repr(k)
        if key not in loaded:
            data = compile_kernel(k, tgt).data
            loaded[key] = (read_code_object(data, k.name)[k.name], agent.load(data, k))
        info, kobj = loaded[key]
        ptrs: dict[str, int] = {}
        try:
            for p in k.params:
                if isinstance(p, Buffer):
                    a = np.ascontiguousarray(buffers[p.name])
                    ptrs[p.name] = agent.alloc(max(a.nbytes, 4))
                    agent.upload(ptrs[p.name], a)
            args = kernargs(info, k, ptrs, scalars)
            block, view = agent.kernarg(max(len(args), 16))
            view[: len(args)] = np.frombuffer(args, np.uint8)
            signal = agent.signal(1)
            p = dispatch(info, k.threads, tuple(grid), kobj, block)
            ring.publish([encode(replace(p, completion_signal=signal, acquire=FENCE_SCOPE_SYSTEM, release=FENCE_SCOPE_SYSTEM))])
            agent.wait(signal, 60.0)
            agent.destroy_signal(signal)
            agent.free_kernarg(block)
            for q in k.params:
                if isinstance(q, Buffer) and not q.readonly:
                    out = buffers[q.name]
                    if not out.flags.c_contiguous:
                        raise PootError(f"kernel {k.name}: written buffer '{q.name}' must be C-contiguous")
                    agent.download(ptrs[q.name], out)
        finally:
            for ptr in ptrs.values():
                agent.free(ptr)

    return run
