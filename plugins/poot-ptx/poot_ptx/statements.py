"""NVIDIA's own Kernel IR statements (``TargetStmt``s, lowered by ``NvptxLowering.lower_<name>``):
a warp's ``mma.sync`` tile product, a warpgroup's asynchronous ``wgmma`` and its ordering. Each
checks its operands itself (``check``, through the verifier's ``StmtCheck``); other targets refuse
them by name."""

from __future__ import annotations

from dataclasses import dataclass

from poot.backend import TargetStmt
from poot.backend import dtypes as dt
from poot.backend import kir as K

__all__ = ["Hfma2", "Mma", "PackF16x2", "Wgmma", "WgmmaRegA", "WgmmaSync", "WGMMA_SYNC"]

Expr = K.Expr


@dataclass(frozen=True)
class Mma(TargetStmt):
    """One warp's 16x8x16 matrix multiply-accumulate in registers (``mma.sync``): ``acc`` names four
    f32 locals, this lane's part of the 16x8 f32 tile, which are updated in place; ``a`` is four and
    ``b`` two i32 expressions, this lane's pairs of ``dtype`` (bf16 or f16) values. Fragments follow
    PTX's layout for m16n8k16 (lane = 4 * group + t): a pair holds columns (2t, 2t + 1) of A's row
    ``group`` (a[0]), ``group + 8`` (a[1]), then the same rows at columns 8 + 2t (a[2], a[3]); b[0]
    holds B's rows (2t, 2t + 1) and b[1] rows 8 + 2t of column ``group``; acc holds row ``group``,
    columns (2t, 2t + 1), then row ``group + 8``. The whole warp executes it.

    With ``dtype`` i8 it is the integer m16n8k32 product: the registers hold four signed bytes each
    (A's columns 4t to 4t + 3 and 16 + 4t on, B's rows likewise), ``acc`` four i32 locals, the same
    tile layout.

    With ``dtype`` f32 it is the tf32 m16n8k8 product: each register holds one f32 value's bits (the
    tensor cores read its top 19), a[0..3] A's (row, column) (group, t), (group + 8, t), (group,
    t + 4), (group + 8, t + 4), b[0] and b[1] B's rows t and t + 4 of column ``group``; ``acc`` as
    for the f16 products."""

    acc: tuple[str, str, str, str]
    a: tuple[Expr, Expr, Expr, Expr]
    b: tuple[Expr, Expr]
    dtype: dt.DType = dt.bf16

    lowering = "mma"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        if self.dtype not in (dt.bf16, dt.f16, dt.i8, dt.f32):
            raise c.fail(f"mma operands must be bf16 or f16 pairs, i8 quads or f32 (tf32) values, got {self.dtype}")
        if len(self.acc) != 4 or len(self.a) != 4 or len(self.b) != 2:
            raise c.fail("mma takes four accumulators, four A and two B registers")
        want = dt.i32 if self.dtype == dt.i8 else dt.f32
        for nm in self.acc:
            if c.local(nm) != want:
                raise c.fail(f"mma accumulator '{nm}' must be an {want} local")
        for e in self.a + self.b:
            if c.expr(e) != dt.i32:
                raise c.fail("mma registers are i32 (two 16-bit or four 8-bit values each, or one f32's bits)")


def _set_i32(c, name: str, what: str) -> None:  # type: ignore[no-untyped-def]
    if c.local(name) != dt.i32:
        raise c.fail(f"{what} writes an i32 local declared before it; '{name}' is not one")


@dataclass(frozen=True)
class Hfma2(TargetStmt):
    """``out`` = a * b + c on pairs of f16 values (i32 locals, the first value in the low half),
    each rounded once (``fma.rn.f16x2``): a tensor-core operand built two values an instruction."""

    out: str
    a: Expr
    b: Expr
    c: Expr

    lowering = "hfma2"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        _set_i32(c, self.out, "hfma2")
        if any(c.expr(e) != dt.i32 for e in (self.a, self.b, self.c)):
            raise c.fail("hfma2 takes i32 words of two f16 values")


@dataclass(frozen=True)
class PackF16x2(TargetStmt):
    """``out`` = the nearest f16 of each of two f32 values (nearest even), ``lo`` in the low half of
    the i32 local (``cvt.rn.f16x2.f32``)."""

    out: str
    lo: Expr
    hi: Expr

    lowering = "pack_f16x2"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        _set_i32(c, self.out, "pack_f16x2")
        if any(c.expr(e) != dt.f32 for e in (self.lo, self.hi)):
            raise c.fail("pack_f16x2 takes two f32 values")


def _check_warpgroup(c, acc: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    """What every warpgroup product needs: every thread reaching it, whole warpgroups, n / 2 f32
    accumulators for n a multiple of 8 up to 256."""
    if c.divergent:
        raise c.fail("a warpgroup matrix product must be reached by every thread")
    if c.threads % 128:
        raise c.fail(f"warpgroup matrix products need whole warpgroups of 128 threads, the workgroup has {c.threads}")
    if not acc or len(acc) % 4 or len(acc) > 128:
        raise c.fail(f"wgmma takes n / 2 accumulators for n a multiple of 8 up to 256, got {len(acc)}")
    for nm in acc:
        if c.local(nm) != dt.f32:
            raise c.fail(f"wgmma accumulator '{nm}' must be an f32 local")


@dataclass(frozen=True)
class Wgmma(TargetStmt):
    """A warpgroup's asynchronous 64 x n x 16 matrix multiply-accumulate with both operands in
    workgroup memory (``wgmma.mma_async``, sm_90a; four consecutive warps from a warp index
    divisible by four execute it together): ``acc`` (n / 2 f32 locals of each thread) += A (64 rows x 16)
    times B (n rows x 16) transposed, bf16 values. Both operands are K-major. With ``swizzle`` 0, in
    8 x 8 core matrices of 128 contiguous bytes: value (r, k) lies at byte ``offset + (r // 8) * sbo +
    (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2`` of its shared array (``a_offset``, ``b_offset``: i32
    bytes, 16-byte aligned). With ``swizzle`` S (32, 64 or 128 bytes): rows of S bytes, groups of
    eight rows ``sbo`` apart, in atoms of 8 S bytes aligned to their size whose 16-byte chunks are
    permuted by address (chunk c of the row at byte a lies at chunk c ^ ((a >> 7) % (S / 16)));
    the offset steps along K within a row; lbo is unused. acc follows the mma.sync accumulator layout
    per 8-column tile j (acc[4 j .. 4 j + 3]) on rows 16 w + group and + 8 of the warpgroup's warp w.
    The product is only issued: it is ordered by ``WgmmaSync``, and its accumulators must not be read
    before a wait covers it."""

    acc: tuple[str, ...]
    a: str
    a_offset: Expr
    b: str
    b_offset: Expr
    lbo: int
    sbo: int
    swizzle: int = 0

    lowering = "wgmma"

    @property
    def shared_alignment(self) -> int:  # type: ignore[override]
        return 1024 if self.swizzle else 16  # a swizzle atom lies at an address aligned to its size

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        _check_warpgroup(c, self.acc)
        for name, off in ((self.a, self.a_offset), (self.b, self.b_offset)):
            if c.shared(name) is None:
                raise c.fail(f"wgmma operand '{name}' must be a shared array")
            if c.expr(off) != dt.i32:
                raise c.fail(f"wgmma offset into '{name}' must be i32 bytes")
        if self.swizzle not in (0, 32, 64, 128):
            raise c.fail(f"wgmma swizzle is 0, 32, 64 or 128 bytes, got {self.swizzle}")
        for what, v in (("lbo", self.lbo), ("sbo", self.sbo)):
            if v % 16 or not 0 <= v < 1 << 18:
                raise c.fail(f"wgmma {what} must be a multiple of 16 below 2^18 bytes, got {v}")


@dataclass(frozen=True)
class WgmmaRegA(TargetStmt):
    """A warpgroup's asynchronous 64 x n x 16 f16 matrix multiply-accumulate with A in registers
    (``wgmma.mma_async`` with an A fragment, sm_90a): warp w of the warpgroup holds A's rows 16 w to
    16 w + 15 in ``a``, four i32 words of f16 pairs laid out as ``Mma``'s A (m16n8k16); B (n rows x
    16, K-major, f16) is read from workgroup array ``b`` at byte ``b_offset`` as ``Wgmma``'s B with
    swizzle 0 (value (r, k) at byte ``b_offset + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 +
    (k % 8) * 2``). ``acc`` (n / 2 f32 locals, ``Wgmma``'s layout) += A B^T, or = A B^T where
    ``accumulate`` is False. Ordered by ``WgmmaSync``: neither ``acc`` nor the registers of ``a``
    may be touched before a wait covers it."""

    acc: tuple[str, ...]
    a: tuple[Expr, Expr, Expr, Expr]
    b: str
    b_offset: Expr
    lbo: int
    sbo: int
    accumulate: bool = True

    lowering = "wgmma_reg_a"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        _check_warpgroup(c, self.acc)
        if len(self.a) != 4 or any(c.expr(e) != dt.i32 for e in self.a):
            raise c.fail("wgmma's A fragment is four i32 words of f16 pairs")
        if c.shared(self.b) is None or c.expr(self.b_offset) != dt.i32:
            raise c.fail(f"wgmma operand '{self.b}' must be a shared array at an i32 byte offset")
        for what, v in (("lbo", self.lbo), ("sbo", self.sbo)):
            if v % 16 or not 0 <= v < 1 << 18:
                raise c.fail(f"wgmma {what} must be a multiple of 16 below 2^18 bytes, got {v}")


WGMMA_SYNC = ("fence", "commit", "wait", "proxy")


@dataclass(frozen=True)
class WgmmaSync(TargetStmt):
    """Ordering around ``Wgmma``: "fence" before a warpgroup's first product reading registers or
    workgroup memory written since (``wgmma.fence``); "commit" makes the products issued since the last
    commit one group; "wait" until at most ``n`` of this warpgroup's groups are pending; "proxy" makes
    this thread's ordinary stores to workgroup memory (and its finished asynchronous copies) visible
    to the tensor cores' reads (its own ``fence.proxy.async``; a barrier after it orders the whole
    workgroup's)."""

    op: str
    n: int = 0

    lowering = "wgmma_sync"

    def check(self, c) -> None:  # type: ignore[no-untyped-def]
        if c.divergent:
            raise c.fail("wgmma ordering must be reached by every thread")
        if self.op not in WGMMA_SYNC or not 0 <= self.n <= 7:
            raise c.fail(f"wgmma ordering is one of {WGMMA_SYNC} with 0 <= n <= 7, got {self.op!r} {self.n}")
