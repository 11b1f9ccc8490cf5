"""Kernel IR -> LLVM IR for NVPTX: what the generic lowering (``poot.backend.KernelLowering``) leaves
to the target. Thread ids and barriers from NVVM intrinsics; shuffles, dp4a, fast exp2/log2/sin/cos
and bf16 packing by NVVM's instructions; WMMA tiles, ``mma.sync`` fragments and Hopper's ``wgmma``
products with their ordering; ``cp.async`` copies; ``griddepcontrol`` (programmatic dependent
launch) and the bulk engine's L2 prefetch on sm_90+."""

from __future__ import annotations

from llvmlite import ir as L

from poot.backend import KernelLowering
from poot.backend import dtypes as dt
from poot.backend import kir as K
from poot.errors import Refusal

from .statements import Hfma2, Mma, PackF16x2, Wgmma, WgmmaRegA, WgmmaSync

__all__ = ["NvptxLowering"]

I8, I32, F32 = L.IntType(8), L.IntType(32), L.FloatType()


class NvptxLowering(KernelLowering):
    approx_ops = frozenset({"exp2", "log2", "sin", "cos"})

    def _hopper(self) -> bool:
        """sm_90 or later: griddepcontrol and the bulk copy engine."""
        return int(self.t.cpu.removeprefix("sm_").rstrip("a")) >= 90

    # -- functions, ids, barriers -------------------------------------------------------------------
    def kernel_function(self, fn: L.Function) -> None:
        # no "nvvm.maxntid" by default: with it ptxas caps registers for occupancy and spills (sm_90)
        fn.calling_convention = "ptx_kernel"
        if self.k.min_groups:  # asked for: registers capped so that this many workgroups fit an SM
            set.add(fn.attributes, f'"nvvm.maxntid"="{self.k.threads}"')
            set.add(fn.attributes, f'"nvvm.minctasm"="{self.k.min_groups}"')

    def gpu_builtin(self, e: K.Builtin) -> L.Value:
        reg = {"thread_id": "tid", "group_id": "ctaid", "num_groups": "nctaid", "lane_id": "laneid"}[e.kind]
        name = f"llvm.nvvm.read.ptx.sreg.{reg}" + ("" if reg == "laneid" else f".{'xyz'[e.dim]}")
        return self.b.call(self.intrinsic(name, I32, []), [])

    def barrier(self) -> None:
        self.b.call(self.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", L.VoidType(), [I32]), [L.Constant(I32, 0)])

    def fence(self) -> None:  # device scope (fence.acq_rel.gpu)
        self.b.fence("acq_rel", "device")

    def await_prior(self) -> None:
        """griddepcontrol where the target has it (sm_90+): the wait, then the release of the next launch."""
        if self._hopper():
            text = "griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;"
            self.b.call(L.InlineAsm(L.FunctionType(L.VoidType(), []), text, "~{memory}", side_effect=True), [])

    def prefetch(self, st: K.Prefetch) -> None:
        """The bulk copy engine's prefetch into the L2 where the target has it (sm_90+)."""
        if self._hopper():
            ptr, _ = self.address(st.buffer, st.index)
            fn = L.InlineAsm(
                L.FunctionType(L.VoidType(), [L.IntType(64), I32]), "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r,~{memory}", side_effect=True
            )
            self.b.call(fn, [self.b.ptrtoint(ptr, L.IntType(64)), self.expr(st.nbytes)])

    # -- arithmetic ---------------------------------------------------------------------------------
    def approx(self, op: str, x: L.Value) -> L.Value:
        name = {"exp2": "ex2", "log2": "lg2", "sin": "sin", "cos": "cos"}[op]
        return self.b.call(self.intrinsic(f"llvm.nvvm.{name}.approx.ftz.f", F32, [F32]), [x])

    def reduce_turns(self, a: L.Value, k: L.Value) -> L.Value:
        r = self.fcall("llvm.fma", self.b.fneg(k), L.Constant(F32, 6.28125), a)
        return self.fcall("llvm.fma", self.b.fneg(k), L.Constant(F32, 0.0019353071795864769), r)

    def dot4_i8(self, a: L.Value, c: L.Value, acc: L.Value) -> L.Value:
        return self.b.call(self.intrinsic("llvm.nvvm.idp4a.s.s", I32, [I32, I32, I32]), [a, c, acc])

    def pack_bf16x2(self, lo: L.Value, hi: L.Value) -> L.Value:
        # cvt puts its first source in the upper half
        asm = L.InlineAsm(L.FunctionType(I32, [F32, F32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
        return self.b.call(asm, [hi, lo])

    def shuffle_word(self, v: L.Value, lane: L.Value, t: dt.DType, xor: bool) -> L.Value:
        b = self.b
        bits = b.bitcast(v, I32) if t == dt.f32 else v
        name = "llvm.nvvm.shfl.sync.bfly.i32" if xor else "llvm.nvvm.shfl.sync.idx.i32"
        r = b.call(self.intrinsic(name, I32, [I32, I32, I32, I32]), [L.Constant(I32, -1), bits, lane, L.Constant(I32, 0x1F)])
        return b.bitcast(r, F32) if t == dt.f32 else r

    # -- asynchronous copies ------------------------------------------------------------------------
    def copy_async(self, st: K.CopyAsync) -> None:
        dst, _ = self.address(st.shared, st.at)
        src, _ = self.address(st.buffer, st.index)
        p3, p1 = L.PointerType(I8, self.t.shared_as), L.PointerType(I8, self.t.global_as)
        self.b.call(self.intrinsic("llvm.nvvm.cp.async.cg.shared.global.16", L.VoidType(), [p3, p1]), [self.b.bitcast(dst, p3), self.b.bitcast(src, p1)])

    def copy_async_sync(self, st: K.CopyAsyncSync) -> None:
        if st.op == "commit":
            self.b.call(self.intrinsic("llvm.nvvm.cp.async.commit.group", L.VoidType(), []), [])
        else:
            self.b.call(self.intrinsic("llvm.nvvm.cp.async.wait.group", L.VoidType(), [I32]), [L.Constant(I32, st.n)])

    # -- matrix products ----------------------------------------------------------------------------
    def _matrix(self) -> None:
        if "mma.sync" not in self.t.matrix:
            raise Refusal(f"kernel {self.k.name}", self.t.key, "no matrix multiply-accumulate instructions are lowered for this target")

    def lower_mma_tile(self, st: K.MmaTile) -> None:
        self._matrix()
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

    def lower_hfma2(self, st: Hfma2) -> None:
        b = self.b
        h2 = L.VectorType(L.HalfType(), 2)
        a, x, c = (b.bitcast(self.expr(e), h2) for e in (st.a, st.b, st.c))
        r = b.call(self.intrinsic("llvm.fma.v2f16", h2, [h2, h2, h2]), [a, x, c])
        b.store(b.bitcast(r, I32), self._var_ptr(st.out)[0])

    def lower_pack_f16x2(self, st: PackF16x2) -> None:
        # cvt puts its first source in the upper half
        asm = L.InlineAsm(L.FunctionType(I32, [F32, F32]), "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f")
        self.b.store(self.b.call(asm, [self.expr(st.hi), self.expr(st.lo)]), self._var_ptr(st.out)[0])

    def lower_mma(self, st: Mma) -> None:
        self._matrix()
        b = self.b
        name = {
            dt.bf16: "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            dt.i8: "llvm.nvvm.mma.m16n8k32.row.col.s8",
            dt.f32: "llvm.nvvm.mma.m16n8k8.row.col.tf32",
        }.get(st.dtype, "llvm.nvvm.mma.m16n8k16.row.col.f32.f32")
        tacc = I32 if st.dtype == dt.i8 else F32
        if st.dtype in (dt.bf16, dt.i8, dt.f32):
            regs = [self.expr(e) for e in st.a + st.b]
            types = [I32] * 6
        else:  # f16 pairs are <2 x half>
            h2 = L.VectorType(L.HalfType(), 2)
            regs = [b.bitcast(self.expr(e), h2) for e in st.a + st.b]
            types = [h2] * 6
        ptrs = [self._var_ptr(nm)[0] for nm in st.acc]
        acc = [b.load(p) for p in ptrs]
        d = b.call(self.intrinsic(name, L.LiteralStructType([tacc] * 4), types + [tacc] * 4), regs + acc)
        for i, p in enumerate(ptrs):
            b.store(b.extract_value(d, i), p)

    def _wgmma_target(self) -> None:
        if "wgmma" not in self.t.matrix:
            raise Refusal(f"kernel {self.k.name}", self.t.key, "warpgroup matrix products (wgmma) are lowered for nvptx:sm_90a only")

    def _descriptor(self, name: str, off: K.Expr, lbo: int, sbo: int, swizzle: int) -> list[L.Value]:
        """A wgmma matrix descriptor's two words for shared array ``name`` at byte ``off``: start
        address / 16, lbo / 16, sbo / 16, the swizzle mode (bits 62-63)."""
        b = self.b
        addr = b.add(b.ptrtoint(self.mem[name][0], I32), self.expr(off))
        start = b.and_(b.lshr(addr, L.Constant(I32, 4)), L.Constant(I32, 0x3FFF))
        layout = {0: 0, 128: 1, 64: 2, 32: 3}[swizzle] << 30
        return [b.or_(start, L.Constant(I32, (lbo >> 4) << 16)), L.Constant(I32, (sbo >> 4) | layout)]

    def lower_wgmma(self, st: Wgmma) -> None:
        """wgmma.mma_async by inline PTX (LLVM has no intrinsic for it): the two operands' matrix
        descriptors (start address / 16, lbo / 16, sbo / 16, the swizzle mode) built from the shared
        arrays' addresses, the accumulators read and written in place."""
        self._wgmma_target()
        b = self.b
        words: list[L.Value] = []
        for name, off in ((st.a, st.a_offset), (st.b, st.b_offset)):
            words += self._descriptor(name, off, st.lbo, st.sbo, st.swizzle)
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

    def lower_wgmma_reg_a(self, st: WgmmaRegA) -> None:
        """wgmma.mma_async with A's fragment in registers (f16), by inline PTX: B's descriptor built
        from its shared array's address as ``lower_wgmma`` builds it (swizzle 0)."""
        self._wgmma_target()
        b = self.b
        words = self._descriptor(st.b, st.b_offset, st.lbo, st.sbo, 0)
        na = len(st.acc)
        d = ", ".join(f"${i}" for i in range(na))
        a = ", ".join(f"${na + i}" for i in range(4))
        asm = (
            "{ .reg .b64 db; .reg .pred p; "
            f"mov.b64 db, {{${na + 4}, ${na + 5}}}; setp.ne.b32 p, ${na + 6}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{2 * na}k16.f32.f16.f16 {{{d}}}, {{{a}}}, db, p, 1, 1, 0; }}"
        )
        cons = ",".join(["=f"] * na + ["r"] * 7 + [str(i) for i in range(na)]) + ",~{memory}"
        fn = L.InlineAsm(L.FunctionType(L.LiteralStructType([F32] * na), [I32] * 7 + [F32] * na), asm, cons, side_effect=True)
        ptrs = [self._var_ptr(nm)[0] for nm in st.acc]
        regs = [self.expr(e) for e in st.a]
        out = b.call(fn, regs + words + [L.Constant(I32, int(st.accumulate))] + [b.load(p) for p in ptrs])
        for i, p in enumerate(ptrs):
            b.store(b.extract_value(out, i), p)

    def lower_wgmma_sync(self, st: WgmmaSync) -> None:
        self._wgmma_target()
        text = {
            "fence": "wgmma.fence.sync.aligned;",
            "commit": "wgmma.commit_group.sync.aligned;",
            "wait": f"wgmma.wait_group.sync.aligned {st.n};",
            "proxy": "fence.proxy.async.shared::cta;",
        }[st.op]
        self.b.call(L.InlineAsm(L.FunctionType(L.VoidType(), []), text, "~{memory}", side_effect=True), [])
