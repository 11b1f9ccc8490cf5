"""A reference interpreter of Kernel IR with NVIDIA's warp-level statements (``Mma``): every thread
of a workgroup in lock step, each local a numpy array over the threads, ``If`` and ``For`` as masks.
It runs the tensor-core kernels' logic (fragment layouts, indexing, the order of their sums) on the
CPU, so their numpy tests hold here too; what only the GPU shows (registers, timing, ptxas) stays
with the device suites. Slow: meant for grids of a few workgroups.

Barriers hold by construction (all threads reach each statement together); asynchronous copies
complete when issued."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product
from typing import Any

import numpy as np

from poot.backend import dtypes as dt
from poot.backend import kir as K
from poot_ptx.statements import Hfma2, Mma, PackF16x2, WgmmaRegA, WgmmaSync

__all__ = ["run_simt"]

_NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "bool": np.bool_}


def _np(d: dt.DType) -> Any:
    return _NP.get(d.name, np.int32)


def _as(v: np.ndarray, want: Any) -> np.ndarray:
    """``v`` as element type ``want``: the same bits between 4-byte types (a word of an i32 array
    read as f32), converted otherwise."""
    want = np.dtype(want)
    if v.dtype == want:
        return v
    if v.dtype.itemsize == want.itemsize == 4:
        return v.view(want)
    return v.astype(want)


class _Group:
    """One workgroup's threads in lock step."""

    def __init__(self, k: K.Kernel, group: tuple[int, int, int], grid: tuple[int, int, int], mem: dict[str, np.ndarray], scalars: Mapping[str, Any]):
        self.k, self.group, self.grid = k, group, grid
        self.t = k.threads
        tid = np.arange(self.t, dtype=np.int32)
        bx, by, _ = k.workgroup
        self.tid = (tid % bx, (tid // bx) % by, tid // (bx * by))
        self.mem = dict(mem)
        for sh in k.shared:
            self.mem[sh.name] = np.zeros(sh.size, _np(sh.dtype))
        self.vars: dict[str, np.ndarray] = {}
        for p in k.scalars:
            self.vars[p.name] = np.full(self.t, scalars[p.name], _np(p.dtype))

    # -- expressions --------------------------------------------------------------------------------
    def full(self, v: Any, d: dt.DType) -> np.ndarray:
        return np.full(self.t, v, _np(d))

    def idx(self, e: K.Expr, mask: np.ndarray, size: int, what: str) -> np.ndarray:
        i = self.ev(e, mask).astype(np.int64)
        bad = mask & ((i < 0) | (i >= size))
        if bad.any():
            raise IndexError(f"{self.k.name}: {what}[{i[bad][0]}] out of its {size} elements (thread {np.flatnonzero(bad)[0]}, group {self.group})")
        return np.where(mask, i, 0)

    def ev(self, e: K.Expr, mask: np.ndarray) -> np.ndarray:  # noqa: C901 - one case an expression
        if isinstance(e, K.Const):
            return self.full(e.value, e.dtype)
        if isinstance(e, K.Ref):
            return self.vars[e.name]
        if isinstance(e, K.Builtin):
            if e.kind == "thread_id":
                return self.tid[e.dim]
            if e.kind == "group_id":
                return self.full(self.group[e.dim], dt.i32)
            if e.kind == "num_groups":
                return self.full(self.grid[e.dim], dt.i32)
            if e.kind == "group_size":
                return self.full(self.k.workgroup[e.dim], dt.i32)
            if e.kind == "lane_id":
                return (np.arange(self.t) % 32).astype(np.int32)
            return self.full(32, dt.i32)
        if isinstance(e, K.Bin):
            return _bin(e.op, self.ev(e.a, mask), self.ev(e.b, mask))
        if isinstance(e, K.Un):
            return _un(e.op, self.ev(e.a, mask))
        if isinstance(e, K.Cast):
            a = self.ev(e.a, mask)
            if e.dtype == dt.i32 and a.dtype == np.float32:
                with np.errstate(invalid="ignore"):
                    return np.trunc(a).astype(np.int32)
            return a.astype(_np(e.dtype))
        if isinstance(e, K.Bitcast):
            return self.ev(e.a, mask).view(_np(e.dtype))
        if isinstance(e, K.HalfToF32):
            return (self.ev(e.a, mask) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
        if isinstance(e, K.Select):
            return np.where(self.ev(e.cond, mask), self.ev(e.a, mask), self.ev(e.b, mask))
        if isinstance(e, K.Load):
            arr = self.mem[e.buffer]
            return _as(arr[self.idx(e.index, mask, arr.size, e.buffer)], _np(e.dtype))
        if isinstance(e, K.SubgroupReduce):
            a = self.ev(e.a, mask).reshape(-1, 32)
            r = {"add": a.sum, "max": a.max, "min": a.min}[e.op](axis=1, keepdims=True)
            return np.broadcast_to(r, a.shape).reshape(-1).astype(a.dtype)
        if isinstance(e, K.SubgroupShuffle):
            a, lane = self.ev(e.a, mask), self.ev(e.lane, mask)
            me = np.arange(self.t) % 32
            src = (me ^ lane) if e.xor else lane
            return a[(np.arange(self.t) // 32) * 32 + (src & 31)]
        if isinstance(e, K.Dot4I8):
            a, b, c = (self.ev(x, mask) for x in (e.a, e.b, e.c))
            s = (a.view(np.int8).reshape(-1, 4).astype(np.int32) * b.view(np.int8).reshape(-1, 4)).sum(axis=1)
            return (c + s).astype(np.int32)
        if isinstance(e, K.Fma):
            a, b, c = (self.ev(x, mask).astype(np.float64) for x in (e.a, e.b, e.c))
            return (a * b + c).astype(np.float32)
        if isinstance(e, K.PackBf16x2):
            lo, hi = (_bf16(self.ev(x, mask)) for x in (e.a, e.b))
            return (lo | (hi << 16)).astype(np.uint32).view(np.int32)
        raise NotImplementedError(f"simt: expression {type(e).__name__}")

    # -- statements ---------------------------------------------------------------------------------
    def run(self, body: Sequence[K.Stmt], mask: np.ndarray) -> None:  # noqa: C901 - one case a statement
        for st in body:
            if not mask.any() and not isinstance(st, K.Let):
                continue
            if isinstance(st, (K.Let, K.Assign)):
                v = self.ev(st.value, mask)
                old = self.vars.get(st.name)
                if old is None or old.dtype != v.dtype:
                    old = np.zeros(self.t, v.dtype)
                self.vars[st.name] = np.where(mask, v, old)
            elif isinstance(st, K.Store):
                arr = self.mem[st.buffer]
                i = self.idx(st.index, mask, arr.size, st.buffer)
                arr[i[mask]] = _as(self.ev(st.value, mask)[mask], arr.dtype)
            elif isinstance(st, K.VecLoad):
                arr = self.mem[st.buffer]
                n = len(st.names)
                i = self.idx(st.index, mask, arr.size - n + 1, st.buffer)
                for j, nm in enumerate(st.names):
                    v = _as(arr[i + j], _np(st.dtype))
                    old = self.vars.get(nm, np.zeros(self.t, v.dtype))
                    self.vars[nm] = np.where(mask, v, old.astype(v.dtype))
            elif isinstance(st, K.VecStore):
                arr = self.mem[st.buffer]
                n = len(st.values)
                i = self.idx(st.index, mask, arr.size - n + 1, st.buffer)
                for j, e in enumerate(st.values):
                    arr[(i + j)[mask]] = _as(self.ev(e, mask)[mask], arr.dtype)
            elif isinstance(st, K.If):
                c = self.ev(st.cond, mask).astype(bool)
                self.run(st.then, mask & c)
                if st.orelse:
                    self.run(st.orelse, mask & ~c)
            elif isinstance(st, K.For):
                v = self.ev(st.start, mask).copy()
                stop = self.ev(st.stop, mask)
                while True:
                    live = mask & (v < stop)
                    if not live.any():
                        break
                    self.vars[st.var] = v.copy()
                    self.run(st.body, live)
                    v = v + st.step
            elif isinstance(st, K.CopyAsync):
                dst, src = self.mem[st.shared], self.mem[st.buffer]
                at = self.idx(st.at, mask, dst.size - 3, st.shared)
                i = self.idx(st.index, mask, src.size - 3, st.buffer)
                for j in range(4):
                    dst[(at + j)[mask]] = _as(src[(i + j)[mask]], dst.dtype)
            elif isinstance(st, (K.Barrier, K.CopyAsyncSync, K.AwaitPrior, K.Prefetch, K.Fence, WgmmaSync)):  # products complete when issued
                pass
            elif isinstance(st, K.AtomicAdd):
                arr = self.mem[st.buffer]
                i = self.idx(st.index, mask, arr.size, st.buffer)
                val = self.ev(st.value, mask)
                if st.old:  # the value each thread's add found, the threads' adds in order
                    before = np.zeros(self.t, arr.dtype)
                    for t in np.flatnonzero(mask):
                        before[t] = arr[i[t]]
                        arr[i[t]] += val[t].astype(arr.dtype)
                    self.vars[st.old] = before
                else:
                    np.add.at(arr, i[mask], val[mask].astype(arr.dtype))
            elif isinstance(st, Mma):
                self.mma(st, mask)
            elif isinstance(st, WgmmaRegA):
                self.wgmma_reg_a(st, mask)
            elif isinstance(st, Hfma2):
                a, b, c = (_halves(self.ev(e, mask)).astype(np.float64) for e in (st.a, st.b, st.c))
                self.set(st.out, _pack_halves((a * b + c).astype(np.float16)), mask)  # one rounding: f16 products are exact in f64
            elif isinstance(st, PackF16x2):
                lo, hi = (self.ev(e, mask).astype(np.float16) for e in (st.lo, st.hi))
                self.set(st.out, _pack_halves(np.stack([lo, hi], axis=-1)), mask)
            else:
                raise NotImplementedError(f"simt: statement {type(st).__name__}")

    def set(self, name: str, v: np.ndarray, mask: np.ndarray) -> None:
        self.vars[name] = np.where(mask, v, self.vars[name])

    def wgmma_reg_a(self, st: WgmmaRegA, mask: np.ndarray) -> None:
        """wgmma with A's fragment in registers: each warpgroup's 64 x 16 A from its four warps'
        m16n8k16 fragments, B (n x 16 f16) from workgroup memory by the descriptor's layout."""
        if not mask.all():
            raise RuntimeError(f"{self.k.name}: wgmma reached by part of a workgroup")
        groups, n = self.t // 128, 2 * len(st.acc)
        a = _from_f16(np.stack([self.ev(e, mask) for e in st.a])).reshape(4, groups, 4, 8, 4, 2)  # reg, group, warp, g, t, pair
        A = np.zeros((groups, 64, 16))
        for t, j in product(range(4), range(2)):
            for w in range(4):
                A[:, 16 * w : 16 * w + 8, 2 * t + j] = a[0, :, w, :, t, j]
                A[:, 16 * w + 8 : 16 * w + 16, 2 * t + j] = a[1, :, w, :, t, j]
                A[:, 16 * w : 16 * w + 8, 8 + 2 * t + j] = a[2, :, w, :, t, j]
                A[:, 16 * w + 8 : 16 * w + 16, 8 + 2 * t + j] = a[3, :, w, :, t, j]
        mem = self.mem[st.b].view(np.uint8)
        off = self.ev(st.b_offset, mask).reshape(groups, 128)[:, 0].astype(np.int64)
        r, k = np.arange(n)[:, None], np.arange(16)[None, :]
        at = (r // 8) * st.sbo + (k // 8) * st.lbo + (r % 8) * 16 + (k % 8) * 2  # n x 16 bytes
        B = np.stack([mem[(o + at)[..., None] + np.arange(2)].copy().view(np.float16)[..., 0] for o in off]).astype(np.float64)
        D = A @ B.transpose(0, 2, 1)  # groups, 64, n
        acc = np.stack([self.vars[nm] for nm in st.acc]).reshape(n // 8, 4, groups, 4, 8, 4)  # j, c, group, warp, g, t
        out = np.empty_like(acc, dtype=np.float64)
        for j, c, w in product(range(n // 8), range(4), range(4)):
            rows = slice(16 * w + 8 * (c // 2), 16 * w + 8 * (c // 2) + 8)
            out[j, c, :, w] = D[:, rows, 8 * j + (c % 2) : 8 * j + 8 : 2]  # (group, g, t): column 8 j + 2 t + c % 2
        res = (out + (acc.astype(np.float64) if st.accumulate else 0.0)).astype(np.float32)
        for q, nm in enumerate(st.acc):
            self.vars[nm] = res.reshape(len(st.acc), -1)[q]

    def mma(self, st: Mma, mask: np.ndarray) -> None:
        """PTX's m16n8k16 (bf16, f16), m16n8k32 (s8) and m16n8k8 (tf32) fragment layouts, a warp at a time."""
        if not mask.all():
            raise RuntimeError(f"{self.k.name}: mma.sync reached by part of a workgroup")
        warps = self.t // 32
        a = np.stack([self.ev(e, mask) for e in st.a]).reshape(4, warps, 8, 4)  # reg, warp, g, t
        b = np.stack([self.ev(e, mask) for e in st.b]).reshape(2, warps, 8, 4)
        acc = np.stack([self.vars[nm] for nm in st.acc]).reshape(4, warps, 8, 4)
        if st.dtype == dt.i8:
            kk, per = 32, 4
            av = a.astype(np.int32).view(np.int8).reshape(4, warps, 8, 4, 4).astype(np.int64)
            bv = b.astype(np.int32).view(np.int8).reshape(2, warps, 8, 4, 4).astype(np.int64)
        elif st.dtype == dt.f32:  # tf32: the top 19 bits of each value
            kk, per = 8, 1
            tf32 = lambda v: (v.astype(np.int32) & np.int32(-8192)).view(np.float32).astype(np.float64)  # noqa: E731
            av = tf32(a).reshape(4, warps, 8, 4, 1)
            bv = tf32(b).reshape(2, warps, 8, 4, 1)
        else:
            kk, per = 16, 2
            conv = _from_bf16 if st.dtype == dt.bf16 else _from_f16
            av = conv(a).reshape(4, warps, 8, 4, 2)
            bv = conv(b).reshape(2, warps, 8, 4, 2)
        A = np.zeros((warps, 16, kk), av.dtype)
        B = np.zeros((warps, kk, 8), bv.dtype)
        half = kk // 2
        for t, j in product(range(4), range(per)):
            col = per * t + j
            A[:, 0:8, col] = av[0, :, :, t, j]
            A[:, 8:16, col] = av[1, :, :, t, j]
            A[:, 0:8, half + col] = av[2, :, :, t, j]
            A[:, 8:16, half + col] = av[3, :, :, t, j]
            B[:, col, :] = bv[0, :, :, t, j]
            B[:, half + col, :] = bv[1, :, :, t, j]
        C = A @ B  # warps, 16, 8
        out = np.empty((4, warps, 8, 4), C.dtype)
        for t in range(4):
            out[0, :, :, t] = C[:, 0:8, 2 * t]
            out[1, :, :, t] = C[:, 0:8, 2 * t + 1]
            out[2, :, :, t] = C[:, 8:16, 2 * t]
            out[3, :, :, t] = C[:, 8:16, 2 * t + 1]
        if st.dtype == dt.i8:
            res = (acc.astype(np.int64) + out).astype(np.int32)  # wraps as the hardware's s32 sums do
        else:
            res = (acc.astype(np.float64) + out).astype(np.float32)
        for q, nm in enumerate(st.acc):
            self.vars[nm] = res[q].reshape(-1)


def _bin(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op in K.CMP_OPS:
        return {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}[op](a, b)
    if a.dtype == np.bool_:
        return {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[op](a, b)
    if a.dtype == np.float32:
        with np.errstate(all="ignore"):
            f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "min": np.minimum, "max": np.maximum, "pow": np.power}
            return f[op](a, b.astype(np.float32)).astype(np.float32)
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if op in ("div", "rem"):
        safe = np.where(b64 == 0, 1, b64)
        q = np.abs(a64) // np.abs(safe) * np.sign(a64) * np.sign(safe)
        r = q if op == "div" else a64 - q * safe
    elif op == "shl":
        r = a64 << (b64 & 31)
    elif op == "shr":
        r = a.astype(np.int32) >> (b64 & 31).astype(np.int32)
    else:
        r = {
            "add": np.add,
            "sub": np.subtract,
            "mul": np.multiply,
            "min": np.minimum,
            "max": np.maximum,
            "and": np.bitwise_and,
            "or": np.bitwise_or,
            "xor": np.bitwise_xor,
        }[op](a64, b64)
    return (np.asarray(r, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def _un(op: str, a: np.ndarray) -> np.ndarray:
    if op == "not":
        return ~a
    if op == "neg":
        return -a
    if op == "abs":
        return np.abs(a)
    f = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "tanh": np.tanh}
    f.update({"floor": np.floor, "rint": np.rint, "rsqrt": lambda v: 1 / np.sqrt(v), "recip": lambda v: 1 / v})
    with np.errstate(all="ignore"):
        return f[op](a.astype(np.float32)).astype(np.float32)


def _bf16(v: np.ndarray) -> np.ndarray:
    bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _from_bf16(w: np.ndarray) -> np.ndarray:
    u = w.astype(np.int32).view(np.uint32)
    pair = np.stack([u & 0xFFFF, u >> 16], axis=-1).astype(np.uint32) << 16
    return pair.view(np.float32).astype(np.float64)


def _halves(w: np.ndarray) -> np.ndarray:
    """i32 words as pairs of f16 values [..., 2], the low half first."""
    return w.astype(np.int32).view(np.float16).reshape(*w.shape, 2)


def _pack_halves(h: np.ndarray) -> np.ndarray:
    """Pairs of f16 values [..., 2] as i32 words, the first in the low half."""
    return np.ascontiguousarray(h.astype(np.float16)).view(np.int32).reshape(h.shape[:-1])


def _from_f16(w: np.ndarray) -> np.ndarray:
    return w.astype(np.int32).view(np.float16).astype(np.float64)


def run_simt(k: K.Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, Any] | None = None) -> None:
    """Run kernel ``k`` over ``grid`` on ``buffers`` (numpy arrays, written in place; each viewed as
    its parameter's element type, as a device binds their bytes)."""
    mem: dict[str, np.ndarray] = {}
    for p in k.buffers:
        arr = buffers[p.name]
        flat = arr.reshape(-1)
        want = np.dtype(_np(p.dtype))
        # bytes or halves bound as words (packed weights, f16 pools) are read as the kernel's elements
        mem[p.name] = flat.view(want) if flat.dtype != want and flat.nbytes % want.itemsize == 0 else flat
    g = (tuple(grid) + (1, 1))[:3]
    for group in product(range(g[0]), range(g[1]), range(g[2])):
        _Group(k, group, g, mem, scalars or {}).run(k.body, np.ones(k.threads, bool))  # type: ignore[arg-type]
