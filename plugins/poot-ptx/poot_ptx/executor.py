"""The CUDA executor: weights uploaded packed, KV pools in device memory, and each captured step a
CUDA graph (the step's launches recorded once on a stream, with every address, grid and scalar
fixed) replayed after the step's inputs are written into its pinned staging memory. That memory is
mapped into the device's address space: the graph's first kernel copies the inputs in from it, and
its last kernels write the small outputs (the sampled tokens, log-probabilities) straight into
pinned memory, so reading them is no transfer of its own. (Kernels, not copy-engine transfers: a
transfer in a graph costs several times what a small kernel does, on every step.)
``launch`` returns while the GPU runs the graph (the engine queues the next step meanwhile); a step
launched again while its graph may still run gets a second instance with its own pinned blocks. On
sm_90+ the launches of a step of at most ``PROGRAMMATIC_TOKENS`` tokens (decode at small batches: warp GEMVs, latency-bound) are
programmatic: each may start while the one before it drains, held at its ``AwaitPrior`` until that
one is done: that shortens small steps, whose launches are latency-bound, and lengthens large
ones, so larger steps stay serial. ``POOT_CUDA_PDL=0`` captures every step serial.

Every captured step's intermediate values live in one arena the executor shares among them (steps
run one after another on its stream), so device memory follows the largest step captured, not the
number of shapes seen. When a step needs more, a larger arena (at least 1.5 times) replaces it:
the steps captured on the old one are captured again the next time they are asked for, and the old
one is freed with them once their replays are done and read: at a launch at least two after their
last (a queued replay's outputs are read before the launch after next, as the engine does; a
handle read later is refused)."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poot.backend import (
    Buffer,
    Executor,
    Peak,
    Plan,
    StoragePlan,
    checked_weight,
    compile_kernels,
    compile_progress,
    get_device,
    movement,
    plan_storage,
    storage_dtype,
)
from poot.errors import PootError

from .device import CudaCallError, _check
from .runtime import CudaContext, CudaKernel, target_for
from .targets import TARGETS

__all__ = ["CudaExecutor", "CudaStep", "PROGRAMMATIC_TOKENS"]

Key = tuple[int, int]
PROGRAMMATIC_TOKENS = 4  # steps of up to this many tokens have their launches programmatic (sm_90+)
READBACK_BYTES = 64 << 10  # outputs up to this size come back inside the step's graph (the logits do not)
ARENA_GROWTH = 1.5  # a larger shared arena is at least this many times the last
ARENA_MIN = 16 << 20  # the first shared arena's least size (a decode step's values fit many times)
COPY_BLOCK = 256  # threads a workgroup of the word copies in and out of pinned memory


@dataclass
class _Slot:
    """One instance of a step's graph with its own pinned blocks: the inputs it copies in first and
    the small outputs it writes back last (both mapped into the device's address space). A step gets a
    second slot when it is launched again while the first may still be running (the engine queues a
    step before reading the last)."""

    graph_exec: Any
    pinned: int  # the inputs' pinned block
    inputs: dict[str, np.ndarray]  # views of it, by input name
    back: int  # the small outputs' pinned block (0: none)
    readback: dict[str, np.ndarray]  # views of it, by output name
    event: Any  # recorded after its latest launch


@dataclass
class CudaStep:
    storage: StoragePlan
    arena: int  # device address: the executor's shared arena when it was captured
    arena_bytes: int  # what the step needs of it
    inputs: dict[str, tuple[int, np.ndarray]]  # name -> (device address, the first slot's host staging array)
    outputs: dict[str, tuple[int, np.dtype, tuple[int, ...]]]
    graph_exec: Any  # the first slot's
    launches: int
    owned: list[int] = field(default_factory=list)
    staging: tuple[int, int, int] = (0, 0, 0)  # the first slot's pinned host address, device address, bytes: the inputs' one copy
    binding: int = 0  # the executor's binding generation it was captured under
    calls: list[tuple[Any, tuple[int, ...], dict[str, int], dict[str, Any]]] = field(default_factory=list)  # what the graph launches
    names: list[str] = field(default_factory=list)
    slots: list[_Slot] = field(default_factory=list)
    layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = field(default_factory=dict)  # input name -> (offset, dtype, shape) in a pinned block
    back_layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = field(default_factory=dict)  # small output -> (offset, dtype, shape)
    env: dict[str, int] = field(default_factory=dict)
    last: int = 0  # the slot launched last
    launched: int = -1  # the executor's launch count at its latest launch
    retired: bool = False  # replaced by a capture on a newer arena or binding: read, not launched


class CudaExecutor(Executor):
    asynchronous = True  # launch returns while the GPU runs the step's graph

    def __init__(self, plan: Plan, threads: int | None = None, progress: bool = False) -> None:
        super().__init__(plan)
        self.device = get_device(plan.device)
        self._peak: Peak | None = None
        if self.device.kind != "cuda" or not isinstance(self.device.index, int):
            raise PootError(f"the CUDA executor runs plans made for a cuda device, not {plan.device}")
        self.ctx = CudaContext(self.device.index)
        self.d = self.ctx.driver
        target = target_for(self.device)
        self.programmatic = target.startswith("nvptx:sm_90") and os.environ.get("POOT_CUDA_PDL", "1") != "0"

        by_value: dict[str, list[int]] = {}
        objects = {id(l.kernel): l.kernel for l in plan.launches}
        for k in objects.values():
            by_value.setdefault(repr(k), []).append(id(k))
        self._kernels: dict[int, CudaKernel] = {}
        # compiled side by side first (each CudaKernel then finds its PTX in the cache)
        compile_kernels([objects[ids[0]] for ids in by_value.values()], TARGETS[target], progress)
        for ids in compile_progress(by_value.values(), progress, len(by_value)):
            ck = CudaKernel(self.ctx, objects[ids[0]], target)
            for i in ids:
                self._kernels[i] = ck
        self._copy = CudaKernel(self.ctx, movement.copy_words.instantiate(BLOCK=COPY_BLOCK), target)  # inputs in, small outputs out
        self.stream = _check(self.d, "cuStreamCreate", self.d.cuStreamCreate(0))
        g = plan.graph
        self._fixed: dict[int, int] = {}  # id of a small array a launch names (lut, dummy) -> device copy
        self._consts: dict[Key, int] = {}
        for n in g.nodes:
            if n.op == "constant":
                a = np.ascontiguousarray(n.attrs["value"].array.astype(storage_dtype(n.attrs["dtype"])))
                self._consts[(n.id, 0)] = self._upload(a)
        self._weight_nodes = {n.attrs["name"]: n for n in g.nodes if n.op == "weight"}
        self._weights: dict[Key, int] = {}
        self._weight_src: dict[Key, int] = {}
        self._pools: dict[Key, tuple[int, np.ndarray]] = {}
        self._steps: dict[tuple[tuple[str, int], ...], CudaStep] = {}
        self._retired: list[CudaStep] = []  # replaced (a larger arena, a rebinding): freed once done and read
        self._arena, self._arena_size = 0, 0  # the shared arena every step is captured on now
        self._arena_users: dict[int, int] = {}  # arena address -> steps captured on it and not yet freed
        self._arena_last: CudaStep | None = None  # the step whose replay last ran in the arena (None: unknown)
        self._launches = 0
        self._binding = 0
        self._keep: list[np.ndarray] = []

    def _upload(self, a: np.ndarray) -> int:
        ptr = self.ctx.alloc(a.nbytes)
        self.ctx.upload(ptr, a)
        return ptr

    # -- persistent buffers ---------------------------------------------------------------------
    def bind(self, weights: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray] | None = None) -> None:
        self.ctx.make_current()
        for name, n in self._weight_nodes.items():
            if name not in weights:
                raise PootError(f"weight '{name}' is not bound (the plan reads it)")
            key = (n.id, 0)
            if self._weight_src.get(key) == id(weights[name]):
                continue
            a = checked_weight(name, n.outputs[0], weights[name])
            if key in self._weights:
                self.ctx.free(self._weights[key])
            self._weights[key] = self._upload(a)
            self._weight_src[key] = id(weights[name])
            self._binding += 1
        inputs = self.plan.inputs
        for name, a in (pools or {}).items():
            key = (inputs[name].node.id, inputs[name].index)
            old = self._pools.get(key)
            if old is not None and old[1] is a:
                continue
            if old is not None:
                self.ctx.free(old[0])
            self._pools[key] = (self._upload(np.ascontiguousarray(a)), a)
            self._binding += 1

    def write_pool(self, name: str, index: int, values: np.ndarray) -> None:
        v = self.plan.inputs[name]
        entry = self._pools.get((v.node.id, v.index))
        if entry is None:
            raise PootError(f"pool '{name}' is not bound")
        ptr, host = entry
        host[index] = values
        row = np.ascontiguousarray(host[index])
        self.ctx.make_current()
        self.ctx.upload(ptr + index * row.nbytes, row)

    # -- capture --------------------------------------------------------------------------------
    def capture(self, env: Mapping[str, int]) -> CudaStep:
        key = tuple(sorted(env.items()))
        step = self._steps.get(key)
        if step is not None and step.binding == self._binding and step.arena == self._arena:
            return step
        self.ctx.make_current()
        g = self.plan.graph
        sp = plan_storage(self.plan, env)
        for name, k in sp.pools.items():
            if k not in self._pools:
                raise PootError(f"pool '{name}' is not bound: bind(weights, pools={{'{name}': ...}}) first")
        if sp.arena_bytes > self._arena_size or not self._arena:
            self._grow(sp.arena_bytes)
        arena = self._arena
        values = {(n.id, v.index): v for n in g.nodes for v in n.outputs}
        owned: list[int] = []
        by_root: dict[Key, int] = dict(self._weights)
        by_root.update(self._consts)
        by_root.update({k: p for k, (p, _) in self._pools.items()})
        # the step's inputs side by side in one device block, written through one pinned host block
        offsets: dict[str, int] = {}
        total = 0
        for name, k in sp.inputs.items():
            offsets[name] = total
            nbytes = int(np.prod(sp.shapes[k], dtype=np.int64)) * np.dtype(storage_dtype(values[k].dtype)).itemsize
            total += -(-nbytes // 256) * 256
        dev = self.ctx.alloc(max(total, 256))
        owned.append(dev)
        layout = {name: (offsets[name], np.dtype(storage_dtype(values[k].dtype)), tuple(sp.shapes[k])) for name, k in sp.inputs.items()}
        for name, k in sp.inputs.items():
            by_root[k] = dev + offsets[name]

        def address(ref: Key) -> int:
            root = sp.roots[ref]
            return by_root[root] if root in by_root else arena + sp.arena_offsets[root]

        calls = []  # addresses first: nothing may be allocated while the stream is being captured
        for launch in sp.launches:
            ptrs: dict[str, int] = {}
            for p in launch.kernel.params:
                if isinstance(p, Buffer):
                    ref = launch.buffers[p.name]
                    if isinstance(ref, np.ndarray):
                        if id(ref) not in self._fixed:
                            self._keep.append(ref)
                            self._fixed[id(ref)] = self._upload(np.ascontiguousarray(ref))
                        ptrs[p.name] = self._fixed[id(ref)]
                    else:
                        ptrs[p.name] = address(ref)
            calls.append((self._kernels[id(launch.kernel)], launch.grid(env), ptrs, launch.scalars(env)))
        outputs = {}
        for name, v in g.outputs.items():
            k = (v.node.id, v.index)
            if sp.roots[k] in by_root or sp.roots[k] in sp.arena_offsets:  # else a conditional launch left it out of this step
                outputs[name] = (address(k), storage_dtype(v.dtype), sp.shapes[k])
        # small outputs (sampled tokens, log-probabilities) written by the graph's last kernels into
        # pinned memory, so reading them after the replay is no transfer of its own
        small = {
            name: o
            for name, o in outputs.items()
            if sp.roots[(g.outputs[name].node.id, g.outputs[name].index)] not in self._pools
            and 0 < int(np.prod(o[2], dtype=np.int64)) * np.dtype(o[1]).itemsize <= READBACK_BYTES
        }
        back_layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        back_total = 0
        for name, (_, dtype, shape) in small.items():
            back_layout[name] = (back_total, np.dtype(dtype), tuple(shape))
            back_total += -(-int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // 256) * 256
        step = CudaStep(
            sp,
            arena,
            sp.arena_bytes,
            {},
            outputs,
            None,
            len(sp.launches),
            owned,
            (0, dev, total),
            self._binding,
            calls,
            [launch.label or launch.kernel.name for launch in sp.launches],
            layout=layout,
            back_layout=back_layout,
            env=dict(env),
        )
        slot = self._new_slot(step)
        step.graph_exec, step.staging = slot.graph_exec, (slot.pinned, dev, total)
        step.inputs = {name: (dev + layout[name][0], slot.inputs[name]) for name in layout}
        old = self._steps.get(key)
        self._steps[key] = step
        self._arena_users[arena] += 1
        if old is not None:  # captured on an older arena, or under weights or pools since rebound
            self._retire(old)
        return step

    def _retire(self, step: CudaStep) -> None:
        step.retired = True
        self._retired.append(step)

    def _grow(self, need: int) -> None:
        """A new shared arena of at least ``need`` bytes (and ``ARENA_GROWTH`` times the last): every
        step captured on the old one is retired, to be captured again when next asked for."""
        size = -(-max(need, int(self._arena_size * ARENA_GROWTH), ARENA_MIN, 256) // 4096) * 4096
        try:
            ptr = self.ctx.alloc(size)
        except CudaCallError:  # (out of memory, most likely) what the step needs, and no more
            size = -(-max(need, 256) // 4096) * 4096
            ptr = self.ctx.alloc(size)
        old = self._arena
        self._arena, self._arena_size = ptr, size
        self._arena_users[self._arena] = 0
        for key in [k for k, st in self._steps.items() if st.arena != self._arena]:
            self._retire(self._steps.pop(key))
        if old and not self._arena_users.get(old):
            self._arena_users.pop(old, None)
            self.ctx.free(old)

    def _reap(self) -> None:
        """Free the retired steps whose replays are done and were read: launched before the launch
        before this one (the engine reads a step's tokens before it queues the step after next)."""
        d = self.d
        keep = []
        for st in self._retired:
            done = all(d.cuEventQuery(sl.event)[0] == d.CUresult.CUDA_SUCCESS for sl in st.slots)
            if done and st.launched < self._launches - 1:
                self._drop(st)
            else:
                keep.append(st)
        self._retired = keep

    def _new_slot(self, step: CudaStep) -> _Slot:
        """Another instance of ``step``'s graph, with its own pinned blocks, mapped into the device's
        address space: its first kernel copies the inputs in from one, its last ones write the small
        outputs into the other (32-bit words, rounded up: the inputs' and read-back blocks are in
        256-byte units, and an output's value is padded in the arena, so the last word stays inside
        both)."""
        d = self.d
        _, dev, total = step.staging
        mapped = d.CU_MEMHOSTALLOC_DEVICEMAP

        def host_block(nbytes: int) -> tuple[int, int]:
            ptr = int(_check(d, "cuMemHostAlloc", d.cuMemHostAlloc(nbytes, mapped)))
            return ptr, int(_check(d, "cuMemHostGetDevicePointer", d.cuMemHostGetDevicePointer(ptr, 0)))

        pinned, pinned_dev = host_block(max(total, 256))
        np.frombuffer((ctypes.c_uint8 * max(total, 256)).from_address(pinned), np.uint8)[:] = 0

        def views(base: int, layout: Mapping[str, tuple[int, np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
            out = {}
            for name, (off, dtype, shape) in layout.items():
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                out[name] = np.frombuffer((ctypes.c_uint8 * max(nbytes, 1)).from_address(base + off), np.uint8)[:nbytes].view(dtype).reshape(shape)
            return out

        back_total = sum(-(-int(np.prod(sh, dtype=np.int64)) * dt_.itemsize // 256) * 256 for _, dt_, sh in step.back_layout.values())
        back, back_dev = host_block(back_total) if back_total else (0, 0)
        readback = views(back, step.back_layout)
        copies_in = [(self._copy, (-(-total // 4 // COPY_BLOCK),), {"src": pinned_dev, "dst": dev}, {"n": total // 4})] if total else []
        copies_out = []
        for name, host in readback.items():
            words = -(-host.nbytes // 4)
            copies_out.append(
                (self._copy, (-(-words // COPY_BLOCK),), {"src": step.outputs[name][0], "dst": back_dev + step.back_layout[name][0]}, {"n": words})
            )
        _check(d, "cuStreamBeginCapture", d.cuStreamBeginCapture(self.stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            # the inputs' copy queued on its own: the step's first launch is a plain one after it, since
            # a launch may read inputs before its wait for the launch before (nothing else writes them)
            self._queue(copies_in, step.env)
            self._queue(copies_out, step.env, after_kernel=self._queue(step.calls, step.env))
        finally:
            graph = _check(d, "cuStreamEndCapture", d.cuStreamEndCapture(self.stream))
        try:
            graph_exec = _check(d, "cuGraphInstantiate", d.cuGraphInstantiate(graph, 0))
        finally:
            _check(d, "cuGraphDestroy", d.cuGraphDestroy(graph))
        event = _check(d, "cuEventCreate", d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        slot = _Slot(graph_exec, pinned, views(pinned, step.layout), back, readback, event)
        step.slots.append(slot)
        return slot

    def _queue(self, calls: list[tuple[Any, tuple[int, ...], dict[str, int], dict[str, Any]]], env: Mapping[str, int], after_kernel: bool = False) -> bool:
        """Launch ``calls`` on the stream being captured, programmatic in a step of up to
        ``PROGRAMMATIC_TOKENS`` tokens where a kernel launch is queued before (one of them, or the
        last of a call before: ``after_kernel``); the first otherwise is a plain dependency. Returns
        whether the last launch queued is a kernel's."""
        programmatic = self.programmatic and env.get("tokens", PROGRAMMATIC_TOKENS + 1) <= PROGRAMMATIC_TOKENS
        follows_kernel = after_kernel
        for ck, grid, ptrs, scalars in calls:
            follows_kernel = ck.launch(grid, ptrs, scalars, self.stream, programmatic=programmatic and follows_kernel) or follows_kernel
        return follows_kernel

    def _drop(self, step: CudaStep) -> None:
        """Free a step's graphs and memory; replaying or reading it afterwards is a PootError (its
        input arrays were views of the freed pinned blocks)."""
        slots, step.slots, step.graph_exec = step.slots, [], None
        step.inputs, step.outputs, step.calls = {}, {}, []
        if not slots:
            return
        if self._arena_last is step:
            self._arena_last = None
        d = self.d
        for slot in slots:
            _check(d, "cuEventSynchronize", d.cuEventSynchronize(slot.event))
            _check(d, "cuGraphExecDestroy", d.cuGraphExecDestroy(slot.graph_exec))
            _check(d, "cuEventDestroy", d.cuEventDestroy(slot.event))
            for host in (slot.pinned, slot.back):
                if host:
                    _check(d, "cuMemFreeHost", d.cuMemFreeHost(host))
        for p in step.owned:
            self.ctx.free(p)
        users = self._arena_users.get(step.arena, 0) - 1
        self._arena_users[step.arena] = users
        if users <= 0 and step.arena != self._arena:  # the last step on a replaced arena
            self._arena_users.pop(step.arena, None)
            self.ctx.free(step.arena)

    # -- replay ---------------------------------------------------------------------------------
    def _live(self, step: CudaStep) -> None:
        if not step.slots:
            raise PootError("this captured step was released (its executor was rebound or closed, or the steps' shared arena grew): capture the step again")

    def replay(self, step: CudaStep, inputs: Mapping[str, np.ndarray]) -> None:
        self.finish(self.launch(step, inputs))

    def launch(self, step: CudaStep, inputs: Mapping[str, np.ndarray], keep: tuple[str, ...] = ()) -> tuple[CudaStep, _Slot]:
        """Queue a replay of ``step`` and return at once: its inputs written into the pinned block of
        a slot no queued replay still reads and not the one launched last (whose outputs may be
        unread), so a step's replays alternate between two slots (the second made when first
        needed); the graph launched, an event recorded after it. (Every small output is kept:
        ``fetch``.)"""
        self._live(step)
        if step.retired:
            raise PootError("this captured step was replaced (the steps' shared arena grew, or the executor was rebound): capture the step again")
        self.ctx.make_current()
        if self._retired:
            self._reap()
        d = self.d
        # never the slot launched last, even when its replay is done: its outputs may not have been
        # read yet (the engine queues a step's next replay before reading this one)
        free = [i for i, sl in enumerate(step.slots) if (i != step.last or step.launched < 0) and d.cuEventQuery(sl.event)[0] == d.CUresult.CUDA_SUCCESS]
        if free:
            at = free[0]
        elif len(step.slots) < 2:
            self._new_slot(step)
            at = len(step.slots) - 1
        else:  # both queued: the older one is the one not launched last
            at = 1 - step.last
            _check(d, "cuEventSynchronize", d.cuEventSynchronize(step.slots[at].event))
        slot = step.slots[at]
        for name, host in slot.inputs.items():
            if name not in inputs:
                raise PootError(f"missing input '{name}'")
            a = np.asarray(inputs[name])
            if a.shape != host.shape:
                raise PootError(f"input '{name}' has shape {a.shape}; this step was captured for {host.shape}")
            host[...] = a  # pinned: the graph's first kernel copies every input in at once
        _check(d, "cuGraphLaunch", d.cuGraphLaunch(slot.graph_exec, self.stream))
        _check(d, "cuEventRecord", d.cuEventRecord(slot.event, self.stream))
        step.last, step.launched = at, self._launches
        self._launches += 1
        self._arena_last = step
        return step, slot

    @staticmethod
    def _held(handle: tuple[CudaStep, _Slot]) -> _Slot:
        step, slot = handle
        if not any(sl is slot for sl in step.slots):
            raise PootError(
                "this replay's step was released (a step is freed at a launch two or more after its last once replaced): "
                "read a queued replay before the launch after next"
            )
        return slot

    def finish(self, handle: tuple[CudaStep, _Slot]) -> None:
        """Wait until the replay ``launch`` returned ``handle`` for is done."""
        _check(self.d, "cuEventSynchronize", self.d.cuEventSynchronize(self._held(handle).event))

    def fetch(self, handle: tuple[CudaStep, _Slot], name: str) -> np.ndarray:
        """An output of the replay ``handle`` names (after ``finish``), as that replay wrote it back:
        the small ones (``READBACK_BYTES``). The next launch does not touch it; the one after may
        (the step's slot taken again, or the step freed once replaced), so read it before that."""
        slot = self._held(handle)
        if name not in slot.readback:
            raise PootError(f"output '{name}' of a queued replay is not kept: it is larger than {READBACK_BYTES} bytes (read it after a replay)")
        return slot.readback[name].copy()

    def profile(self, step: CudaStep, inputs: Mapping[str, np.ndarray], repeat: int = 3) -> list[tuple[str, float]]:
        """Seconds per launch (median of ``repeat`` runs of the step's launches one by one, each
        timed with CUDA events), in plan order. The step's graph is not used. Each run starts behind
        memsets that keep the GPU busy until every launch is queued, so a launch's time is its own
        and not the host's time to issue the next one."""
        self.replay(step, inputs)  # inputs in place, and a warm-up
        d = self.d
        events = [_check(d, "cuEventCreate", d.cuEventCreate(0)) for _ in range(len(step.calls) + 1)]
        times = np.zeros((repeat, len(step.calls)))
        stall_bytes = 1 << 28
        stall = self.ctx.alloc(stall_bytes)
        try:
            for r in range(repeat):
                for _ in range(8 + len(step.calls) // 2):  # ~0.1 ms each: longer than issuing the launches
                    _check(d, "cuMemsetD32Async", d.cuMemsetD32Async(stall, 0, stall_bytes // 4, self.stream))
                _check(d, "cuEventRecord", d.cuEventRecord(events[0], self.stream))
                for i, (ck, grid, ptrs, scalars) in enumerate(step.calls):
                    ck.launch(grid, ptrs, scalars, self.stream)
                    _check(d, "cuEventRecord", d.cuEventRecord(events[i + 1], self.stream))
                _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(self.stream))
                for i in range(len(step.calls)):
                    times[r, i] = _check(d, "cuEventElapsedTime", d.cuEventElapsedTime(events[i], events[i + 1])) / 1e3
        finally:
            for e in events:
                d.cuEventDestroy(e)
            self.ctx.free(stall)
        return list(zip(step.names, np.median(times, axis=0).tolist()))

    def peak(self) -> Peak:
        """The GPU's rates: a 1 GiB device-to-device copy (bytes read plus written per second, the
        median of 5, measured once) and the dense bf16 tensor-core rate its specification gives (SMs
        x clock x FLOPs an SM does a clock: 4096 on compute capability 9.0, 2048 on 8.0, 1024 on
        other 8.x; 256 f32 CUDA-core FLOPs otherwise)."""
        if self._peak is None:
            d = self.d
            n = 1 << 29
            a, b = self.ctx.alloc(n), self.ctx.alloc(n)
            times = []
            try:
                for i in range(7):
                    self.ctx.synchronize()
                    t = time.perf_counter()
                    _check(d, "cuMemcpyDtoD", d.cuMemcpyDtoD(b, a, n))
                    self.ctx.synchronize()
                    if i >= 2:
                        times.append(time.perf_counter() - t)
            finally:
                self.ctx.free(a)
                self.ctx.free(b)
            A = d.CUdevice_attribute
            dev = _check(d, "cuDeviceGet", d.cuDeviceGet(self.device.index))
            attr = lambda a: _check(d, "cuDeviceGetAttribute", d.cuDeviceGetAttribute(a, dev))  # noqa: E731
            cc = (attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
            per_clock = {(9, 0): 4096, (8, 0): 2048}.get(cc, 1024 if cc[0] == 8 else 256)
            clock_hz = attr(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) * 1e3
            flops = attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) * clock_hz * per_clock
            kind = "bf16 tensor cores" if per_clock > 256 else "f32 CUDA cores"
            self._peak = Peak(2 * n / float(np.median(times)), flops, f"measured copy; {kind} from SMs x clock")
        return self._peak

    def graph_seconds(self, step: CudaStep, leave_out: Callable[[str], bool] = lambda name: False, repeat: int = 5, runs: int = 20) -> float:
        """Seconds a replay of ``step``'s launches takes as one CUDA graph (median of ``repeat``
        timings of ``runs`` replays queued back to back, between CUDA events), captured again
        without the launches whose names ``leave_out`` accepts and without the inputs' copy: what
        a class of launches costs inside the graph, where a launch timed alone carries its own
        start-up. Left-out launches write nothing, so this graph's results are not the step's."""
        self._live(step)
        self.ctx.make_current()
        self._arena_last = None  # (its launches overwrite the arena's values)
        d = self.d
        _check(d, "cuStreamBeginCapture", d.cuStreamBeginCapture(self.stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            self._queue([c for c, name in zip(step.calls, step.names) if not leave_out(name)], dict(step.storage.env))
        finally:
            graph = _check(d, "cuStreamEndCapture", d.cuStreamEndCapture(self.stream))
        events = [_check(d, "cuEventCreate", d.cuEventCreate(0)) for _ in range(2)]
        try:
            graph_exec = _check(d, "cuGraphInstantiate", d.cuGraphInstantiate(graph, 0))
            times = []
            for _ in range(repeat + 1):  # the first a warm-up
                _check(d, "cuEventRecord", d.cuEventRecord(events[0], self.stream))
                for _ in range(runs):
                    _check(d, "cuGraphLaunch", d.cuGraphLaunch(graph_exec, self.stream))
                _check(d, "cuEventRecord", d.cuEventRecord(events[1], self.stream))
                _check(d, "cuEventSynchronize", d.cuEventSynchronize(events[1]))
                times.append(_check(d, "cuEventElapsedTime", d.cuEventElapsedTime(events[0], events[1])) / 1e3 / runs)
            _check(d, "cuGraphExecDestroy", d.cuGraphExecDestroy(graph_exec))
        finally:
            _check(d, "cuGraphDestroy", d.cuGraphDestroy(graph))
            for e in events:
                d.cuEventDestroy(e)
        return float(np.median(times[1:]))

    def read(self, step: CudaStep, name: str) -> np.ndarray:
        self._live(step)
        if name not in step.outputs:
            raise PootError(f"output '{name}' is not computed in this step (its launch is conditional on the step's symbols)")
        if name in step.slots[step.last].readback:  # written back by the last replay's graph
            return step.slots[step.last].readback[name].copy()
        ptr, dtype, shape = step.outputs[name]
        v = self.plan.graph.outputs[name]
        root = step.storage.roots[(v.node.id, v.index)]
        if root in self._pools:  # a pool: refresh the caller's host copy
            host = self._pools[root][1]
            self.ctx.download(self._pools[root][0], host)
            return host
        if root in step.storage.arena_offsets and self._arena_last is not step:
            raise PootError(
                f"output '{name}' of this step is gone: another step has run since in the arena the steps share; read it right after the step's replay"
            )
        out = np.empty(shape, dtype)
        self.ctx.download(ptr, out)
        return out

    def close(self) -> None:
        self.ctx.make_current()
        self.ctx.synchronize()
        steps, self._steps, self._retired = list(self._steps.values()) + self._retired, {}, []
        memory = list(self._weights.values()) + list(self._consts.values()) + list(self._fixed.values()) + [p for p, _ in self._pools.values()]
        self._weights, self._consts, self._fixed, self._pools = {}, {}, {}, {}  # emptied first: a second close frees nothing twice
        for step in steps:
            self._drop(step)
        if self._arena:  # (those replaced went with their last step)
            self.ctx.free(self._arena)
        self._arena, self._arena_size, self._arena_users = 0, 0, {}
        for p in memory:
            self.ctx.free(p)
