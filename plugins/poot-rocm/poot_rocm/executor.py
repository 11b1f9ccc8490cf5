"""The ROCm executor: a plan's kernels as linked AMDGCN code objects loaded once, weights (as stored),
constants and KV pools in device memory bound once, and each captured step a list of AQL
kernel-dispatch packets encoded once (``aql.encode``) that replay publishes into the queue's ring.

Capture plans the step's storage, gives every value a device address (the step's activation arena,
its inputs' block, the bound buffers), writes each launch's kernel arguments where the code object's
metadata puts them into one block of kernarg memory (host-written, read by the GPU; written once, at
capture), and encodes one dispatch packet per launch: workgroup and grid sizes, the segment sizes the
code object asks for, its kernel descriptor's address, and the barrier bit where the launch touches
bytes an earlier launch of its group writes (``aql.barriers``; packets between two barriers may run
at once). Fences: the first packet acquires at system scope (it reads what the host wrote), the last
releases at system scope and carries the step's completion signal; the rest stay at agent scope.

Replay copies the step's inputs into their device block, sets the completion signal, publishes the
packets (in pieces no larger than the ring, each waiting for room), and waits for the signal.

The GPU is behind ``Agent``: ``runtime.HsaAgent`` (hip-python for buffers and transfers, the HSA
runtime for code objects, kernarg memory, the queue and signals) on an AMD GPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from poot.backend import (
    Buffer,
    Executor,
    Kernel,
    Plan,
    StoragePlan,
    checked_pool,
    checked_weight,
    compile_kernel,
    compile_progress,
    computed_outputs,
    get_device,
    plan_storage,
    require_pools,
    storage_dtype,
    value_region,
)
from poot.errors import PootError

from .aql import FENCE_SCOPE_AGENT, FENCE_SCOPE_SYSTEM, AqlRing, barriers, encode
from .code_object import CodeObjectKernel, dispatch, kernargs, read_code_object
from .targets import TARGETS

__all__ = ["Agent", "RocmExecutor", "RocmStep", "ALIGN", "RING_SLOTS"]

Key = tuple[int, int]
ALIGN = 256  # device allocations and arena slots: what the GPU's widest loads want
RING_SLOTS = 4096  # the queue's packets (a step longer than this is published in pieces)
WHOLE = 1 << 62  # a bound buffer's extent for the barrier analysis: all of it


class Agent(Protocol):
    """What the executor needs of a GPU: memory, code objects, an AQL queue and signals."""

    arch: str  # the gfx target the code objects are linked for

    def alloc(self, nbytes: int) -> int:
        """Device memory (at least ``ALIGN``-aligned): its address."""

    def free(self, ptr: int) -> None: ...

    def upload(self, ptr: int, data: np.ndarray) -> None:
        """Copy a contiguous host array to device address ``ptr`` (done when it returns)."""

    def download(self, ptr: int, out: np.ndarray) -> None:
        """Copy device bytes at ``ptr`` into the contiguous host array ``out``."""

    def load(self, code_object: bytes, kernel: Kernel) -> int:
        """Load a linked code object once: the address of ``kernel``'s descriptor (``<name>.kd``)."""

    def kernarg(self, nbytes: int) -> tuple[int, np.ndarray]:
        """Kernarg memory the host writes and dispatches read: (address, a uint8 view of it)."""

    def free_kernarg(self, ptr: int) -> None: ...

    def queue(self, slots: int) -> AqlRing:
        """The agent's AQL queue (its ring of ``slots`` packets)."""

    def signal(self, value: int) -> int:
        """A new signal of ``value``: its handle."""

    def store_signal(self, signal: int, value: int) -> None: ...

    def wait(self, signal: int, timeout: float) -> None:
        """Until ``signal`` is below 1; raises on ``timeout`` seconds."""

    def destroy_signal(self, signal: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class RocmStep:
    storage: StoragePlan
    packets: list[bytes]  # encoded, in publication order
    signal: int  # the last packet's completion signal
    arena: int
    inputs_at: int  # the step's inputs' device block
    staging: np.ndarray  # its host copy (uint8), written by replay
    layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]]  # input name -> (offset, dtype, shape) in the block
    outputs: dict[str, tuple[int, np.dtype, tuple[int, ...]]]  # output name -> (device address, dtype, shape)
    kernarg_block: int
    binding: int
    names: list[str] = field(default_factory=list)
    barriers: list[bool] = field(default_factory=list)  # per packet
    owned: list[int] = field(default_factory=list)  # device allocations freed with the step


class RocmExecutor(Executor):
    def __init__(self, plan: Plan, threads: int | None = None, progress: bool = False, agent: Agent | None = None, ring_slots: int = RING_SLOTS) -> None:
        """``agent``: the GPU to run on; by default the HSA agent of the plan's ``rocm:N`` device."""
        super().__init__(plan)
        if agent is None:
            device = get_device(plan.device)
            if device.kind != "rocm" or not isinstance(device.index, int):
                raise PootError(f"the ROCm executor runs plans made for a rocm device, not {plan.device}")
            from .runtime import HsaAgent

            agent = HsaAgent(device.index)
        self.agent = agent
        target = TARGETS.get(f"amdgcn:{agent.arch}")
        if target is None:
            raise PootError(f"{agent.arch} is not one of the AMDGCN targets poot links for ({', '.join(TARGETS)})")
        self._kernels: dict[int, tuple[CodeObjectKernel, int]] = {}  # id of a plan kernel -> (its metadata, kernel object)
        by_value: dict[str, list[Kernel]] = {}
        for launch in plan.launches:
            by_value.setdefault(repr(launch.kernel), []).append(launch.kernel)
        self._device_memory: list[int] = []
        self._steps: dict[tuple[tuple[str, int], ...], RocmStep] = {}
        try:
            for ks in compile_progress(by_value.values(), progress, len(by_value)):
                data = compile_kernel(ks[0], target).data
                info = read_code_object(data, f"the code object of kernel {ks[0].name}").get(ks[0].name)
                if info is None:
                    raise PootError(f"the code object linked for kernel {ks[0].name} has no kernel of that name")
                loaded = (info, agent.load(data, ks[0]))
                for k in ks:
                    self._kernels[id(k)] = loaded
            self.ring = agent.queue(ring_slots)
        except BaseException:
            agent.close()
            raise
        g = plan.graph
        self._consts: dict[Key, int] = {}
        for n in g.nodes:
            if n.op == "constant":
                self._consts[(n.id, 0)] = self._upload(np.ascontiguousarray(n.attrs["value"].array.astype(storage_dtype(n.attrs["dtype"]))))
        self._fixed: dict[int, int] = {}  # id of a small array a launch names (lut, dummy) -> its device copy
        self._keep: list[np.ndarray] = []
        self._weight_nodes = {n.attrs["name"]: n for n in g.nodes if n.op == "weight"}
        self._weights: dict[Key, int] = {}
        self._weight_src: dict[Key, int] = {}
        self._pools: dict[Key, tuple[int, np.ndarray]] = {}
        self._binding = 0

    def _upload(self, a: np.ndarray) -> int:
        ptr = self.agent.alloc(max(a.nbytes, 4))
        self.agent.upload(ptr, a)
        self._device_memory.append(ptr)
        return ptr

    def _release(self, ptr: int) -> None:
        self._device_memory.remove(ptr)
        self.agent.free(ptr)

    # -- persistent buffers ---------------------------------------------------------------------
    def bind(self, weights: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray] | None = None) -> None:
        for name, n in self._weight_nodes.items():
            if name not in weights:
                raise PootError(f"weight '{name}' is not bound (the plan reads it)")
            key = (n.id, 0)
            if self._weight_src.get(key) == id(weights[name]):
                continue
            a = checked_weight(name, n.outputs[0], weights[name])
            if key in self._weights:
                self._release(self._weights[key])
            self._weights[key] = self._upload(a)
            self._weight_src[key] = id(weights[name])
            self._binding += 1
        inputs = self.plan.inputs
        for name, a in (pools or {}).items():
            v = inputs[name]
            key = (v.node.id, v.index)
            a = checked_pool(name, v, a)
            old = self._pools.get(key)
            if old is not None and old[1] is a:
                self.agent.upload(old[0], a)  # the caller's copy is the truth at bind
                continue
            if old is not None:
                self._release(old[0])
            self._pools[key] = (self._upload(a), a)
            self._binding += 1

    def write_pool(self, name: str, index: int, values: np.ndarray) -> None:
        v = self.plan.inputs[name]
        entry = self._pools.get((v.node.id, v.index))
        if entry is None:
            raise PootError(f"pool '{name}' is not bound")
        ptr, host = entry
        row = np.ascontiguousarray(values, dtype=host.dtype).reshape(host.shape[1:])
        host[index] = row
        self.agent.upload(ptr + index * row.nbytes, row)

    # -- capture --------------------------------------------------------------------------------
    def capture(self, env: Mapping[str, int]) -> RocmStep:
        key = tuple(sorted(env.items()))
        step = self._steps.get(key)
        if step is not None and step.binding == self._binding:
            return step
        if step is not None:
            self._free_step(step)
            del self._steps[key]
        g = self.plan.graph
        sp = plan_storage(self.plan, env, alignment=ALIGN)
        values = {(n.id, v.index): v for n in g.nodes for v in n.outputs}
        require_pools(sp, self._pools)
        owned: list[int] = []
        arena = self.agent.alloc(max(sp.arena_bytes, ALIGN))
        owned.append(arena)
        by_root: dict[Key, int] = dict(self._weights)
        by_root.update(self._consts)
        by_root.update({k: p for k, (p, _) in self._pools.items()})
        bound = frozenset(by_root)
        # the step's inputs side by side in one device block, written by one copy
        layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        total = 0
        for name, k in sp.inputs.items():
            dtype = np.dtype(storage_dtype(values[k].dtype))
            layout[name] = (total, dtype, tuple(sp.shapes[k]))
            total += -(-max(sp.nbytes(k, values[k].dtype), 4) // ALIGN) * ALIGN
        inputs_at = self.agent.alloc(max(total, ALIGN))
        owned.append(inputs_at)
        for name, k in sp.inputs.items():
            by_root[k] = inputs_at + layout[name][0]

        def where(ref: Key | np.ndarray) -> tuple[int, tuple[object, int, int]]:
            """A buffer's device address and the byte range it covers (for the barrier analysis)."""
            r = value_region(sp, values, bound, ref)
            if r.kind == "fixed":
                if id(r.array) not in self._fixed:
                    self._keep.append(r.array)  # type: ignore[arg-type]
                    self._fixed[id(r.array)] = self._upload(np.ascontiguousarray(r.array))
                return self._fixed[id(r.array)], (("fixed", id(r.array)), 0, WHOLE)
            if r.kind == "arena":
                return arena + r.offset, ("arena", r.offset, r.offset + r.nbytes)  # type: ignore[operator]
            return by_root[r.key], (r.key, 0, WHOLE)  # type: ignore[index]

        launches, args, accesses = [], [], []
        for launch in sp.launches:
            groups = tuple(int(x) for x in launch.grid(env))
            if min(groups, default=0) < 1:
                continue  # nothing to run at this shape
            info, kobj = self._kernels[id(launch.kernel)]
            addresses: dict[str, int] = {}
            reads, writes = [], []
            for p in launch.kernel.params:
                if isinstance(p, Buffer):
                    addresses[p.name], rng = where(launch.buffers[p.name])
                    (reads if p.readonly else writes).append(rng)
            args.append(kernargs(info, launch.kernel, addresses, launch.scalars(env)))
            launches.append((launch, info, kobj, groups))
            accesses.append((reads, writes))
        offsets, top = [], 0
        for (_, info, _, _), a in zip(launches, args):
            top = -(-top // max(16, info.kernarg_align)) * max(16, info.kernarg_align)
            offsets.append(top)
            top += len(a)
        block, view = self.agent.kernarg(max(top, 16))
        for off, a in zip(offsets, args):
            view[off : off + len(a)] = np.frombuffer(a, np.uint8)
        signal = self.agent.signal(0)
        bits = barriers(accesses)
        packets = []
        for i, ((launch, info, kobj, groups), off, bit) in enumerate(zip(launches, offsets, bits)):
            p = dispatch(info, launch.kernel.threads, groups, kobj, block + off, barrier=bit)
            last = i == len(launches) - 1
            p = replace(
                p,
                completion_signal=signal if last else 0,
                acquire=FENCE_SCOPE_SYSTEM if i == 0 else FENCE_SCOPE_AGENT,
                release=FENCE_SCOPE_SYSTEM if last else FENCE_SCOPE_AGENT,
            )
            packets.append(encode(p))
        outputs = {}
        for name, k in computed_outputs(g.outputs, sp, bound).items():
            addr, _ = where(k)
            outputs[name] = (addr, np.dtype(storage_dtype(values[k].dtype)), tuple(sp.shapes[k]))
        step = RocmStep(
            sp,
            packets,
            signal,
            arena,
            inputs_at,
            np.zeros(max(total, ALIGN), np.uint8),
            layout,
            outputs,
            block,
            self._binding,
            [l.label or l.kernel.name for l, *_ in launches],
            bits,
            owned,
        )
        self._steps[key] = step
        return step

    # -- replay ---------------------------------------------------------------------------------
    def replay(self, step: RocmStep, inputs: Mapping[str, np.ndarray], timeout: float = 60.0) -> None:
        for name, (off, dtype, shape) in step.layout.items():
            if name not in inputs:
                raise PootError(f"missing input '{name}'")
            a = np.asarray(inputs[name])
            if a.shape != shape:
                raise PootError(f"input '{name}' has shape {a.shape}; this step was captured for {shape}")
            n = a.size * dtype.itemsize
            step.staging[off : off + n] = np.ascontiguousarray(a, dtype=dtype).reshape(-1).view(np.uint8)
        self.agent.upload(step.inputs_at, step.staging)
        if not step.packets:
            return
        self.agent.store_signal(step.signal, 1)
        deadline = time.monotonic() + timeout
        at = 0
        while at < len(step.packets):
            room = self.ring.free()
            if room == 0:
                if time.monotonic() > deadline:
                    raise PootError(f"the AQL queue took no packet for {timeout:.0f} s: the GPU is hung or gone (check dmesg and rocm-smi)")
                time.sleep(0)
                continue
            self.ring.publish(step.packets[at : at + room])
            at += room
        self.agent.wait(step.signal, max(1.0, deadline - time.monotonic()))

    def read(self, step: RocmStep, name: str) -> np.ndarray:
        if name not in step.outputs:
            raise PootError(f"output '{name}' is not computed in this step (its launch is conditional on the step's symbols)")
        addr, dtype, shape = step.outputs[name]
        v = self.plan.graph.outputs[name]
        root = step.storage.roots[(v.node.id, v.index)]
        if root in self._pools:  # a pool: refresh the caller's host copy
            ptr, host = self._pools[root]
            self.agent.download(ptr, host)
            return host
        out = np.empty(shape, dtype)
        self.agent.download(addr, out)
        return out

    # -- lifetime -------------------------------------------------------------------------------
    def _free_step(self, step: RocmStep) -> None:
        for ptr in step.owned:
            self.agent.free(ptr)
        self.agent.free_kernarg(step.kernarg_block)
        self.agent.destroy_signal(step.signal)

    def close(self) -> None:
        agent = getattr(self, "agent", None)
        if agent is None:
            return
        for step in getattr(self, "_steps", {}).values():
            self._free_step(step)
        self._steps = {}
        for ptr in getattr(self, "_device_memory", []):
            agent.free(ptr)
        self._device_memory = []
        self._weights, self._consts, self._fixed, self._pools = {}, {}, {}, {}
        agent.close()
        self.agent = None  # type: ignore[assignment]
