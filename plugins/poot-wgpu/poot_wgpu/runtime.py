"""WebGPU compute on wgpu-py: a device with the adapter's own limits (WebGPU's defaults are too small
for poot's kernels: eight storage buffers a stage, 16 KiB of workgroup memory), and one compute
pipeline per kernel from codegen's SPIR-V, which naga translates (``spirv.for_wgpu`` drops the
``Aligned`` operands naga rejects). Bind-group layouts are explicit, so a buffer a kernel never
touches keeps its binding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from poot.backend import SPIRV_ENTRY as ENTRY
from poot.backend import SPIRV_SCALARS as SCALARS
from poot.backend import Kernel, compile_kernel, spirv_target
from poot.backend import spirv_bindings as bindings
from poot.backend import spirv_for_wgpu as for_wgpu
from poot.backend import spirv_scalar_words as scalar_words
from poot.errors import DeviceUnavailable, Refusal

from .device import COMPUTE_BACKENDS, _quiet_stderr, _restrict_backends
from .subgroups import FEATURE, subgroup_width

__all__ = ["WgpuDevice", "WgpuPipeline", "kernel_runner"]

_LIMITS = (
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroups-per-dimension",
    "max-bind-groups",
    "max-bindings-per-bind-group",
)


class WgpuDevice:
    """Adapter ``index`` (as ``wgpu_devices`` lists them) and a device holding its limits."""

    def __init__(self, index: int = 0) -> None:
        try:
            import wgpu
        except ImportError as e:
            raise DeviceUnavailable(f"wgpu:{index}: wgpu is not importable ({e}); pip install wgpu") from None
        self.wgpu = wgpu
        _restrict_backends()
        with _quiet_stderr():
            adapters = [a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("backend_type") in COMPUTE_BACKENDS]
        if not 0 <= index < len(adapters):
            raise DeviceUnavailable(f"wgpu:{index}: wgpu lists {len(adapters)} compute adapter(s)")
        self.adapter = adapters[index]
        self.index = index
        self.name = str(self.adapter.info.get("device") or self.adapter.info.get("description"))
        want = {k: self.adapter.limits[k] for k in _LIMITS if k in self.adapter.limits}
        # (not 'shader-int64': kernels whose SPIR-V holds 64-bit integers stay refused; with it,
        # lavapipe's LLVM aborted the process compiling what naga made of them)
        self.subgroup = subgroup_width(self.adapter)  # codegen.spirv_target's width (1: no subgroup operations)
        features = ([FEATURE] if self.subgroup > 1 else []) + (["timestamp-query"] if "timestamp-query" in self.adapter.features else [])
        self.device = self.adapter.request_device_sync(required_limits=want, required_features=features)
        self.limits = self.device.limits
        self.queue = self.device.queue

    def buffer(self, data: np.ndarray | None = None, nbytes: int = 0) -> Any:
        """A storage buffer of whole 32-bit words (copyable both ways) holding ``data`` or zeros."""
        wgpu = self.wgpu
        size = data.nbytes if data is not None else nbytes
        buf = self.device.create_buffer(
            size=max(16, (size + 3) // 4 * 4), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        )
        if data is not None and data.nbytes:
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            if raw.nbytes % 4:
                raw = np.concatenate([raw, np.zeros(4 - raw.nbytes % 4, np.uint8)])
            self.queue.write_buffer(buf, 0, raw)
        return buf

    def read(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        """``nbytes`` of ``buf`` from ``offset`` (whole words are copied), as bytes."""
        lo, hi = offset // 4 * 4, -(-(offset + nbytes) // 4) * 4
        data = np.frombuffer(self.queue.read_buffer(buf, lo, hi - lo), np.uint8)
        return data[offset - lo : offset - lo + nbytes]


class WgpuPipeline:
    """A compute pipeline for one kernel, with an explicit bind-group layout."""

    def __init__(self, dev: WgpuDevice, kernel: Kernel) -> None:
        wgpu = dev.wgpu
        self.kernel, self.bindings = kernel, bindings(kernel)
        code = for_wgpu(compile_kernel(kernel, spirv_target(dev.subgroup)).data)
        # codegen's SPIR-V declares every buffer read-write (no NonWritable decoration), which naga keeps
        entries = [
            {"binding": b, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.storage}}
            for b, _name, _t, _writable in self.bindings
        ]
        self.layout = dev.device.create_bind_group_layout(entries=entries)
        try:
            module = dev.device.create_shader_module(code=code)
            self.pipeline = dev.device.create_compute_pipeline(
                layout=dev.device.create_pipeline_layout(bind_group_layouts=[self.layout]), compute={"module": module, "entry_point": ENTRY}
            )
        except dev.wgpu.GPUError as e:  # naga or the pipeline refused the module: say which kernel and why
            reason = " ".join(str(e).split())[-300:]
            raise Refusal(f"kernel {kernel.name}", f"wgpu:{dev.index}", f"WebGPU did not take its SPIR-V: {reason}") from None

    def bind_group(self, dev: WgpuDevice, resources: Sequence[tuple[Any, int, int]]) -> Any:
        """A bind group from (buffer, offset, size) per binding, in binding order."""
        return dev.device.create_bind_group(
            layout=self.layout, entries=[{"binding": i, "resource": {"buffer": b, "offset": o, "size": s}} for i, (b, o, s) in enumerate(resources)]
        )


def kernel_runner(device: WgpuDevice):  # type: ignore[no-untyped-def]
    """``run(kernel, grid, buffers, scalars)`` on ``device`` for the kernel tests: every array uploaded,
    the writable ones read back into the given arrays."""
    pipes: dict[str, WgpuPipeline] = {}

    def run(k: Kernel, grid, buffers: Mapping[str, np.ndarray], scalars) -> None:  # type: ignore[no-untyped-def]
        pipe = pipes.get(repr(k))
        if pipe is None:
            pipe = pipes[repr(k)] = WgpuPipeline(device, k)
        bufs, res = {}, []
        for _b, name, _t, _w in pipe.bindings:
            data = scalar_words(k, dict(scalars)) if name == SCALARS else np.ascontiguousarray(buffers[name])
            bufs[name] = device.buffer(data)
            res.append((bufs[name], 0, bufs[name].size))
        enc = device.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipe.pipeline)
        cpass.set_bind_group(0, pipe.bind_group(device, res))
        g3 = (tuple(int(x) for x in grid) + (1, 1, 1))[:3]
        cpass.dispatch_workgroups(*g3)
        cpass.end()
        device.queue.submit([enc.finish()])
        for _b, name, _t, writable in pipe.bindings:
            if writable:
                a = buffers[name]
                a.reshape(-1).view(np.uint8)[:] = device.read(bufs[name], 0, a.nbytes)

    return run
