"""The WebGPU executor: a plan's kernels as compute pipelines (codegen's SPIR-V through naga), weights,
constants and KV pools in storage buffers bound once, and each captured step a list of (pipeline,
bind group, grid) made once. WebGPU command buffers are single-use, so ``replay`` encodes that list
into one compute pass and submits it: the per-step Python work is three calls a launch, with every
bind group, pipeline and grid already made. Small outputs (tokens, log-probabilities: up to
``EAGER_READBACK`` bytes) are copied by the step's own encoder into mappable buffers made at capture,
so reading them is one map; larger ones (logits) are copied back when read. Encoding a step's few
hundred dispatches costs milliseconds of Python and wgpu work, and a command buffer does not depend
on the inputs (they are written to their buffers before it is submitted): so after each submit the
step's next command buffer is encoded while the GPU runs this one. Values are bound at their storage's offset, so the
arena's slots are aligned to the adapter's ``min-storage-buffer-offset-alignment``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poot.backend import (
    EAGER_READBACK,
    Executor,
    Kernel,
    Plan,
    StoragePlan,
    checked_pool,
    checked_weight,
    compile_kernels,
    compile_progress,
    computed_outputs,
    get_device,
    plan_storage,
    require_pools,
    scalar_block,
    spirv_target,
    storage_dtype,
    value_region,
)
from poot.backend import SPIRV_SCALARS as SCALARS
from poot.backend import spirv_scalar_words as scalar_words
from poot.errors import PootError

from .runtime import WgpuDevice, WgpuPipeline

__all__ = ["WgpuExecutor"]

Key = tuple[int, int]


@dataclass
class WgpuStep:
    storage: StoragePlan
    inputs: dict[str, tuple[Any, np.dtype, tuple[int, ...]]]
    outputs: dict[str, tuple[Any, int, np.dtype, tuple[int, ...]]]  # buffer, byte offset, dtype, shape
    dispatches: list[tuple[Any, Any, tuple[int, int, int]]]  # pipeline, bind group, grid
    launches: int
    binding: int
    names: list[str] = field(default_factory=list)
    owned: list[Any] = field(default_factory=list)
    copies: list[tuple[Any, int, Any, int]] = field(default_factory=list)  # source, offset, mappable buffer, bytes
    ready: Any = None  # the next replay's command buffer, encoded after the last submit


class WgpuExecutor(Executor):
    def __init__(self, plan: Plan, threads: int | None = None, progress: bool = False) -> None:
        super().__init__(plan)
        device = get_device(plan.device)
        if device.kind != "wgpu" or not isinstance(device.index, int):
            raise PootError(f"the WebGPU executor runs plans made for a wgpu device, not {plan.device}")
        self.dev = WgpuDevice(device.index)
        self.align = max(64, int(self.dev.limits["min-storage-buffer-offset-alignment"]))
        self.max_binding = int(self.dev.limits["max-storage-buffer-binding-size"])

        self._pipes: dict[int, WgpuPipeline] = {}
        by_value: dict[str, list[Kernel]] = {}
        for launch in plan.launches:
            by_value.setdefault(repr(launch.kernel), []).append(launch.kernel)
        # compiled side by side first (the pipelines then find them in the cache)
        compile_kernels([ks[0] for ks in by_value.values()], spirv_target(self.dev.subgroup), progress)
        for ks in compile_progress(by_value.values(), progress, len(by_value)):
            pipe = WgpuPipeline(self.dev, ks[0])
            for k in ks:
                self._pipes[id(k)] = pipe
        g = plan.graph
        self._fixed: dict[int, Any] = {}
        self._keep: list[np.ndarray] = []
        self._consts: dict[Key, Any] = {
            (n.id, 0): self._buffer(n.attrs["value"].array.astype(storage_dtype(n.attrs["dtype"]))) for n in g.nodes if n.op == "constant"
        }
        self._weight_nodes = {n.attrs["name"]: n for n in g.nodes if n.op == "weight"}
        self._weights: dict[Key, Any] = {}
        self._weight_src: dict[Key, int] = {}
        self._pools: dict[Key, tuple[Any, np.ndarray]] = {}
        self._steps: dict[tuple[tuple[str, int], ...], WgpuStep] = {}
        self._binding = 0

    def _buffer(self, a: np.ndarray | None = None, nbytes: int = 0) -> Any:
        size = a.nbytes if a is not None else nbytes
        if size > self.max_binding:
            raise PootError(f"wgpu:{self.dev.index}: a buffer of {size} bytes exceeds the adapter's max-storage-buffer-binding-size ({self.max_binding})")
        return self.dev.buffer(None if a is None else np.ascontiguousarray(a), nbytes)

    def bind(self, weights: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray] | None = None) -> None:
        for name, n in self._weight_nodes.items():
            if name not in weights:
                raise PootError(f"weight '{name}' is not bound (the plan reads it)")
            key = (n.id, 0)
            if self._weight_src.get(key) == id(weights[name]):
                continue
            a = checked_weight(name, n.outputs[0], weights[name])
            if key in self._weights:
                self._weights[key].destroy()
            self._weights[key] = self._buffer(a)
            self._weight_src[key] = id(weights[name])
            self._binding += 1
        inputs = self.plan.inputs
        for name, a in (pools or {}).items():
            v = inputs[name]
            key = (v.node.id, v.index)
            a = checked_pool(name, v, a)
            if key in self._pools and self._pools[key][1] is a:
                self.dev.queue.write_buffer(self._pools[key][0], 0, a.reshape(-1).view(np.uint8))
                continue
            if key in self._pools:
                self._pools[key][0].destroy()
            self._pools[key] = (self._buffer(a), a)
            self._binding += 1

    def write_pool(self, name: str, index: int, values: np.ndarray) -> None:
        v = self.plan.inputs[name]
        entry = self._pools.get((v.node.id, v.index))
        if entry is None:
            raise PootError(f"pool '{name}' is not bound")
        buf, host = entry
        host[index] = np.asarray(values, dtype=host.dtype).reshape(host.shape[1:])
        self.dev.queue.write_buffer(buf, index * host[index].nbytes, np.ascontiguousarray(host[index]).reshape(-1).view(np.uint8))

    def capture(self, env: Mapping[str, int]) -> WgpuStep:
        key = tuple(sorted(env.items()))
        step = self._steps.get(key)
        if step is not None and step.binding == self._binding:
            return step
        if step is not None:
            for b in step.owned:
                b.destroy()
        g = self.plan.graph
        sp = plan_storage(self.plan, env, alignment=self.align)
        values = {(n.id, v.index): v for n in g.nodes for v in n.outputs}
        require_pools(sp, self._pools)
        arena = self._buffer(nbytes=max(sp.arena_bytes, 16))
        owned = [arena]
        by_root: dict[Key, Any] = dict(self._weights)
        by_root.update(self._consts)
        by_root.update({k: b for k, (b, _) in self._pools.items()})
        step_inputs: dict[str, tuple[Any, np.dtype, tuple[int, ...]]] = {}
        for name, k in sp.inputs.items():
            dtype = storage_dtype(values[k].dtype)
            buf = self._buffer(nbytes=max(4, sp.nbytes(k, values[k].dtype)))
            owned.append(buf)
            step_inputs[name] = (buf, dtype, sp.shapes[k])
            by_root[k] = buf

        bound = set(self._weights) | set(self._consts) | set(self._pools)

        def where(ref: Key | np.ndarray) -> tuple[Any, int, int]:
            r = value_region(sp, values, bound, ref)
            if r.kind == "fixed":
                if id(r.array) not in self._fixed:
                    self._keep.append(r.array)  # type: ignore[arg-type]
                    self._fixed[id(r.array)] = self._buffer(r.array)
                buf = self._fixed[id(r.array)]
                return buf, 0, buf.size
            if r.kind == "arena":
                return arena, r.offset, r.nbytes  # type: ignore[return-value]
            return by_root[r.key], 0, by_root[r.key].size  # type: ignore[index]

        block, at = scalar_block([l.kernel for l in sp.launches], [l.scalars(env) for l in sp.launches], scalar_words, self.align)
        scal = self._buffer(block)
        owned.append(scal)
        dispatches = []
        for launch, (off, nbytes) in zip(sp.launches, at):
            pipe = self._pipes[id(launch.kernel)]
            res = [(scal, off, nbytes) if name == SCALARS else where(launch.buffers[name]) for _b, name, _t, _w in pipe.bindings]
            grid = (tuple(int(x) for x in launch.grid(env)) + (1, 1, 1))[:3]
            dispatches.append((pipe.pipeline, pipe.bind_group(self.dev, res), grid))
        outputs: dict[str, tuple[Any, int, np.dtype, tuple[int, ...]]] = {}
        copies: list[tuple[Any, int, Any, int]] = []
        for name, k in computed_outputs(g.outputs, sp, bound).items():
            buf, o, _ = where(k)
            dtype = storage_dtype(values[k].dtype)
            nbytes = int(np.prod(sp.shapes[k], dtype=np.int64)) * dtype.itemsize
            if sp.roots[k] not in self._pools and 0 < nbytes <= EAGER_READBACK and o % 4 == 0:
                size = -(-nbytes // 4) * 4
                back = self.dev.device.create_buffer(size=size, usage=self.dev.wgpu.BufferUsage.MAP_READ | self.dev.wgpu.BufferUsage.COPY_DST)
                owned.append(back)
                copies.append((buf, o, back, size))
                buf, o = back, 0
            outputs[name] = (buf, o, dtype, sp.shapes[k])
        step = WgpuStep(sp, step_inputs, outputs, dispatches, len(sp.launches), self._binding, [l.label or l.kernel.name for l in sp.launches], owned, copies)
        self._steps[key] = step
        return step

    def replay(self, step: WgpuStep, inputs: Mapping[str, np.ndarray]) -> None:
        q = self.dev.queue
        for name, (buf, dtype, shape) in step.inputs.items():
            if name not in inputs:
                raise PootError(f"missing input '{name}'")
            a = np.asarray(inputs[name])
            if a.shape != shape:
                raise PootError(f"input '{name}' has shape {a.shape}; this step was captured for {shape}")
            data = np.ascontiguousarray(a, dtype=dtype).reshape(-1).view(np.uint8)
            if data.nbytes % 4:
                data = np.concatenate([data, np.zeros(4 - data.nbytes % 4, np.uint8)])
            q.write_buffer(buf, 0, data)
        ready, step.ready = step.ready or self._encode(step), None
        q.submit([ready])
        step.ready = self._encode(step)  # the next replay's commands, encoded while the GPU runs these

    def _encode(self, step: WgpuStep) -> Any:
        """The step's dispatches in one compute pass, then the copies of its small outputs, as a
        finished command buffer (its inputs are written before it is submitted)."""
        enc = self.dev.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        for pipeline, group, grid in step.dispatches:
            if min(grid) >= 1:
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*grid)
        cpass.end()
        for src, off, back, size in step.copies:
            enc.copy_buffer_to_buffer(src, off, back, 0, size)
        return enc.finish()

    def profile(self, step: WgpuStep, inputs: Mapping[str, np.ndarray], repeat: int = 3) -> list[tuple[str, float]]:
        """Seconds per launch (median of ``repeat`` runs of the step), in plan order, from timestamp
        queries: each launch in a compute pass of its own whose beginning and end are timestamped
        (the adapter's ``timestamp-query`` feature; WebGPU timestamps are nanoseconds)."""
        wgpu, d = self.dev.wgpu, self.dev.device
        if "timestamp-query" not in d.features:
            raise PootError(f"wgpu:{self.dev.index} ({self.dev.name}): no timestamp-query feature: launches cannot be timed")
        n = len(step.dispatches)
        qs = d.create_query_set(type=wgpu.QueryType.timestamp, count=2 * max(1, n))
        resolved = d.create_buffer(size=16 * max(1, n), usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.replay(step, inputs)  # the inputs in place (and a warm-up)
        times = np.zeros((repeat, n))
        try:
            for r in range(repeat):
                enc = d.create_command_encoder()
                for i, (pipeline, group, grid) in enumerate(step.dispatches):
                    cpass = enc.begin_compute_pass(
                        timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1}
                    )
                    if min(grid) >= 1:
                        cpass.set_pipeline(pipeline)
                        cpass.set_bind_group(0, group)
                        cpass.dispatch_workgroups(*grid)
                    cpass.end()
                if n:
                    enc.resolve_query_set(qs, 0, 2 * n, resolved, 0)
                self.dev.queue.submit([enc.finish()])
                ticks = np.frombuffer(self.dev.read(resolved, 0, 16 * n), np.uint64).reshape(n, 2).astype(np.float64)
                times[r] = (ticks[:, 1] - ticks[:, 0]) * 1e-9
        finally:
            qs.destroy()
            resolved.destroy()
        return list(zip(step.names, np.median(times, axis=0).tolist()))

    def read(self, step: WgpuStep, name: str) -> np.ndarray:
        if name not in step.outputs:
            raise PootError(f"output '{name}' is not computed in this step (its launch is conditional on the step's symbols)")
        buf, off, dtype, shape = step.outputs[name]
        v = self.plan.graph.outputs[name]
        root = step.storage.roots[(v.node.id, v.index)]
        if root in self._pools:  # a pool: refresh the caller's host copy
            pbuf, host = self._pools[root]
            host.reshape(-1).view(np.uint8)[:] = self.dev.read(pbuf, 0, host.nbytes)
            return host
        count = int(np.prod(shape, dtype=np.int64))
        if buf in self._mappable(step):  # copied by the step itself: map, copy out, unmap
            buf.map_sync(self.dev.wgpu.MapMode.READ)
            try:
                return np.frombuffer(buf.read_mapped(0, buf.size), np.uint8)[: count * dtype.itemsize].view(dtype).reshape(shape).copy()
            finally:
                buf.unmap()
        return self.dev.read(buf, off, count * dtype.itemsize).view(dtype).reshape(shape).copy()

    @staticmethod
    def _mappable(step: WgpuStep) -> list[Any]:
        return [back for _, _, back, _ in step.copies]

    def close(self) -> None:
        for step in self._steps.values():
            for b in step.owned:
                b.destroy()
        self._steps = {}
        for b in list(self._weights.values()) + list(self._consts.values()) + list(self._fixed.values()):
            b.destroy()
        for b, _ in self._pools.values():
            b.destroy()
        self._weights, self._consts, self._fixed, self._pools = {}, {}, {}, {}
