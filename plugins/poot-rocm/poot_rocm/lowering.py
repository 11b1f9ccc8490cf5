"""Kernel IR -> LLVM IR for AMDGPU: what the generic lowering (``poot.backend.KernelLowering``)
leaves to the target. Work-item and workgroup ids from the AMDGCN intrinsics (the grid's size from
the dispatch packet), barriers fenced at workgroup scope, shuffles through ``ds_bpermute``, private
memory in address space 5, and the target's data layout."""

from __future__ import annotations

from llvmlite import ir as L

from poot.backend import KernelLowering
from poot.backend import dtypes as dt
from poot.backend import kir as K

__all__ = ["AmdgpuLowering"]

I8, I32, F32 = L.IntType(8), L.IntType(32), L.FloatType()


class _PrivateAlloca(L.instructions.AllocaInstr):
    """An alloca printed with ``addrspace(5)`` (llvmlite's own has no address space)."""

    def descr(self, buf: list[str]) -> None:
        super().descr(buf)
        buf.append(", addrspace(5)")


class AmdgpuLowering(KernelLowering):
    def __init__(self, k: K.Kernel, tgt) -> None:  # type: ignore[no-untyped-def]
        super().__init__(k, tgt)
        import llvmlite.binding as llvm

        llvm.initialize_all_targets()
        self.m.data_layout = str(llvm.Target.from_triple(tgt.triple).create_target_machine(cpu=tgt.cpu).target_data)

    def entry_alloca(self, ty: L.Type, name: str) -> L.Value:
        a = super().entry_alloca(ty, name)
        a.__class__ = _PrivateAlloca  # AMDGPU's private memory is address space 5
        a.type = L.PointerType(ty, 5)
        return a

    def kernel_function(self, fn: L.Function) -> None:
        fn.calling_convention = "amdgpu_kernel"
        set.add(fn.attributes, f'"amdgpu-flat-work-group-size"="1,{self.k.threads}"')

    def gpu_builtin(self, e: K.Builtin) -> L.Value:
        b, xyz = self.b, "xyz"[e.dim]
        if e.kind == "thread_id":
            return b.call(self.intrinsic(f"llvm.amdgcn.workitem.id.{xyz}", I32, []), [])
        if e.kind == "group_id":
            return b.call(self.intrinsic(f"llvm.amdgcn.workgroup.id.{xyz}", I32, []), [])
        if e.kind == "lane_id":
            lo = b.call(self.intrinsic("llvm.amdgcn.mbcnt.lo", I32, [I32, I32]), [L.Constant(I32, -1), L.Constant(I32, 0)])
            return b.call(self.intrinsic("llvm.amdgcn.mbcnt.hi", I32, [I32, I32]), [L.Constant(I32, -1), lo])
        # num_groups: grid size (u32 at byte 12 + 4*dim of the dispatch packet) / workgroup size
        dp = b.call(self.intrinsic("llvm.amdgcn.dispatch.ptr", L.PointerType(I8, 4), []), [])
        gp = b.bitcast(b.gep(dp, [L.Constant(I32, 12 + 4 * e.dim)]), L.PointerType(I32, 4))
        return b.udiv(b.load(gp), L.Constant(I32, self.k.workgroup[e.dim]))

    def barrier(self) -> None:
        self.b.fence("release", "workgroup")
        self.b.call(self.intrinsic("llvm.amdgcn.s.barrier", L.VoidType(), []), [])
        self.b.fence("acquire", "workgroup")

    def shuffle_word(self, v: L.Value, lane: L.Value, t: dt.DType, xor: bool) -> L.Value:
        b = self.b
        bits = b.bitcast(v, I32) if t == dt.f32 else v
        me = self.builtin(K.Builtin("lane_id"))
        src = b.xor(me, lane) if xor else lane
        r = b.call(self.intrinsic("llvm.amdgcn.ds.bpermute", I32, [I32, I32]), [b.shl(src, L.Constant(I32, 2)), bits])
        return b.bitcast(r, F32) if t == dt.f32 else r
