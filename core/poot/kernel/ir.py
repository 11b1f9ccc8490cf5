"""Kernel IR: a typed, structured IR for GPU-style kernels.

A kernel runs on a 3-D grid of workgroups; each workgroup is a static 3-D block of threads sharing
workgroup memory and barriers. Sizes (token counts, context lengths) are run-time scalar parameters,
so one binary serves every shape. Expressions are immutable typed trees; statements are structured
(no gotos), which keeps lowering to LLVM, to host thread loops and to SPIR-V's structured control
flow straightforward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..graph import dtypes as dt
from ..graph.dtypes import DType

__all__ = [
    "Buffer",
    "ScalarParam",
    "Shared",
    "Param",
    "Expr",
    "Const",
    "Ref",
    "Builtin",
    "Bin",
    "Un",
    "Cast",
    "Bitcast",
    "HalfToF32",
    "Select",
    "Load",
    "LoadWord",
    "SubgroupReduce",
    "SubgroupShuffle",
    "Dot4I8",
    "Fma",
    "PackBf16x2",
    "Stmt",
    "Let",
    "Assign",
    "Store",
    "If",
    "For",
    "Barrier",
    "AtomicAdd",
    "Fence",
    "VecLoad",
    "VecStore",
    "MmaTile",
    "TargetStmt",
    "DotBytes",
    "SpreadBits",
    "CopyAsync",
    "CopyAsyncSync",
    "AwaitPrior",
    "Prefetch",
    "Kernel",
    "BIN_OPS",
    "CMP_OPS",
    "UN_OPS",
    "COPY_SYNC",
    "const",
    "i32",
]

i32 = dt.i32

BIN_OPS = ("add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor", "shl", "shr", "pow")
CMP_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
UN_OPS = ("neg", "not", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "floor", "rint", "erf", "recip")
BUILTINS = ("thread_id", "group_id", "group_size", "num_groups", "lane_id", "subgroup_size")


# -- parameters and memory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Buffer:
    """A global-memory array argument, indexed in elements of ``dtype``."""

    name: str
    dtype: DType
    readonly: bool = True


@dataclass(frozen=True)
class ScalarParam:
    """A run-time scalar argument (sizes, strides, epsilons)."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class Shared:
    """A workgroup-shared array of static size."""

    name: str
    dtype: DType
    size: int


Param = Union[Buffer, ScalarParam]


# -- expressions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class Ref:
    """A scalar parameter, a local variable or a loop variable."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class Builtin:
    """thread_id / group_id / group_size / num_groups along ``dim`` (0..2), or lane_id /
    subgroup_size (dim ignored). All i32."""

    kind: str
    dim: int = 0

    @property
    def dtype(self) -> DType:
        return i32


@dataclass(frozen=True)
class Bin:
    op: str
    a: "Expr"
    b: "Expr"

    @property
    def dtype(self) -> DType:
        return dt.boolean if self.op in CMP_OPS else self.a.dtype


@dataclass(frozen=True)
class Un:
    op: str
    a: "Expr"

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class Cast:
    a: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Bitcast:
    """Reinterpret the bits of ``a`` as ``dtype`` (same width: i32 <-> f32)."""

    a: "Expr"
    dtype: DType


@dataclass(frozen=True)
class HalfToF32:
    """The IEEE half in the low 16 bits of the i32 ``a``, as f32 (exact: subnormals, inf and NaN
    kept). Targets with a half type convert in hardware; others expand it to integer operations."""

    a: "Expr"

    @property
    def dtype(self) -> DType:
        return dt.f32


@dataclass(frozen=True)
class Select:
    cond: "Expr"
    a: "Expr"
    b: "Expr"

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class Load:
    """``buffer[index]`` from a Buffer or Shared array (by name); ``dtype`` is the element type."""

    buffer: str
    index: "Expr"
    dtype: DType


@dataclass(frozen=True)
class LoadWord:
    """The four bytes of u8 buffer ``buffer`` from byte ``index`` (any alignment) as a little-endian
    i32: one load on the host, four byte loads elsewhere."""

    buffer: str
    index: "Expr"

    @property
    def dtype(self) -> DType:
        return i32


@dataclass(frozen=True)
class SubgroupReduce:
    """Reduce ``a`` across the subgroup with 'add', 'max' or 'min'; every lane gets the result."""

    op: str
    a: "Expr"

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class SubgroupShuffle:
    """The value of ``a`` held by lane ``lane`` (``xor=True``: by lane ``lane_id ^ lane``)."""

    a: "Expr"
    lane: "Expr"
    xor: bool = False

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class Dot4I8:
    """``c`` plus the dot product of the four signed bytes of the i32 ``a`` with those of ``b``
    (NVIDIA ``dp4a``; other targets expand it to byte arithmetic). All i32."""

    a: "Expr"
    b: "Expr"
    c: "Expr"

    @property
    def dtype(self) -> DType:
        return i32


@dataclass(frozen=True)
class Fma:
    """``a * b + c`` rounded once (f32): a fused multiply-add whatever the target's contraction
    policy, so that two kernels that must agree to the bit (a GEMV and a GEMM) compute it alike."""

    a: "Expr"
    b: "Expr"
    c: "Expr"

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class PackBf16x2:
    """f32 ``a`` and ``b`` rounded to bf16 (nearest, ties to even) and packed in an i32, ``a`` in the
    low half (NVIDIA: one ``cvt.rn.bf16x2.f32``; other targets: integer arithmetic, the same bits
    for every finite value; a NaN stays one on NVIDIA and may become an infinity elsewhere)."""

    a: "Expr"
    b: "Expr"

    @property
    def dtype(self) -> DType:
        return i32


Expr = Union[Const, Ref, Builtin, Bin, Un, Cast, Bitcast, HalfToF32, Select, Load, LoadWord, SubgroupReduce, SubgroupShuffle, Dot4I8, Fma, PackBf16x2]


def const(value: float | int | bool, dtype: DType | str = i32) -> Const:
    return Const(value, dt.dtype_of(dtype))


# -- statements -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Let:
    """Declare a mutable local variable with an initial value."""

    name: str
    value: Expr


@dataclass(frozen=True)
class Assign:
    name: str
    value: Expr


@dataclass(frozen=True)
class Store:
    buffer: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class For:
    """``for var in range(start, stop, step)`` with i32 bounds; ``step`` must be a positive constant."""

    var: str
    start: Expr
    stop: Expr
    body: tuple["Stmt", ...]
    step: int = 1


@dataclass(frozen=True)
class Barrier:
    """Workgroup barrier: every thread reaches it, and workgroup memory writes before it are visible after."""


@dataclass(frozen=True)
class AtomicAdd:
    """``buffer[index] += value`` atomically (relaxed: ``Fence`` statements order memory around it).
    With ``old`` a local of that name is declared holding the value before the add (a global
    buffer's: a count of workgroups done, say)."""

    buffer: str
    index: Expr
    value: Expr
    old: str = ""


@dataclass(frozen=True)
class Fence:
    """A memory fence (acquire and release): this thread's writes before it are visible to every
    thread of the device that fences after observing a later write of this thread (an atomic), and
    its reads after it see what such threads wrote before theirs."""


@dataclass(frozen=True)
class VecLoad:
    """Declare locals ``names`` from ``len(names)`` consecutive elements of ``buffer`` at ``index``
    (one wide load: 16 bytes for four f32). ``index`` must be a multiple of the width."""

    names: tuple[str, ...]
    buffer: str
    index: Expr
    dtype: DType


@dataclass(frozen=True)
class VecStore:
    """Store ``values`` to consecutive elements of ``buffer`` at ``index`` in one wide store."""

    buffer: str
    index: Expr
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class MmaTile:
    """A workgroup's matrix multiply-accumulate on shared-memory tiles: ``c[m, n] += a[m, k] @ b[k, n]``
    with f16 ``a`` (row-major, ``m x k``) and ``b`` (column-major, ``k x n``) and f32 ``c`` (row-major),
    16x16x16. Targets lower it to their matrix instructions (``lower_mma_tile``) or refuse."""

    a: str
    b: str
    c: str
    m: int = 16
    n: int = 16
    k: int = 16


class TargetStmt:
    """The base of statements a backend defines for its target's own instructions (a warpgroup's
    matrix product, say). The core's verifier calls ``check`` (with a ``poot.kernel.verify.StmtCheck``:
    the locals' and arrays' types, whether every thread reaches the statement, and ``fail``), and
    the lowering calls the target's ``lower_<lowering>`` method with the statement; a target
    without that method refuses the kernel by the statement's name. Subclasses are frozen
    dataclasses (kernels are values: compared, hashed and printed into cache keys). A statement
    declares no local of its own: it reads and writes locals declared by ``Let`` before it."""

    lowering = ""  # the lowerer method's suffix: ``lower_<lowering>``
    shared_alignment = 16  # bytes each workgroup array must be aligned to where the statement reads it

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        """Raise ``c.fail(reason)`` where the statement is malformed."""


@dataclass(frozen=True)
class DotBytes(TargetStmt):
    """For i in range(n): ``acc[acc_at + i]`` plus the dot product of the four unsigned bytes of
    ``a[a_at + i]`` with the four signed bytes of ``b[b_at + i]``; the three are i32 workgroup
    arrays (on the host, registers), the sums exact (no saturation). Every target lowers it: hosts
    with VNNI 16 or 8 lanes an instruction (``vpdpbusd``), the others by byte arithmetic."""

    acc: str
    acc_at: "Expr"
    a: str
    a_at: "Expr"
    b: str
    b_at: "Expr"
    n: int

    lowering = "dot_bytes"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        for name in (self.acc, self.a, self.b):
            sh = c.shared(name)
            if sh is None or sh.dtype != dt.i32:
                raise c.fail(f"dot_bytes works on i32 workgroup arrays; '{name}' is not one")
        for at in (self.acc_at, self.a_at, self.b_at):
            if c.expr(at) != dt.i32:
                raise c.fail("dot_bytes offsets must be i32")
        if self.n < 1:
            raise c.fail(f"dot_bytes needs at least one lane, got {self.n}")


@dataclass(frozen=True)
class SpreadBits(TargetStmt):
    """Bits into bytes: for each of 16 lanes l of i32 workgroup array ``arr`` from ``at`` and each of
    its bytes b, bit ``4 l + b`` of the 64 bits (``hi``:``lo``, two i32) is OR'ed into that byte at
    bit ``shift`` (Q5_0's fifth bits beside their nibbles). Hosts with AVX-512 BW make the 64 bits a
    mask and the mask bytes (``vpmovm2b``); other targets shift and mask each byte."""

    arr: str
    at: "Expr"
    lo: "Expr"
    hi: "Expr"
    shift: int

    lowering = "spread_bits"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        sh = c.shared(self.arr)
        if sh is None or sh.dtype != dt.i32:
            raise c.fail(f"spread_bits writes an i32 workgroup array; '{self.arr}' is not one")
        if any(c.expr(e) != dt.i32 for e in (self.at, self.lo, self.hi)):
            raise c.fail("spread_bits takes an i32 offset and two i32 words of bits")
        if not 0 <= self.shift < 8:
            raise c.fail(f"spread_bits places a bit within a byte: shift 0-7, got {self.shift}")


@dataclass(frozen=True)
class CopyAsync:
    """16 bytes of ``buffer`` from element ``index`` into workgroup array ``shared`` at element ``at``
    (4-byte elements, both places 16-byte aligned), a copy that may complete after the statement
    (a target's copy engine, no registers): ``CopyAsyncSync`` orders it. Targets without
    asynchronous copies load and store."""

    shared: str
    at: Expr
    buffer: str
    index: Expr


COPY_SYNC = ("commit", "wait")


@dataclass(frozen=True)
class CopyAsyncSync:
    """ "commit": this thread's copies issued since its last commit become one group; "wait": until
    at most ``n`` of its groups are pending. A barrier after the wait shows the workgroup's copies to
    all its threads (and to a target's matrix units, where its own ordering statement says so)."""

    op: str
    n: int = 0


@dataclass(frozen=True)
class AwaitPrior:
    """Wait until the launch before this one has finished and its writes are visible, then let the
    launch after this one start (a programmatic dependent launch, where the target has them).
    Every thread reaches it, at the body's top level, before any access to memory another launch
    of the step writes: what comes before it may read only memory no launch writes (weights), and so
    overlaps the launch before. A kernel without one waits at its entry. Where launches are not
    made programmatic (other targets, other executors) they are serial and it does nothing."""


@dataclass(frozen=True)
class Prefetch:
    """A hint that ``nbytes`` bytes of ``buffer`` from element ``index`` on (16-byte aligned, a
    multiple of 16 bytes) are read soon: a target with a bulk copy engine brings them into its
    cache, one instruction for the whole range, no registers and nothing to wait for. Other targets
    ignore it. It reads no value, so before an ``AwaitPrior`` it
    may name only memory no launch of the step writes (weights): the launch before is then still
    running, and the range arrives while it drains."""

    buffer: str
    index: Expr
    nbytes: Expr


Stmt = Union[Let, Assign, Store, If, For, Barrier, AtomicAdd, Fence, VecLoad, VecStore, MmaTile, CopyAsync, CopyAsyncSync, AwaitPrior, Prefetch, TargetStmt]


@dataclass(frozen=True)
class Kernel:
    """A kernel: parameters, workgroup-shared arrays, the static workgroup size and the body run by
    every thread of every workgroup."""

    name: str
    params: tuple[Param, ...]
    body: tuple[Stmt, ...]
    workgroup: tuple[int, int, int] = (64, 1, 1)
    shared: tuple[Shared, ...] = ()
    meta: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    min_groups: int = 0  # workgroups an SM should hold at once: registers capped for it where the target can (NVPTX); 0: no bound
    # LLVM's loop vectorizer on this kernel; off for kernels whose loops are already lane-shaped (the
    # host's 16-lane loops, unrolled and packed by the SLP vectorizer), where it only adds code and compile time
    loop_vectorize: bool = True

    @property
    def threads(self) -> int:
        x, y, z = self.workgroup
        return x * y * z

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def scalars(self) -> tuple[ScalarParam, ...]:
        return tuple(p for p in self.params if isinstance(p, ScalarParam))
