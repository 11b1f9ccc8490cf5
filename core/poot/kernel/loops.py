"""Grid to loops: a kernel's workgroup grid and thread block as loops in one thread of work.

A processor with no threads of its own (an NPU's AIE core, which runs one instruction stream over
its local memory) runs a GPU-style kernel as loops: ``grid_to_loops`` turns a kernel into one that
takes a range of its workgroups (``GROUPS``: the grid's size and the range, as scalars) and runs each
workgroup's threads as loops. Statements between two barriers become one loop over the threads, so
every thread finishes what comes before a barrier before any starts what comes after: the barrier
becomes a loop boundary. A local that one such loop sets and another reads becomes a per-thread
array in workgroup memory (which becomes the core's local memory); workgroup arrays stay what they
are. A barrier under control flow that depends on the thread (a condition or a loop bound that may
differ between threads) has no such boundary: that kernel is refused by name.

A subgroup is one thread in the looped form (a reduction over it is its value, a shuffle gives the
thread its own), as on the host: kernels written for wider subgroups are not given to such a
processor. Asynchronous copies become loads and stores; waits for the launch before and prefetches
do nothing there. Matrix tiles and a target's own statements are refused.

The pass is target-independent: the looped form compiles for the host, where the kernel suites run
it against the CPU oracle.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from ..errors import Refusal
from ..graph import dtypes as dt
from .ir import (
    Assign,
    AtomicAdd,
    AwaitPrior,
    Barrier,
    Bin,
    Builtin,
    Const,
    CopyAsync,
    CopyAsyncSync,
    Expr,
    For,
    If,
    Kernel,
    Let,
    Load,
    MmaTile,
    Prefetch,
    Ref,
    ScalarParam,
    Shared,
    Stmt,
    Store,
    SubgroupReduce,
    SubgroupShuffle,
    TargetStmt,
    VecLoad,
)
from .verify import uses_barriers

__all__ = ["grid_to_loops", "GROUPS", "group_range"]

I32 = dt.i32
# the looped kernel's extra scalars: the grid's size, and the range of its workgroups (linearised, x
# fastest) this call runs
GROUPS = ("loops_groups_x", "loops_groups_y", "loops_groups_z", "loops_group_start", "loops_group_stop")
_T, _G = "loops_thread", "loops_group"
_GID = ("loops_group_x", "loops_group_y", "loops_group_z")


def group_range(grid: tuple[int, ...], start: int = 0, stop: int | None = None) -> dict[str, int]:
    """The scalars (``GROUPS``) that make a looped kernel run workgroups [start, stop) of ``grid``."""
    g = (tuple(grid) + (1, 1, 1))[:3]
    total = g[0] * g[1] * g[2]
    return dict(zip(GROUPS, (g[0], g[1], g[2], start, total if stop is None else stop)))


def _c(v: int) -> Const:
    return Const(v, I32)


def _bin(op: str, a: Expr, b: Expr) -> Expr:
    return Bin(op, a, b)


def _refs(e: Any) -> set[str]:
    """Names an expression reads."""
    if isinstance(e, Ref):
        return {e.name}
    out: set[str] = set()
    if hasattr(e, "__dataclass_fields__"):
        for f in fields(e):
            v = getattr(e, f.name)
            if isinstance(v, Expr.__args__):  # type: ignore[attr-defined]
                out |= _refs(v)
    return out


def _stmt_exprs(st: Stmt) -> list[Any]:
    out = []
    for f in fields(st):  # type: ignore[arg-type]
        v = getattr(st, f.name)
        for x in v if isinstance(v, tuple) else (v,):
            if isinstance(x, Expr.__args__):  # type: ignore[attr-defined]
                out.append(x)
    return out


def _declares(st: Stmt) -> list[str]:
    if isinstance(st, Let):
        return [st.name]
    if isinstance(st, VecLoad):
        return list(st.names)
    if isinstance(st, AtomicAdd) and st.old:
        return [st.old]
    return []


def _has_barrier(st: Stmt) -> bool:
    return isinstance(st, Barrier) or (isinstance(st, (For, If)) and uses_barriers(Kernel("x", (), (st,))))


class _Looping:
    def __init__(self, k: Kernel) -> None:
        self.k = k
        self.types: dict[str, dt.DType] = {p.name: p.dtype for p in k.params}
        self.types.update({s.name: s.dtype for s in k.shared})
        self.segments: list[list[Stmt]] = []  # barrier-free runs at workgroup level, in order
        self.declared: dict[str, set[int]] = {}  # local -> segments declaring it
        self.used: dict[str, set[int]] = {}  # name -> segments reading or assigning it (-1: workgroup level)
        self.local_types: dict[str, dt.DType] = {}
        self.varying: set[str] = set()

    def fail(self, why: str) -> Refusal:
        return Refusal(f"kernel {self.k.name}", "grid-to-loops", why)

    # -- analysis ------------------------------------------------------------------------------
    def _varies(self, e: Any) -> bool:
        if isinstance(e, Builtin):
            return e.kind in ("thread_id", "lane_id")
        if isinstance(e, Ref):
            return e.name in self.varying
        if isinstance(e, (SubgroupReduce, SubgroupShuffle)):
            return True
        return hasattr(e, "__dataclass_fields__") and any(self._varies(getattr(e, f.name)) for f in fields(e))

    def _note_types(self, body: tuple[Stmt, ...], divergent: bool) -> None:
        """Each local's type, and which locals may differ between threads (to a fixed point)."""
        for st in body:
            if isinstance(st, Let):
                self.local_types[st.name] = st.value.dtype  # type: ignore[union-attr]
            elif isinstance(st, VecLoad):
                for n in st.names:
                    self.local_types[n] = st.dtype
            elif isinstance(st, AtomicAdd) and st.old:
                self.local_types[st.old] = self.types[st.buffer]
            if isinstance(st, (Let, Assign, VecLoad, AtomicAdd)):
                if divergent or any(self._varies(v) for v in _stmt_exprs(st)) or isinstance(st, (VecLoad, AtomicAdd)):
                    self.varying.update(_declares(st) or [st.name])  # type: ignore[union-attr]
            if isinstance(st, If):
                inner = divergent or self._varies(st.cond)
                self._note_types(st.then, inner)
                self._note_types(st.orelse, inner)
            elif isinstance(st, For):
                inner = divergent or self._varies(st.start) or self._varies(st.stop)
                if inner:
                    self.varying.add(st.var)
                self._note_types(st.body, inner)

    def _split(self, body: tuple[Stmt, ...]) -> list[Any]:
        """The workgroup-level structure: ('seg', index) runs and the For/If statements that hold
        barriers (their bodies split the same way)."""
        out: list[Any] = []
        run: list[Stmt] = []

        def flush() -> None:
            if run:
                self.segments.append(list(run))
                out.append(("seg", len(self.segments) - 1))
                run.clear()

        for st in body:
            if not _has_barrier(st):
                run.append(st)
                continue
            flush()
            if isinstance(st, Barrier):
                continue
            if isinstance(st, If):
                if self._varies(st.cond):
                    raise self.fail("a barrier under a condition that depends on the thread: no loop boundary can stand for it")
                for n in _refs(st.cond):
                    self.used.setdefault(n, set()).add(-1)
                out.append(("if", st, self._split(st.then), self._split(st.orelse)))
            elif isinstance(st, For):
                if self._varies(st.start) or self._varies(st.stop):
                    raise self.fail(f"a barrier in loop '{st.var}' whose bounds depend on the thread: no loop boundary can stand for it")
                for n in _refs(st.start) | _refs(st.stop):
                    self.used.setdefault(n, set()).add(-1)
                out.append(("for", st, self._split(st.body)))
        flush()
        return out

    def _scan(self, body: list[Stmt] | tuple[Stmt, ...], seg: int) -> None:
        for st in body:
            if isinstance(st, (MmaTile, TargetStmt)):
                raise self.fail(f"{type(st).__name__} has no looped form")
            for n in _declares(st):
                self.declared.setdefault(n, set()).add(seg)
            if isinstance(st, Assign):
                self.used.setdefault(st.name, set()).add(seg)
            for e in _stmt_exprs(st):
                for n in _refs(e):
                    self.used.setdefault(n, set()).add(seg)
            if isinstance(st, If):
                self._scan(st.then, seg)
                self._scan(st.orelse, seg)
            elif isinstance(st, For):
                self._scan(st.body, seg)

    # -- rewriting -----------------------------------------------------------------------------
    def expr(self, e: Any, uniform: bool) -> Any:
        t = _c(0) if uniform else Ref(_T, I32)
        if isinstance(e, Ref) and e.name in self.arrays and e.name not in self.shadow:
            return Load(self.arrays[e.name], t, self.local_types[e.name])
        if isinstance(e, Builtin):
            x, y, _ = self.k.workgroup
            if e.kind == "thread_id":
                if uniform:
                    return _c(0)
                if e.dim == 0:
                    return t if self.k.workgroup[1:] == (1, 1) else _bin("rem", t, _c(x))
                if e.dim == 1:
                    return _bin("rem", _bin("div", t, _c(x)), _c(y))
                return _bin("div", t, _c(x * y))
            if e.kind == "group_id":
                return Ref(_GID[e.dim], I32)
            if e.kind == "num_groups":
                return Ref(GROUPS[e.dim], I32)
            if e.kind == "group_size":
                return _c(self.k.workgroup[e.dim])
            if e.kind == "lane_id":
                return _c(0)
            return _c(1)  # subgroup_size
        if isinstance(e, SubgroupReduce):
            return self.expr(e.a, uniform)
        if isinstance(e, SubgroupShuffle):
            return self.expr(e.a, uniform)
        if not hasattr(e, "__dataclass_fields__"):
            return e
        changes = {}
        for f in fields(e):
            v = getattr(e, f.name)
            if isinstance(v, Expr.__args__):  # type: ignore[attr-defined]
                nv = self.expr(v, uniform)
                if nv is not v:
                    changes[f.name] = nv
        return replace(e, **changes) if changes else e

    def stmts(self, body: list[Stmt] | tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        t = Ref(_T, I32)
        for st in body:
            if isinstance(st, (CopyAsyncSync, AwaitPrior, Prefetch)):
                continue
            if isinstance(st, CopyAsync):
                for i in range(4):
                    out.append(
                        Store(
                            st.shared,
                            _bin("add", self.expr(st.at, False), _c(i)),
                            Load(st.buffer, _bin("add", self.expr(st.index, False), _c(i)), self.types[st.buffer]),
                        )
                    )
                continue
            if isinstance(st, Let) and st.name in self.arrays:
                out.append(Store(self.arrays[st.name], t, self.expr(st.value, False)))
                continue
            if isinstance(st, Assign) and st.name in self.arrays:
                out.append(Store(self.arrays[st.name], t, self.expr(st.value, False)))
                continue
            if isinstance(st, VecLoad) and any(n in self.arrays for n in st.names):
                names = tuple(f"loops_tmp_{n}" if n in self.arrays else n for n in st.names)
                out.append(VecLoad(names, st.buffer, self.expr(st.index, False), st.dtype))
                out += [Store(self.arrays[n], t, Ref(m, st.dtype)) for n, m in zip(st.names, names) if n in self.arrays]
                continue
            if isinstance(st, AtomicAdd) and st.old in self.arrays:
                tmp = f"loops_tmp_{st.old}"
                out.append(AtomicAdd(st.buffer, self.expr(st.index, False), self.expr(st.value, False), tmp))
                out.append(Store(self.arrays[st.old], t, Ref(tmp, self.types[st.buffer])))
                continue
            if isinstance(st, If):
                out.append(If(self.expr(st.cond, False), self.stmts(st.then), self.stmts(st.orelse)))
                continue
            if isinstance(st, For):
                out.append(For(st.var, self.expr(st.start, False), self.expr(st.stop, False), self._shadowed(st.var, self.stmts, st.body), st.step))
                continue
            changes = {}
            for f in fields(st):  # type: ignore[arg-type]
                v = getattr(st, f.name)
                if isinstance(v, Expr.__args__):  # type: ignore[attr-defined]
                    changes[f.name] = self.expr(v, False)
                elif isinstance(v, tuple) and v and all(isinstance(x, Expr.__args__) for x in v):  # type: ignore[attr-defined]
                    changes[f.name] = tuple(self.expr(x, False) for x in v)
            out.append(replace(st, **changes) if changes else st)  # type: ignore[type-var]
        return tuple(out)

    def _shadowed(self, var: str, rewrite: Any, body: Any) -> tuple[Stmt, ...]:
        """``body`` rewritten where loop variable ``var`` hides a local of the same name."""
        outer = var in self.shadow
        self.shadow.add(var)
        try:
            return rewrite(body)  # type: ignore[no-any-return]
        finally:
            if not outer:
                self.shadow.discard(var)

    def workgroup(self, tree: list[Any]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for node in tree:
            if node[0] == "seg":
                out.append(For(_T, _c(0), _c(self.k.threads), self.stmts(self.segments[node[1]])))
            elif node[0] == "if":
                _, st, then, orelse = node
                out.append(If(self.expr(st.cond, True), self.workgroup(then), self.workgroup(orelse)))
            else:
                _, st, body = node
                out.append(For(st.var, self.expr(st.start, True), self.expr(st.stop, True), self._shadowed(st.var, self.workgroup, body), st.step))
        return tuple(out)

    def run(self) -> Kernel:
        k = self.k
        self._note_types(k.body, False)
        before = None
        while before != self.varying:  # a local assigned later from a varying one varies from the start
            before = set(self.varying)
            self._note_types(k.body, False)
        tree = self._split(k.body)
        for i, seg in enumerate(self.segments):
            self._scan(seg, i)
        self.arrays: dict[str, str] = {}
        self.shadow: set[str] = set()
        extra: list[Shared] = []
        for name, segs in sorted(self.declared.items()):
            if len(segs) > 1 or not self.used.get(name, set()) <= segs:
                self.arrays[name] = f"loops_local_{name}"
                extra.append(Shared(f"loops_local_{name}", self.local_types[name], k.threads))
        body = self.workgroup(tree)
        nx, ny = Ref(GROUPS[0], I32), Ref(GROUPS[1], I32)
        g = Ref(_G, I32)
        groups = For(
            _G,
            Ref(GROUPS[3], I32),
            Ref(GROUPS[4], I32),
            (
                Let(_GID[0], _bin("rem", g, nx)),
                Let(_GID[1], _bin("rem", _bin("div", g, nx), ny)),
                Let(_GID[2], _bin("div", g, _bin("mul", nx, ny))),
                *body,
            ),
        )
        params = k.params + tuple(ScalarParam(n, I32) for n in GROUPS)
        return Kernel(f"{k.name}_loops", params, (groups,), (1, 1, 1), k.shared + tuple(extra), k.meta)


def grid_to_loops(k: Kernel) -> Kernel:
    """``k`` as one thread of work over a range of its workgroups (``GROUPS``; ``group_range`` gives
    them for a grid): ``Refusal`` naming the kernel where a barrier cannot become a loop boundary or
    a statement has no looped form."""
    return _Looping(k).run()
