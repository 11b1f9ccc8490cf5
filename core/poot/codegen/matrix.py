"""Lowering of the Kernel IR's matrix and asynchronous-copy statements (a mixin of the lowerer,
``lower._Lowerer``): NVIDIA's WMMA tiles, ``mma.sync`` fragments, Hopper's ``wgmma`` products with
their ordering, and ``cp.async`` copies (an ordinary load and store on other targets). Targets
without an instruction refuse its statement by name."""

from __future__ import annotations

from llvmlite import ir as L

from ..errors import Refusal
from ..graph import dtypes as dt
from ..kernel import ir as K
from .targets import Target

I8, I32, F32 = L.IntType(8), L.IntType(32), L.FloatType()


class MatrixLowering:
    """Methods of the lowerer for matrix statements; they use its builder (``b``), target (``t``),
    kernel (``k``), memory (``mem``, ``address``), locals (``_var_ptr``) and expressions (``expr``)."""

    b: L.IRBuilder
    t: Target
    k: K.Kernel
    mem: dict[str, tuple[L.Value, dt.DType, int | None]]

    def mma(self, st: K.MmaTile) -> None:
        if self.t.name != "nvptx" or "mma.sync" not in self.t.matrix:
            raise Refusal(f"kernel {self.k.name}", self.t.key, "no matrix multiply-accumulate instructions are lowered for this target")
        b = self.b
        h2 = L.VectorType(L.HalfType(), 2)
        ab = L.LiteralStructType([h2] * 8)
        cf = L.LiteralStructType([F32] * 8)
        ptr = lambda name, elt: b.bitcast(self.mem[name][0], L.PointerType(elt, 3))  # noqa: E731
        warp0 = b.icmp_signed("<", self.builtin(K.Builtin("thread_id", 0)), L.Constant(I32, 32))
        with b.if_then(warp0):  # one warp computes the tile (WMMA is warp-wide)
            p3h, p3f = L.PointerType(L.HalfType(), 3), L.PointerType(F32, 3)
            a = b.call(self.intrinsic("llvm.nvvm.wmma.m16n16k16.load.a.row.stride.f16.p3", ab, [p3h, I32]), [ptr(st.a, L.HalfType()), L.Constant(I32, st.k)])
            bb = b.call(self.intrinsic("llvm.nvvm.wmma.m16n16k16.load.b.col.stride.f16.p3", ab, [p3h, I32]), [ptr(st.b, L.HalfType()), L.Constant(I32, st.k)])
            c = b.call(self.intrinsic("llvm.nvvm.wmma.m16n16k16.load.c.row.stride.f32.p3", cf, [p3f, I32]), [ptr(st.c, F32), L.Constant(I32, st.n)])
            args = [b.extract_value(a, i) for i in range(8)] + [b.extract_value(bb, i) for i in range(8)] + [b.extract_value(c, i) for i in range(8)]
            d = b.call(self.intrinsic("llvm.nvvm.wmma.m16n16k16.mma.row.col.f32.f32", cf, [h2] * 16 + [F32] * 8), args)
            outs = [b.extract_value(d, i) for i in range(8)]
            b.call(
                self.intrinsic("llvm.nvvm.wmma.m16n16k16.store.d.row.stride.f32.p3", L.VoidType(), [p3f] + [F32] * 8 + [I32]),
                [ptr(st.c, F32)] + outs + [L.Constant(I32, st.n)],
            )

    def mma_sync(self, st: K.Mma) -> None:
        if self.t.name != "nvptx" or "mma.sync" not in self.t.matrix:
            raise Refusal(f"kernel {self.k.name}", self.t.key, "no matrix multiply-accumulate instructions are lowered for this target")
        b = self.b
        name = "llvm.nvvm.mma.m16n8k16.row.col.bf16" if st.dtype == dt.bf16 else "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"
        if st.dtype == dt.bf16:
            regs = [self.expr(e) for e in st.a + st.b]
            types = [I32] * 6
        else:  # f16 pairs are <2 x half>
            h2 = L.VectorType(L.HalfType(), 2)
            regs = [b.bitcast(self.expr(e), h2) for e in st.a + st.b]
            types = [h2] * 6
        ptrs = [self._var_ptr(nm)[0] for nm in st.acc]
        acc = [b.load(p) for p in ptrs]
        d = b.call(self.intrinsic(name, L.LiteralStructType([F32] * 4), types + [F32] * 4), regs + acc)
        for i, p in enumerate(ptrs):
            b.store(b.extract_value(d, i), p)

    def copy_async(self, st: K.CopyAsync) -> None:
        b = self.b
        if self.t.name == "nvptx":
            dst, _ = self.address(st.shared, st.at)
            src, _ = self.address(st.buffer, st.index)
            p3, p1 = L.PointerType(I8, self.t.shared_as), L.PointerType(I8, self.t.global_as)
            b.call(self.intrinsic("llvm.nvvm.cp.async.cg.shared.global.16", L.VoidType(), [p3, p1]), [b.bitcast(dst, p3), b.bitcast(src, p1)])
            return
        # elsewhere four loads and stores of the 4-byte elements (verified): LLVM's SPIR-V backend
        # cannot lower a vector load through a cast element pointer
        for i in range(4):
            frm, ft = self.address(st.buffer, K.Bin("add", st.index, K.Const(i, dt.i32)))
            to, tt = self.address(st.shared, K.Bin("add", st.at, K.Const(i, dt.i32)))
            if ft != tt and self.t.name == "spirv":  # (its backend cannot lower the bitcast of a loaded value either)
                raise Refusal(
                    f"kernel {self.k.name}",
                    self.t.key,
                    f"an asynchronous copy from {ft} '{st.buffer}' into {tt} '{st.shared}': SPIR-V copies between arrays of one element type",
                )
            v = b.load(frm)
            b.store(v if ft == tt else b.bitcast(v, to.type.pointee), to)

    def _wgmma_target(self) -> None:
        if self.t.name != "nvptx" or "wgmma" not in self.t.matrix:
            raise Refusal(f"kernel {self.k.name}", self.t.key, "warpgroup matrix products (wgmma) are lowered for nvptx:sm_90a only")

    def wgmma(self, st: K.Wgmma) -> None:
        """wgmma.mma_async by inline PTX (LLVM has no intrinsic for it): the two operands' matrix
        descriptors (start address / 16, lbo / 16, sbo / 16, the swizzle mode) built from the shared
        arrays' addresses, the accumulators read and written in place."""
        self._wgmma_target()
        b = self.b
        words: list[L.Value] = []
        for name, off in ((st.a, st.a_offset), (st.b, st.b_offset)):
            addr = b.add(b.ptrtoint(self.mem[name][0], I32), self.expr(off))
            start = b.and_(b.lshr(addr, L.Constant(I32, 4)), L.Constant(I32, 0x3FFF))
            layout = {0: 0, 128: 1, 64: 2, 32: 3}[st.swizzle] << 30  # bits 62-63 of the descriptor
            words += [b.or_(start, L.Constant(I32, (st.lbo >> 4) << 16)), L.Constant(I32, (st.sbo >> 4) | layout)]
        na = len(st.acc)
        d = ", ".join(f"${i}" for i in range(na))
        asm = (
            "{ .reg .b64 da, db; .reg .pred p; "
            f"mov.b64 da, {{${na}, ${na + 1}}}; mov.b64 db, {{${na + 2}, ${na + 3}}}; setp.ne.b32 p, ${na + 4}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{2 * na}k16.f32.bf16.bf16 {{{d}}}, da, db, p, 1, 1, 0, 0; }}"
        )
        cons = ",".join(["=f"] * na + ["r"] * 5 + [str(i) for i in range(na)]) + ",~{memory}"
        fn = L.InlineAsm(L.FunctionType(L.LiteralStructType([F32] * na), [I32] * 5 + [F32] * na), asm, cons, side_effect=True)
        ptrs = [self._var_ptr(nm)[0] for nm in st.acc]
        out = b.call(fn, words + [L.Constant(I32, 1)] + [b.load(p) for p in ptrs])
        for i, p in enumerate(ptrs):
            b.store(b.extract_value(out, i), p)

    def wgmma_sync(self, st: K.WgmmaSync) -> None:
        self._wgmma_target()
        text = {
            "fence": "wgmma.fence.sync.aligned;",
            "commit": "wgmma.commit_group.sync.aligned;",
            "wait": f"wgmma.wait_group.sync.aligned {st.n};",
            "proxy": "fence.proxy.async.shared::cta;",
        }[st.op]
        self.b.call(L.InlineAsm(L.FunctionType(L.VoidType(), []), text, "~{memory}", side_effect=True), [])
