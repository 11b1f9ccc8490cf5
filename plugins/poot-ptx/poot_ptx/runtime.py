"""The CUDA runtime poot uses, on cuda-python's driver API: a device's primary context, device
buffers, PTX modules loaded once per kernel, and launches. Every failing call becomes a
``CudaCallError`` naming the call and the CUDA error."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from poot.backend import Buffer, Device, Kernel, compile_kernel, shared_layout
from poot.backend import dtypes as dt
from poot.errors import PootError, Refusal

from .device import CudaCallError, _check
from .targets import TARGETS

__all__ = ["CudaContext", "CudaKernel", "run_cuda", "target_for"]

_SCALAR = {"f32": ctypes.c_float, "f64": ctypes.c_double, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "i8": ctypes.c_int8}


def target_for(device: Device) -> str:
    """The codegen target of a CUDA device: its own sm_XY when poot has one, else the nearest below;
    sm_90a (Hopper's own instructions, wgmma among them) for compute capability 9.0 exactly, the only
    one that runs its code."""
    arch = dict(device.capabilities.details).get("arch", "sm_80") if device.capabilities else "sm_80"
    cc = int(arch.removeprefix("sm_").rstrip("a"))
    if cc == 90:
        return "nvptx:sm_90a"
    for t in ("nvptx:sm_90", "nvptx:sm_80"):
        if cc >= int(t.split("_")[-1]):
            return t
    raise PootError(f"{device.name}: compute capability {arch} is below what poot targets (sm_80)")


class CudaContext:
    """The primary context of one device, made current on the calling thread."""

    def __init__(self, index: int) -> None:
        from cuda.bindings import driver

        self.driver = driver
        _check(driver, "cuInit", driver.cuInit(0))
        self.device = _check(driver, "cuDeviceGet", driver.cuDeviceGet(index))
        self.context = _check(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(self.device))
        self.make_current()

    def make_current(self) -> None:
        _check(self.driver, "cuCtxSetCurrent", self.driver.cuCtxSetCurrent(self.context))

    def alloc(self, nbytes: int) -> int:
        return int(_check(self.driver, "cuMemAlloc", self.driver.cuMemAlloc(max(1, nbytes))))

    def free(self, ptr: int) -> None:
        _check(self.driver, "cuMemFree", self.driver.cuMemFree(ptr))

    def upload(self, ptr: int, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        if a.nbytes:
            _check(self.driver, "cuMemcpyHtoD", self.driver.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))

    def download(self, ptr: int, a: np.ndarray) -> None:
        if a.nbytes:
            _check(self.driver, "cuMemcpyDtoH", self.driver.cuMemcpyDtoH(a.ctypes.data, ptr, a.nbytes))

    def synchronize(self) -> None:
        _check(self.driver, "cuCtxSynchronize", self.driver.cuCtxSynchronize())


class CudaKernel:
    """A kernel compiled to PTX for ``target`` and loaded into the current context."""

    def __init__(self, ctx: CudaContext, kernel: Kernel, target: str) -> None:
        self.ctx, self.kernel = ctx, kernel
        art = compile_kernel(kernel, TARGETS[target])
        d = ctx.driver
        self.module = _check(d, "cuModuleLoadData", d.cuModuleLoadData(art.data + b"\0"))
        self.function = _check(d, "cuModuleGetFunction", d.cuModuleGetFunction(self.module, kernel.name.encode()))
        attr = d.CUfunction_attribute
        most = _check(d, "cuFuncGetAttribute", d.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.function))
        if kernel.threads > most:  # registers a thread times threads a workgroup exceed the SM's: refused here, not at launch
            regs = _check(d, "cuFuncGetAttribute", d.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function))
            _check(d, "cuModuleUnload", d.cuModuleUnload(self.module))
            raise Refusal(
                kernel.name,
                target,
                f"compiled to {regs} registers a thread, it runs at most {most} threads a workgroup, "
                f"not the {kernel.threads} its schedule asks; pick a schedule with fewer threads",
            )
        # workgroup memory past what PTX declares statically: asked for at each launch, allowed once here
        self.dynamic_shared = shared_layout(kernel, TARGETS[target])[1]
        if self.dynamic_shared:
            try:
                _check(d, "cuFuncSetAttribute", d.cuFuncSetAttribute(self.function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.dynamic_shared))
            except CudaCallError as e:
                _check(d, "cuModuleUnload", d.cuModuleUnload(self.module))
                raise Refusal(
                    kernel.name,
                    target,
                    f"{self.dynamic_shared} bytes of workgroup memory are more than the device gives a workgroup ({e}); "
                    "pick a schedule with fewer stages or narrower tiles",
                ) from None

    def args(self, pointers: Mapping[str, int], scalars: Mapping[str, float | int]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        vals, types = [], []
        for p in self.kernel.params:
            if isinstance(p, Buffer):
                vals.append(pointers[p.name])
                types.append(ctypes.c_void_p)
            else:
                vals.append(scalars[p.name])
                types.append(_SCALAR[p.dtype.name])
        return tuple(vals), tuple(types)

    def launch(self, grid: Sequence[int], pointers: Mapping[str, int], scalars: Mapping[str, float | int], stream: Any = 0, programmatic: bool = False) -> bool:
        """Queue the kernel on ``stream`` (False when the grid is empty: nothing queued). With
        ``programmatic`` (sm_90+) it may start while the kernel queued before it on the stream still
        runs: its ``AwaitPrior`` (at its entry unless it places one) holds it until that one is done."""
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        if gx * gy * gz == 0:
            return False
        bx, by, bz = self.kernel.workgroup
        d = self.ctx.driver
        if not programmatic:
            _check(d, "cuLaunchKernel", d.cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz, self.dynamic_shared, stream, self.args(pointers, scalars), 0))
            return True
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = gx, gy, gz, bx, by, bz
        cfg.sharedMemBytes, cfg.hStream = self.dynamic_shared, stream
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs, cfg.numAttrs = [attr], 1
        _check(d, "cuLaunchKernelEx", d.cuLaunchKernelEx(cfg, self.function, self.args(pointers, scalars), 0))
        return True


class _Runner:
    """Runs single kernels with numpy arrays in and out (the kernel tests' device runner)."""

    def __init__(self, device: Device) -> None:
        if not isinstance(device.index, int):
            raise PootError(f"{device.name} is not a CUDA device with an index")
        self.ctx = CudaContext(device.index)
        self.target = target_for(device)
        self._kernels: dict[str, CudaKernel] = {}

    def __call__(self, k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> None:
        self.ctx.make_current()
        key = repr(k)
        ck = self._kernels.get(key) or self._kernels.setdefault(key, CudaKernel(self.ctx, k, self.target))
        ptrs: dict[str, int] = {}
        try:
            for p in k.params:
                if isinstance(p, Buffer):
                    a = buffers[p.name]
                    want = np.dtype(np.uint8 if p.dtype == dt.boolean else p.dtype.numpy if p.dtype != dt.bf16 else np.uint16)
                    if a.dtype != want or not a.flags.c_contiguous:
                        raise PootError(f"kernel {k.name}: buffer '{p.name}' must be a C-contiguous {want} array, got {a.dtype}")
                    ptrs[p.name] = self.ctx.alloc(a.nbytes)
                    self.ctx.upload(ptrs[p.name], a)
            ck.launch(grid, ptrs, scalars)
            self.ctx.synchronize()
            for p in k.params:
                if isinstance(p, Buffer) and not p.readonly:
                    self.ctx.download(ptrs[p.name], buffers[p.name])
        finally:
            for ptr in ptrs.values():
                try:
                    self.ctx.free(ptr)
                except CudaCallError:
                    pass


def run_cuda(device: Device) -> _Runner:
    return _Runner(device)
