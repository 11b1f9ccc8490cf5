"""The Kernel IR verifier: catches malformed kernels before any LLVM is emitted (LLVM aborts the process
on malformed input, so nothing may reach it unchecked)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

from ..errors import PootError
from ..graph import dtypes as dt
from .ir import (
    BIN_OPS,
    BUILTINS,
    CMP_OPS,
    COPY_SYNC,
    UN_OPS,
    Assign,
    AtomicAdd,
    AwaitPrior,
    Barrier,
    Bin,
    Bitcast,
    Buffer,
    Builtin,
    Cast,
    Const,
    CopyAsync,
    CopyAsyncSync,
    Dot4I8,
    Expr,
    Fence,
    Fma,
    For,
    HalfToF32,
    If,
    Kernel,
    Let,
    Load,
    LoadWord,
    MmaTile,
    PackBf16x2,
    Prefetch,
    Ref,
    ScalarParam,
    Select,
    Shared,
    Stmt,
    Store,
    SubgroupReduce,
    SubgroupShuffle,
    TargetStmt,
    Un,
    VecLoad,
    VecStore,
)

__all__ = ["KernelError", "StmtCheck", "verify_kernel", "awaits_prior", "uses_barriers", "uses_subgroups", "shared_alignment"]

SCALAR_TYPES = (dt.f32, dt.f16, dt.bf16, dt.i32, dt.i64, dt.i8, dt.u8, dt.boolean, dt.f64)
FLOAT_ONLY = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "floor", "rint", "erf", "recip", "pow"}
INT_ONLY = {"and", "or", "xor", "shl", "shr", "rem"}


class KernelError(PootError):
    """A malformed kernel, named with the statement or expression at fault."""


class _Scope:
    def __init__(self, k: Kernel) -> None:
        self.k = k
        self.vars: dict[str, dt.DType] = {p.name: p.dtype for p in k.scalars}
        self.buffers = {p.name: p for p in k.buffers}
        self.shared = {s.name: s for s in k.shared}
        self.varying: set[str] = set()  # locals whose value may differ between threads

    def fail(self, where: str, msg: str) -> KernelError:
        return KernelError(f"kernel {self.k.name}: {where}: {msg}")


def _expr(s: _Scope, e: Expr, where: str) -> tuple[dt.DType, bool]:
    """(type, varies between threads) of ``e``."""
    if isinstance(e, Const):
        if e.dtype not in SCALAR_TYPES:
            raise s.fail(where, f"constant of unsupported type {e.dtype}")
        return e.dtype, False
    if isinstance(e, Ref):
        if e.name not in s.vars:
            raise s.fail(where, f"'{e.name}' is not defined here")
        if s.vars[e.name] != e.dtype:
            raise s.fail(where, f"'{e.name}' is {s.vars[e.name]}, used as {e.dtype}")
        return e.dtype, e.name in s.varying
    if isinstance(e, Builtin):
        if e.kind not in BUILTINS or not 0 <= e.dim <= 2:
            raise s.fail(where, f"unknown builtin {e.kind}({e.dim})")
        return dt.i32, e.kind in ("thread_id", "lane_id")
    if isinstance(e, Bin):
        ta, va = _expr(s, e.a, where)
        tb, vb = _expr(s, e.b, where)
        if e.op not in BIN_OPS and e.op not in CMP_OPS:
            raise s.fail(where, f"unknown operator {e.op}")
        if ta != tb:
            raise s.fail(where, f"operands of {e.op} differ: {ta} vs {tb} (cast one)")
        if e.op in FLOAT_ONLY and not ta.is_float:
            raise s.fail(where, f"{e.op} needs float operands, got {ta}")
        if e.op in INT_ONLY and not (ta.is_int or (ta == dt.boolean and e.op in ("and", "or", "xor"))):
            raise s.fail(where, f"{e.op} needs integer operands, got {ta}")
        return e.dtype, va or vb
    if isinstance(e, Un):
        t, v = _expr(s, e.a, where)
        if e.op not in UN_OPS:
            raise s.fail(where, f"unknown function {e.op}")
        if e.op in FLOAT_ONLY and not t.is_float:
            raise s.fail(where, f"{e.op} needs a float operand, got {t}")
        if e.op == "not" and t != dt.boolean and not t.is_int:
            raise s.fail(where, f"not needs a bool or integer operand, got {t}")
        return t, v
    if isinstance(e, Cast):
        _, v = _expr(s, e.a, where)
        if e.dtype not in SCALAR_TYPES:
            raise s.fail(where, f"cast to unsupported type {e.dtype}")
        return e.dtype, v
    if isinstance(e, Bitcast):
        t, v = _expr(s, e.a, where)
        if {t, e.dtype} != {dt.i32, dt.f32}:
            raise s.fail(where, f"bitcast is i32 <-> f32 only, got {t} -> {e.dtype}")
        return e.dtype, v
    if isinstance(e, HalfToF32):
        t, v = _expr(s, e.a, where)
        if t != dt.i32:
            raise s.fail(where, f"half_to_f32 reads the low 16 bits of an i32, got {t}")
        return dt.f32, v
    if isinstance(e, Select):
        tc, vc = _expr(s, e.cond, where)
        ta, va = _expr(s, e.a, where)
        tb, vb = _expr(s, e.b, where)
        if tc != dt.boolean:
            raise s.fail(where, f"select condition must be bool, got {tc}")
        if ta != tb:
            raise s.fail(where, f"select branches differ: {ta} vs {tb}")
        return ta, vc or va or vb
    if isinstance(e, Load):
        mem = s.buffers.get(e.buffer) or s.shared.get(e.buffer)
        if mem is None:
            raise s.fail(where, f"'{e.buffer}' is not a buffer or shared array")
        if mem.dtype != e.dtype:
            raise s.fail(where, f"'{e.buffer}' holds {mem.dtype}, loaded as {e.dtype}")
        ti, vi = _expr(s, e.index, where)
        if ti != dt.i32:
            raise s.fail(where, f"index into '{e.buffer}' must be i32, got {ti}")
        return e.dtype, vi  # every thread reading one address sees one value
    if isinstance(e, LoadWord):
        mem = s.buffers.get(e.buffer)
        if mem is None or mem.dtype != dt.u8:
            raise s.fail(where, f"load_word reads a u8 buffer; '{e.buffer}' is not one")
        ti, vi = _expr(s, e.index, where)
        if ti != dt.i32:
            raise s.fail(where, f"index into '{e.buffer}' must be i32, got {ti}")
        return dt.i32, vi
    if isinstance(e, SubgroupReduce):
        t, _ = _expr(s, e.a, where)
        if e.op not in ("add", "max", "min"):
            raise s.fail(where, f"subgroup reduce op must be add, max or min, got {e.op}")
        return t, False
    if isinstance(e, SubgroupShuffle):
        t, _ = _expr(s, e.a, where)
        tl, _ = _expr(s, e.lane, where)
        if tl != dt.i32:
            raise s.fail(where, f"shuffle lane must be i32, got {tl}")
        return t, True
    if isinstance(e, Dot4I8):
        parts = [_expr(s, x, where) for x in (e.a, e.b, e.c)]
        if any(t != dt.i32 for t, _ in parts):
            raise s.fail(where, f"dot4_i8 takes i32 words, got {[str(t) for t, _ in parts]}")
        return dt.i32, any(v for _, v in parts)
    if isinstance(e, Fma):
        parts = [_expr(s, x, where) for x in (e.a, e.b, e.c)]
        if any(t != dt.f32 for t, _ in parts):
            raise s.fail(where, f"fma takes f32 values, got {[str(t) for t, _ in parts]}")
        return dt.f32, any(v for _, v in parts)
    if isinstance(e, PackBf16x2):
        parts = [_expr(s, x, where) for x in (e.a, e.b)]
        if any(t != dt.f32 for t, _ in parts):
            raise s.fail(where, f"pack_bf16x2 takes f32 values, got {[str(t) for t, _ in parts]}")
        return dt.i32, any(v for _, v in parts)
    raise s.fail(where, f"not an expression: {e!r}")


class StmtCheck:
    """What a target's own statement (``TargetStmt.check``) sees of the kernel around it: the
    types of its locals and workgroup arrays, its expressions' types, whether the threads of a
    workgroup may differ in reaching it (``divergent``), and ``fail`` for its error."""

    def __init__(self, s: _Scope, where: str, divergent: bool) -> None:
        self._s, self._where, self.divergent = s, where, divergent
        self.threads = s.k.threads

    def fail(self, reason: str) -> KernelError:
        """The error to raise: the kernel, the statement's place and ``reason``."""
        return self._s.fail(self._where, reason)

    def local(self, name: str) -> dt.DType | None:
        """The type of local ``name`` where it is declared, else None."""
        return self._s.vars.get(name)

    def shared(self, name: str) -> Shared | None:
        """Workgroup array ``name``, else None."""
        sh = self._s.shared.get(name)
        return sh if isinstance(sh, Shared) else None

    def expr(self, e: Expr) -> dt.DType:
        """The type of expression ``e`` (checked as any other)."""
        return _expr(self._s, e, self._where)[0]


def _block(s: _Scope, body: Iterable[Stmt], where: str, divergent: bool) -> None:
    declared: list[str] = []
    for i, st in enumerate(body):
        w = f"{where}[{i}] {type(st).__name__}"
        if isinstance(st, Let):
            t, v = _expr(s, st.value, w)
            if st.name in s.vars or st.name in s.buffers or st.name in s.shared:
                raise s.fail(w, f"'{st.name}' is already defined")
            s.vars[st.name] = t
            declared.append(st.name)
            if v or divergent:
                s.varying.add(st.name)
        elif isinstance(st, Assign):
            if st.name not in s.vars or st.name in {p.name for p in s.k.scalars}:
                raise s.fail(w, f"'{st.name}' is not a local variable")
            t, v = _expr(s, st.value, w)
            if t != s.vars[st.name]:
                raise s.fail(w, f"'{st.name}' is {s.vars[st.name]}, assigned {t}")
            if v or divergent:
                s.varying.add(st.name)
        elif isinstance(st, (Store, AtomicAdd)):
            mem = s.buffers.get(st.buffer) or s.shared.get(st.buffer)
            if mem is None:
                raise s.fail(w, f"'{st.buffer}' is not a buffer or shared array")
            if isinstance(mem, Buffer) and mem.readonly:
                raise s.fail(w, f"'{st.buffer}' is read-only")
            ti, _ = _expr(s, st.index, w)
            tv, _ = _expr(s, st.value, w)
            if ti != dt.i32:
                raise s.fail(w, f"index into '{st.buffer}' must be i32, got {ti}")
            if tv != mem.dtype:
                raise s.fail(w, f"'{st.buffer}' holds {mem.dtype}, stored {tv}")
            if isinstance(st, AtomicAdd) and mem.dtype not in (dt.f32, dt.i32):
                raise s.fail(w, f"atomic add needs f32 or i32, '{st.buffer}' holds {mem.dtype}")
            if isinstance(st, AtomicAdd) and st.old:
                if isinstance(mem, Shared) or st.old in s.vars or st.old in s.buffers or st.old in s.shared:
                    raise s.fail(w, f"atomic add's old value '{st.old}': a global buffer's, into a new name")
                s.vars[st.old] = mem.dtype
                declared.append(st.old)
                s.varying.add(st.old)
        elif isinstance(st, Fence):
            pass
        elif isinstance(st, If):
            tc, vc = _expr(s, st.cond, w)
            if tc != dt.boolean:
                raise s.fail(w, f"condition must be bool, got {tc}")
            _block(s, st.then, w + ".then", divergent or vc)
            _block(s, st.orelse, w + ".else", divergent or vc)
        elif isinstance(st, For):
            t0, v0 = _expr(s, st.start, w)
            t1, v1 = _expr(s, st.stop, w)
            if t0 != dt.i32 or t1 != dt.i32:
                raise s.fail(w, "loop bounds must be i32")
            if not isinstance(st.step, int) or st.step < 1:
                raise s.fail(w, f"loop step must be a positive int, got {st.step!r}")
            if st.var in s.vars:
                raise s.fail(w, f"loop variable '{st.var}' shadows an existing name")
            s.vars[st.var] = dt.i32
            if v0 or v1 or divergent:
                s.varying.add(st.var)
            _block(s, st.body, w + ".body", divergent or v0 or v1)
            del s.vars[st.var]
            s.varying.discard(st.var)
        elif isinstance(st, Barrier):
            if divergent:
                raise s.fail(w, "barrier under control flow that differs between threads (every thread must reach it)")
        elif isinstance(st, VecLoad):
            mem = s.buffers.get(st.buffer) or s.shared.get(st.buffer)
            if mem is None or mem.dtype != st.dtype:
                raise s.fail(w, f"'{st.buffer}' is not a {st.dtype} buffer or shared array")
            if len(st.names) not in (2, 4, 8):
                raise s.fail(w, f"vector width must be 2, 4 or 8, got {len(st.names)}")
            ti, v = _expr(s, st.index, w)
            if ti != dt.i32:
                raise s.fail(w, "vector load index must be i32")
            for nm in st.names:
                if nm in s.vars:
                    raise s.fail(w, f"'{nm}' is already defined")
                s.vars[nm] = st.dtype
                declared.append(nm)
                s.varying.add(nm)
        elif isinstance(st, VecStore):
            mem = s.buffers.get(st.buffer) or s.shared.get(st.buffer)
            if mem is None or (isinstance(mem, Buffer) and mem.readonly):
                raise s.fail(w, f"'{st.buffer}' is not a writable buffer or shared array")
            if len(st.values) not in (2, 4, 8):
                raise s.fail(w, f"vector width must be 2, 4 or 8, got {len(st.values)}")
            for val in st.values:
                tv, _ = _expr(s, val, w)
                if tv != mem.dtype:
                    raise s.fail(w, f"'{st.buffer}' holds {mem.dtype}, stored {tv}")
            _expr(s, st.index, w)
        elif isinstance(st, MmaTile):
            if divergent:
                raise s.fail(w, "a matrix tile operation must be reached by the whole workgroup")
            want = {st.a: (dt.f16, st.m * st.k), st.b: (dt.f16, st.k * st.n), st.c: (dt.f32, st.m * st.n)}
            for name, (t, size) in want.items():
                sh = s.shared.get(name)
                if not isinstance(sh, Shared) or sh.dtype != t or sh.size < size:
                    raise s.fail(w, f"mma operand '{name}' must be a shared {t} array of at least {size} elements")
            if (st.m, st.n, st.k) != (16, 16, 16):
                raise s.fail(w, f"mma tile must be 16x16x16, got {st.m}x{st.n}x{st.k}")
        elif isinstance(st, CopyAsync):
            sh, buf = s.shared.get(st.shared), s.buffers.get(st.buffer)
            if not isinstance(sh, Shared) or not isinstance(buf, Buffer):
                raise s.fail(w, f"an asynchronous copy goes from a buffer ('{st.buffer}') to a shared array ('{st.shared}')")
            if sh.dtype.bits != 32 or buf.dtype.bits != 32:
                raise s.fail(w, f"asynchronous copies move four 4-byte elements: '{st.buffer}' holds {buf.dtype}, '{st.shared}' {sh.dtype}")
            for e in (st.at, st.index):
                if _expr(s, e, w)[0] != dt.i32:
                    raise s.fail(w, "asynchronous copy indices must be i32")
        elif isinstance(st, CopyAsyncSync):
            if st.op not in COPY_SYNC or not 0 <= st.n <= 7:
                raise s.fail(w, f"asynchronous copy ordering is one of {COPY_SYNC} with 0 <= n <= 7, got {st.op!r} {st.n}")
        elif isinstance(st, Prefetch):
            buf = s.buffers.get(st.buffer)
            if not isinstance(buf, Buffer):
                raise s.fail(w, f"a prefetch reads a buffer, not '{st.buffer}'")
            for what, e in (("index", st.index), ("byte count", st.nbytes)):
                if _expr(s, e, w)[0] != dt.i32:
                    raise s.fail(w, f"a prefetch's {what} must be i32")
        elif isinstance(st, AwaitPrior):
            if where != "body":
                raise s.fail(w, "the wait for the launch before must be at the kernel body's top level (every thread reaches it once)")
        elif isinstance(st, TargetStmt):
            st.check(StmtCheck(s, w, divergent))
        else:
            raise s.fail(w, f"not a statement: {st!r}")
    for name in declared:
        del s.vars[name]
        s.varying.discard(name)


def verify_kernel(k: Kernel, max_threads: int = 1024) -> None:
    """Raise KernelError if ``k`` is malformed."""
    if not k.name.isidentifier():
        raise KernelError(f"kernel name {k.name!r} must be an identifier")
    names = [p.name for p in k.params] + [s.name for s in k.shared]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise KernelError(f"kernel {k.name}: names used twice: {sorted(dup)}")
    for p in k.params:
        if p.dtype not in SCALAR_TYPES:
            raise KernelError(f"kernel {k.name}: parameter '{p.name}' has unsupported type {p.dtype}")
        if isinstance(p, ScalarParam) and p.dtype == dt.boolean:
            raise KernelError(f"kernel {k.name}: scalar parameter '{p.name}' cannot be bool (use i32)")
    if any(d < 1 for d in k.workgroup) or k.threads > max_threads:
        raise KernelError(f"kernel {k.name}: workgroup {k.workgroup} must have 1..{max_threads} threads")
    for sh in k.shared:
        if sh.size < 1:
            raise KernelError(f"kernel {k.name}: shared array '{sh.name}' needs a positive size")
    _block(_Scope(k), k.body, "body", False)
    if sum(isinstance(st, AwaitPrior) for st in k.body) > 1:
        raise KernelError(f"kernel {k.name}: waits for the launch before more than once")


def _walk(body: Iterable[Stmt]):  # type: ignore[no-untyped-def]
    for st in body:
        yield st
        if isinstance(st, If):
            yield from _walk(st.then)
            yield from _walk(st.orelse)
        elif isinstance(st, For):
            yield from _walk(st.body)


def _exprs(e: Expr):  # type: ignore[no-untyped-def]
    yield e
    for f in ("a", "b", "c", "cond", "index", "lane"):
        sub = getattr(e, f, None)
        if sub is not None and not isinstance(sub, (str, int, float)):
            yield from _exprs(sub)


def awaits_prior(k: Kernel) -> bool:
    """Whether ``k`` places its own wait for the launch before (``AwaitPrior``)."""
    return any(isinstance(st, AwaitPrior) for st in k.body)


def before_wait(k: Kernel) -> tuple[frozenset[str], frozenset[str]]:
    """The buffers ``k`` reads, and those it writes, before its ``AwaitPrior`` (none without one):
    under programmatic launches the launch before may still be running there, so the planner lets
    them name only memory no launch of the step writes."""
    if not awaits_prior(k):
        return frozenset(), frozenset()
    head = list(k.body[: next(i for i, st in enumerate(k.body) if isinstance(st, AwaitPrior))])
    params = {p.name for p in k.params if isinstance(p, Buffer)}
    reads: set[str] = set()
    writes: set[str] = set()
    for st in _walk(head):
        if isinstance(st, (Store, VecStore, AtomicAdd)):
            writes.add(st.buffer)
        elif isinstance(getattr(st, "buffer", None), str):  # loads, prefetches, asynchronous copies
            reads.add(st.buffer)
        for f in fields(st):
            v = getattr(st, f.name)
            for e in v if isinstance(v, tuple) else (v,):
                if isinstance(e, Expr.__args__):  # type: ignore[attr-defined]
                    reads.update(x.buffer for x in _exprs(e) if isinstance(x, Load))
    return frozenset(reads & params), frozenset(writes & params)


def uses_barriers(k: Kernel) -> bool:
    return any(isinstance(st, Barrier) for st in _walk(k.body))


def shared_alignment(k: Kernel) -> int:
    """The bytes ``k``'s workgroup arrays must be aligned to: 16, or more where a target statement
    reads them so (``TargetStmt.shared_alignment``: a matrix unit's swizzled operands)."""
    return max([16] + [st.shared_alignment for st in _walk(k.body) if isinstance(st, TargetStmt)])


def uses_subgroups(k: Kernel) -> bool:
    for st in _walk(k.body):
        for f in ("value", "index", "cond", "start", "stop"):
            e = getattr(st, f, None)
            if e is not None and any(
                isinstance(x, (SubgroupReduce, SubgroupShuffle)) or (isinstance(x, Builtin) and x.kind in ("lane_id", "subgroup_size")) for x in _exprs(e)
            ):
                return True
    return False
