"""The host executor: kernels JIT-loaded once; weights bound zero-copy from the mapped checkpoint;
a captured step is a table of native launches over one activation arena (sized by the planner's
peak), replayed by a persistent team of threads with no Python work per kernel."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from poot.backend import (
    Buffer,
    Executor,
    HostKernel,
    Peak,
    Plan,
    StoragePlan,
    as_read,
    compile_kernels,
    host_target,
    plan_storage,
    storage_dtype,
    stored_nbytes,
    weight_array,
    weight_dtype,
)
from poot.errors import PootError

from .chain import NativeChain, ThreadTeam, records_table

__all__ = ["HostExecutor", "HostStep", "default_threads"]

Key = tuple[int, int]


def default_threads() -> int:
    """``POOT_THREADS`` if set, else the cores this process may run on."""
    env = os.environ.get("POOT_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise PootError(f"POOT_THREADS={env!r} is not a number of threads") from None
        if n < 1:
            raise PootError(f"POOT_THREADS={env!r}: use 1 or more")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _aligned(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]


def _slot(value: float | int, dtype_name: str) -> int:
    """A scalar argument as the packed entry reads it from a 64-bit slot."""
    if dtype_name == "f32":
        return struct.unpack("<i", struct.pack("<f", float(value)))[0]
    if dtype_name == "f64":
        return struct.unpack("<q", struct.pack("<d", float(value)))[0]
    return int(value)


@dataclass
class HostStep:
    """A captured step: its storage, input buffers, output views and the launch table."""

    storage: StoragePlan
    arena: np.ndarray
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    records: np.ndarray
    names: list[str]
    barriers: int
    keep: list[np.ndarray] = field(default_factory=list)  # argument slots and small arrays the table points at
    binding: int = 0

    @property
    def arena_bytes(self) -> int:
        return int(self.arena.nbytes)


class HostExecutor(Executor):
    """Runs a plan on the host CPU with ``threads`` threads (default: ``default_threads()``)."""

    def __init__(self, plan: Plan, threads: int | None = None, progress: bool = False) -> None:
        super().__init__(plan)
        self._peak: Peak | None = None
        target = host_target()

        by_value: dict[str, list[int]] = {}  # equal kernels (by value) share one compiled copy
        for k in {id(l.kernel): l.kernel for l in plan.launches}.values():
            by_value.setdefault(repr(k), []).append(id(k))
        objects = {id(l.kernel): l.kernel for l in plan.launches}
        self._kernels: dict[int, HostKernel] = {}  # by id of the plan's kernel objects (the plan keeps them alive)
        groups = list(by_value.values())
        arts = compile_kernels([objects[ids[0]] for ids in groups], target, progress)  # in parallel: the first load waits for the longest
        for ids, art in zip(groups, arts):
            hk = HostKernel(objects[ids[0]], art)
            for i in ids:
                self._kernels[i] = hk
        self.threads = threads or default_threads()
        self._team = ThreadTeam(NativeChain(), self.threads)
        g = plan.graph
        self._consts: dict[Key, np.ndarray] = {}
        for n in g.nodes:
            if n.op == "constant":
                self._consts[(n.id, 0)] = np.ascontiguousarray(n.attrs["value"].array.astype(storage_dtype(n.attrs["dtype"])))
        self._weight_nodes = {n.attrs["name"]: n for n in g.nodes if n.op == "weight"}
        self._weights: dict[Key, np.ndarray] = {}  # as the plan reads them (``Plan.layouts``)
        self._given: dict[Key, np.ndarray] = {}  # as bind was given them
        self._pools: dict[Key, np.ndarray] = {}
        self._binding = 0
        self._steps: dict[tuple[tuple[str, int], ...], HostStep] = {}

    # -- persistent buffers ---------------------------------------------------------------------
    def _check(self, kind: str, name: str, a: np.ndarray, want_dtype: np.dtype, want_bytes: int) -> np.ndarray:
        a = np.asarray(a)
        if a.dtype != want_dtype and not (want_dtype == np.uint8 and a.dtype.kind in "ui" and a.itemsize == 1):
            raise PootError(f"{kind} '{name}': the plan reads {want_dtype}, got {a.dtype}")
        if a.nbytes != want_bytes:
            raise PootError(f"{kind} '{name}': the plan reads {want_bytes} bytes, got an array of {a.nbytes} ({a.shape})")
        if not a.flags.c_contiguous:
            raise PootError(f"{kind} '{name}' must be C-contiguous")
        return a

    def bind(self, weights: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray] | None = None) -> None:
        changed = False
        for name, n in self._weight_nodes.items():
            if name not in weights:
                raise PootError(f"weight '{name}' is not bound (the plan reads it)")
            v = n.outputs[0]
            a = weights[name]
            if self._given.get((n.id, 0)) is a:
                continue
            want = stored_nbytes(v)
            read = as_read(name, a, self.plan.layouts.get(name))  # laid out here when given as stored
            self._weights[(n.id, 0)] = self._check("weight", name, weight_array(v, read), weight_dtype(v.dtype), want)
            self._given[(n.id, 0)] = a
            changed = True
        inputs = self.plan.graph.inputs()
        for name, a in (pools or {}).items():
            v = inputs[name]
            key = (v.node.id, v.index)
            if self._pools.get(key) is a:
                continue
            if not a.flags.writeable:
                raise PootError(f"pool '{name}' is updated in place and must be writeable")
            self._pools[key] = self._check("pool", name, a, storage_dtype(v.dtype), a.nbytes)
            changed = True
        if changed:
            self._binding += 1

    def write_pool(self, name: str, index: int, values: np.ndarray) -> None:
        v = self.plan.inputs[name]
        pool = self._pools.get((v.node.id, v.index))
        if pool is None:
            raise PootError(f"pool '{name}' is not bound")
        pool[index] = values

    # -- capture --------------------------------------------------------------------------------
    def capture(self, env: Mapping[str, int]) -> HostStep:
        key = tuple(sorted(env.items()))
        step = self._steps.get(key)
        if step is not None and step.binding == self._binding:
            return step
        g = self.plan.graph
        sp = plan_storage(self.plan, env)
        arena = _aligned(max(sp.arena_bytes, 64))
        values = {(n.id, v.index): v for n in g.nodes for v in n.outputs}
        step_inputs: dict[str, np.ndarray] = {}
        by_root: dict[Key, np.ndarray] = {}
        for name, k in sp.inputs.items():
            buf = np.zeros(sp.shapes[k], storage_dtype(values[k].dtype))
            step_inputs[name] = by_root[k] = buf
        for name, k in sp.pools.items():
            if k not in self._pools:
                raise PootError(f"pool '{name}' is not bound: bind(weights, pools={{'{name}': ...}}) first")
            by_root[k] = self._pools[k]
        by_root.update(self._weights)
        by_root.update(self._consts)

        def array(ref: Key) -> np.ndarray:
            root = sp.roots[ref]
            if root in sp.scratch:  # working memory of the plan's own: f32 words in the arena
                off = sp.arena_offsets[root]
                return arena[off : off + sp.nbytes(root)].view(np.float32)
            v = values[ref]
            shape = sp.shapes[ref]
            if root in by_root:
                base = by_root[root]
                return base.reshape(-1).view(base.dtype)[: int(np.prod(shape))].reshape(shape) if base.shape != shape and not v.dtype.is_packed else base
            off = sp.arena_offsets[root]
            dtype = storage_dtype(v.dtype)
            count = int(np.prod(shape, dtype=np.int64))
            return arena[off : off + count * dtype.itemsize].view(dtype).reshape(shape)

        entries, names, keep = [], [], []
        written: list[tuple[int, int]] = []  # byte ranges written / read since the last barrier
        read: list[tuple[int, int]] = []
        barriers = 0

        def overlaps(rs: list[tuple[int, int]], others: list[tuple[int, int]]) -> bool:
            return any(a < d and c < b for a, b in rs for c, d in others)

        for launch in sp.launches:
            hk = self._kernels[id(launch.kernel)]
            scalars = launch.scalars(env)
            grid = (list(launch.grid(env)) + [1, 1])[:3]
            slots: list[int] = []
            reads: list[tuple[int, int]] = []
            writes: list[tuple[int, int]] = []
            for p in launch.kernel.params:
                if isinstance(p, Buffer):
                    ref = launch.buffers[p.name]
                    if isinstance(ref, np.ndarray):
                        a = np.ascontiguousarray(ref)
                        keep.append(a)
                    else:
                        a = array(ref)
                    slots.append(a.ctypes.data)
                    (reads if p.readonly else writes).append((a.ctypes.data, a.ctypes.data + max(1, a.nbytes)))
                else:
                    slots.append(_slot(scalars[p.name], p.dtype.name))
            slots.extend(grid)
            args = np.array(slots, np.int64)
            keep.append(args)
            # threads meet before a launch that touches what was written since they last met, or
            # writes what was read (arena slots are reused, so this is by bytes, not by value)
            if entries and (overlaps(reads + writes, written) or overlaps(writes, read)):
                entries[-1] = entries[-1][:3] + (True,)
                barriers += 1
                written, read = [], []
            written += writes
            read += reads
            entries.append((hk.packed_address, args.ctypes.data, int(np.prod(grid)), False))
            names.append(launch.kernel.name)
        placed = lambda k: sp.roots[k] in by_root or sp.roots[k] in sp.arena_offsets  # noqa: E731 - not: an output this step leaves out
        outputs = {name: array((v.node.id, v.index)) for name, v in g.outputs.items() if placed((v.node.id, v.index))}
        step = HostStep(sp, arena, step_inputs, outputs, records_table(entries), names, barriers, keep, self._binding)
        self._steps[key] = step
        return step

    # -- replay ---------------------------------------------------------------------------------
    def _write_inputs(self, step: HostStep, inputs: Mapping[str, np.ndarray]) -> None:
        for name, buf in step.inputs.items():
            if name not in inputs:
                raise PootError(f"missing input '{name}'")
            a = np.asarray(inputs[name])
            if a.shape != buf.shape:
                raise PootError(f"input '{name}' has shape {a.shape}; this step was captured for {buf.shape}")
            buf[...] = a

    def replay(self, step: HostStep, inputs: Mapping[str, np.ndarray]) -> None:
        self._write_inputs(step, inputs)
        self._team.run(step.records)

    def read(self, step: HostStep, name: str) -> np.ndarray:
        if name not in step.outputs:
            raise PootError(f"output '{name}' is not computed in this step (its launch is conditional on the step's symbols)")
        out = step.outputs[name]
        root = step.storage.roots[(self.plan.graph.outputs[name].node.id, self.plan.graph.outputs[name].index)]
        return out if root in self._pools else out.copy()

    def profile(self, step: HostStep, inputs: Mapping[str, np.ndarray], repeat: int = 3) -> list[tuple[str, float]]:
        """Seconds per launch: the median of ``repeat`` runs of the whole step in which the threads
        meet after every launch and the clock is read at each meeting (native code, no Python
        between launches), so each launch's time is its own and the times add up to a step."""
        self._write_inputs(step, inputs)
        self._team.run(step.records)  # a warm-up
        times = np.stack([self._team.run_timed(step.records) for _ in range(repeat)])
        return list(zip(step.names, np.median(times, axis=0).tolist()))

    def peak(self) -> Peak:
        """The host's rates, measured once: a 256 MiB copy (bytes read plus written per second) and
        numpy's f32 matrix product of 1024x1024 matrices (its BLAS on every core)."""
        if self._peak is None:
            src = np.ones(1 << 26, np.float32)
            dst = np.empty_like(src)
            a = np.random.default_rng(0).standard_normal((1024, 1024), np.float32)
            copy, gemm = [], []
            for _ in range(5):
                t = time.perf_counter()
                np.copyto(dst, src)
                copy.append(time.perf_counter() - t)
                t = time.perf_counter()
                a @ a
                gemm.append(time.perf_counter() - t)
            self._peak = Peak(2 * src.nbytes / float(np.median(copy)), 2 * 1024**3 / float(np.median(gemm)), "measured: a numpy copy and f32 GEMM")
        return self._peak

    def close(self) -> None:
        self._team.close()

    def __del__(self) -> None:
        try:
            self._team.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
