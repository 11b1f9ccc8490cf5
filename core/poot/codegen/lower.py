"""Kernel IR -> LLVM IR (llvmlite.ir), for every target.

GPU targets get one kernel function per Kernel; thread and workgroup ids come from the target's
intrinsics. The host target gets a workgroup function that runs the workgroup's threads as loops:
statements between barriers become one loop over the threads, and variables that live across a
barrier become per-thread arrays, so barriers, shared memory and uniform loops keep their meaning.
A grid entry point runs a range of workgroups, so a thread pool can split the grid.
"""

from __future__ import annotations

from llvmlite import ir as L

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.dtypes import DType
from ..kernel import ir as K
from ..kernel.verify import uses_barriers, uses_subgroups, uses_swizzle, verify_kernel
from .matrix import MatrixLowering
from .targets import SHARED_ALIGN, Target, shared_layout

__all__ = ["lower_kernel", "llvm_type"]

I1, I8, I32, I64 = L.IntType(1), L.IntType(8), L.IntType(32), L.IntType(64)
F32 = L.FloatType()
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def llvm_type(t: DType) -> L.Type:
    return {
        "f32": F32, "f64": L.DoubleType(), "f16": L.HalfType(), "bf16": L.IntType(16),  # bf16: its bits; casts convert
        "i32": I32, "i64": I64, "i8": I8, "u8": I8, "bool": I1,
    }[t.name]


def _mem_type(t: DType) -> L.Type:
    return I8 if t == dt.boolean else llvm_type(t)


class _Lowerer(MatrixLowering):
    def __init__(self, k: K.Kernel, tgt: Target) -> None:
        self.k, self.t = k, tgt
        self.m = L.Module(name=k.name)
        self.m.triple = tgt.triple
        if tgt.name == "amdgcn":
            self.m.data_layout = _datalayout(tgt)
        self.host = tgt.name == "host"
        if k.threads > tgt.max_threads:
            raise Refusal(f"kernel {k.name}", tgt.key, f"workgroup of {k.threads} threads exceeds the target's {tgt.max_threads}")
        shared_bytes = sum(s.size * max(1, s.dtype.bits // 8) for s in k.shared)
        if shared_bytes > tgt.max_shared:
            raise Refusal(f"kernel {k.name}", tgt.key, f"{shared_bytes} bytes of workgroup memory exceed the target's {tgt.max_shared}")
        if uses_subgroups(k) and tgt.name == "spirv" and tgt.subgroup <= 1:
            raise Refusal(f"kernel {k.name}", tgt.key, "subgroup operations need the device's subgroup width: compile for "
                                                        "spirv_target(n) on a Vulkan device whose subgroups run them")
        self.barriers = uses_barriers(k)
        self.vars: dict[str, tuple[str, L.Value, DType]] = {}  # name -> (kind, storage, type)
        self.values: dict[str, L.Value] = {}  # scalar params
        self.mem: dict[str, tuple[L.Value, DType, int | None]] = {}  # name -> (base, element type, shared size)
        self.in_index = False
        self._intr: dict[str, L.Function] = {}

    # -- helpers ------------------------------------------------------------------------------------
    def intrinsic(self, name: str, ret: L.Type, args: list[L.Type]) -> L.Function:
        if name not in self._intr:
            self._intr[name] = L.Function(self.m, L.FunctionType(ret, args), name)
        return self._intr[name]

    def entry_alloca(self, ty: L.Type, name: str) -> L.Value:
        with self.b.goto_entry_block():
            a = self.b.alloca(ty, name=name)
        if self.t.name == "amdgcn":  # AMDGPU's private memory is address space 5
            a.__class__ = _PrivateAlloca
            a.type = L.PointerType(ty, 5)
        return a

    # -- functions ----------------------------------------------------------------------------------
    def lower(self) -> L.Module:
        k = self.k
        params = [L.PointerType(_mem_type(p.dtype), self.t.global_as) if isinstance(p, K.Buffer) else llvm_type(p.dtype) for p in k.params]
        offsets, dynamic = shared_layout(k, self.t)
        if dynamic and not self.host:  # one external array, sized at launch; each array a constant offset into it
            dyn = L.GlobalVariable(self.m, L.ArrayType(I8, 0), f"{k.name}_dynamic_shared", addrspace=self.t.shared_as)
            dyn.linkage = "external"
            dyn.align = SHARED_ALIGN
            for sh in k.shared:
                at = dyn.gep([L.Constant(I32, 0), L.Constant(I32, offsets[sh.name])])
                self.mem[sh.name] = (at.bitcast(L.PointerType(L.ArrayType(_mem_type(sh.dtype), sh.size), self.t.shared_as)), sh.dtype, sh.size)
        for sh in k.shared:
            if self.host or dynamic:
                continue
            g = L.GlobalVariable(self.m, L.ArrayType(_mem_type(sh.dtype), sh.size), f"{k.name}.{sh.name}", addrspace=self.t.shared_as)
            g.linkage = "internal"
            g.initializer = L.Constant(L.ArrayType(_mem_type(sh.dtype), sh.size), L.Undefined)
            g.align = SHARED_ALIGN if uses_swizzle(k) else 16  # a swizzle atom at an address aligned to its size
            self.mem[sh.name] = (g, sh.dtype, sh.size)
        if self.host:
            self._host_functions(params)
        else:
            self._gpu_function(params)
        return self.m

    def _bind_params(self, fn: L.Function) -> None:
        for p, a in zip(self.k.params, fn.args):
            a.name = p.name
            if isinstance(p, K.Buffer):
                a.add_attribute("noalias")
                if p.readonly:
                    set.add(a.attributes, "readonly")  # llvmlite does not list it, LLVM accepts it
                self.mem[p.name] = (a, p.dtype, None)
            else:
                self.values[p.name] = a

    def _gpu_function(self, params: list[L.Type]) -> None:
        fn = L.Function(self.m, L.FunctionType(L.VoidType(), params), self.k.name)
        if self.t.name == "nvptx":
            # no "nvvm.maxntid": with it ptxas caps registers for occupancy and spills (sm_90)
            fn.calling_convention = "ptx_kernel"
        elif self.t.name == "amdgcn":
            fn.calling_convention = "amdgpu_kernel"
            set.add(fn.attributes, f'"amdgpu-flat-work-group-size"="1,{self.k.threads}"')
        self._bind_params(fn)
        self.b = L.IRBuilder(fn.append_basic_block("entry"))
        self.block(self.k.body)
        self.b.ret_void()

    def _host_functions(self, params: list[L.Type]) -> None:
        k = self.k
        wg_params = params + [I32] * 6  # group id x y z, num groups x y z
        fn = L.Function(self.m, L.FunctionType(L.VoidType(), wg_params), f"{k.name}_workgroup")
        fn.linkage = "internal"
        self._bind_params(fn)
        self.gid = list(fn.args[len(params) : len(params) + 3])
        self.ngroups = list(fn.args[len(params) + 3 :])
        self.b = L.IRBuilder(fn.append_basic_block("entry"))
        for sh in k.shared:  # workgroup memory lives on the stack of the workgroup function
            self.mem[sh.name] = (self.b.alloca(L.ArrayType(_mem_type(sh.dtype), sh.size), name=sh.name), sh.dtype, sh.size)
        self.tid = self.b.alloca(I32, name="tid")
        if self.barriers:
            self.uniform_block(k.body)
        else:
            self.thread_loop(lambda: self.block(k.body))
        self.b.ret_void()
        # grid entry: run workgroups [start, stop) of the linearised grid (x fastest); the group id
        # is split once and then stepped, so no division runs per workgroup
        grid = L.Function(self.m, L.FunctionType(L.VoidType(), params + [I32] * 5), k.name)
        args = list(grid.args)
        nx, ny, nz, start, stop = args[len(params) :]
        b = L.IRBuilder(grid.append_basic_block("entry"))
        loop, body, done = grid.append_basic_block("loop"), grid.append_basic_block("body"), grid.append_basic_block("done")
        slots = {nm: b.alloca(I32, name=nm) for nm in ("g", "gx", "gy", "gz")}
        b.store(start, slots["g"])
        b.store(b.srem(start, nx), slots["gx"])
        b.store(b.srem(b.sdiv(start, nx), ny), slots["gy"])
        b.store(b.sdiv(start, b.mul(nx, ny)), slots["gz"])
        b.branch(loop)
        b.position_at_end(loop)
        cur = b.load(slots["g"])
        b.cbranch(b.icmp_signed("<", cur, stop), body, done)
        b.position_at_end(body)
        gx, gy, gz = (b.load(slots[nm]) for nm in ("gx", "gy", "gz"))
        b.call(fn, args[: len(params)] + [gx, gy, gz, nx, ny, nz])
        one, zero = L.Constant(I32, 1), L.Constant(I32, 0)
        gx1 = b.add(gx, one)
        wrap_x = b.icmp_signed(">=", gx1, nx)
        gy1 = b.select(wrap_x, b.add(gy, one), gy)
        wrap_y = b.icmp_signed(">=", gy1, ny)
        b.store(b.select(wrap_x, zero, gx1), slots["gx"])
        b.store(b.select(wrap_y, zero, gy1), slots["gy"])
        b.store(b.select(wrap_y, b.add(gz, one), gz), slots["gz"])
        b.store(b.add(cur, one), slots["g"])
        b.branch(loop)
        b.position_at_end(done)
        b.ret_void()
        self._packed_entry(grid, params)

    def _packed_entry(self, grid: L.Function, params: list[L.Type]) -> None:
        """``<name>_packed(i64* args, i32 start, i32 stop)``: one signature for every kernel, so a
        native dispatcher can run a recorded chain of launches. ``args`` holds one 64-bit slot per
        parameter (a pointer, an integer sign-extended, a float's bits in the low half) and then
        the grid's x, y and z."""
        I64 = L.IntType(64)
        fn = L.Function(self.m, L.FunctionType(L.VoidType(), [L.PointerType(I64), I32, I32]), f"{self.k.name}_packed")
        slots, start, stop = fn.args
        b = L.IRBuilder(fn.append_basic_block("entry"))
        vals: list[L.Value] = []
        for i, ty in enumerate(params + [I32] * 3):
            raw = b.load(b.gep(slots, [L.Constant(I32, i)]))
            if isinstance(ty, L.PointerType):
                vals.append(b.inttoptr(raw, ty))
            elif isinstance(ty, L.IntType):
                vals.append(raw if ty.width == 64 else b.trunc(raw, ty))
            elif isinstance(ty, L.DoubleType):
                vals.append(b.bitcast(raw, ty))
            else:
                vals.append(b.bitcast(b.trunc(raw, I32), ty))
        b.call(grid, vals + [start, stop])
        b.ret_void()

    def thread_loop(self, emit) -> None:  # type: ignore[no-untyped-def]
        """for tid in range(threads): emit()."""
        b = self.b
        fn = b.function
        head, body, done = fn.append_basic_block("t.head"), fn.append_basic_block("t.body"), fn.append_basic_block("t.done")
        b.store(L.Constant(I32, 0), self.tid)
        b.branch(head)
        b.position_at_end(head)
        b.cbranch(b.icmp_signed("<", b.load(self.tid), L.Constant(I32, self.k.threads)), body, done)
        b.position_at_end(body)
        emit()
        b.store(b.add(b.load(self.tid), L.Constant(I32, 1)), self.tid)
        b.branch(head)
        b.position_at_end(done)

    def uniform_block(self, body) -> None:  # type: ignore[no-untyped-def]
        """Host: statements at workgroup level; barrier-free runs become thread loops."""
        run: list[K.Stmt] = []

        def flush() -> None:
            if run:
                stmts = list(run)
                self.thread_loop(lambda: self.block(stmts))
                run.clear()

        for st in body:
            has_barrier = isinstance(st, K.Barrier) or ((isinstance(st, (K.For, K.If))) and uses_barriers(K.Kernel("x", (), (st,))))
            if not has_barrier:
                run.append(st)
                continue
            flush()
            if isinstance(st, K.Barrier):
                continue
            b = self.b
            b.store(L.Constant(I32, 0), self.tid)  # uniform values are read as thread 0 sees them
            if isinstance(st, K.If):
                cond = self.expr(st.cond)
                with b.if_else(cond) as (then, other):
                    with then:
                        self.uniform_block(st.then)
                    with other:
                        self.uniform_block(st.orelse)
            else:
                self._loop(st, self.uniform_block, uniform=True)
        flush()

    # -- statements ---------------------------------------------------------------------------------
    def block(self, body) -> None:  # type: ignore[no-untyped-def]
        for st in body:
            self.stmt(st)

    def _var_ptr(self, name: str) -> tuple[L.Value, DType]:
        kind, store, t = self.vars[name]
        if kind == "thread":
            return self.b.gep(store, [L.Constant(I32, 0), self.b.load(self.tid)]), t
        return store, t

    def stmt(self, st: K.Stmt) -> None:
        b = self.b
        if isinstance(st, K.Let):
            v = self.expr(st.value)
            t = st.value.dtype  # type: ignore[union-attr]
            if self.host and self.barriers:
                store = self.entry_alloca(L.ArrayType(llvm_type(t), self.k.threads), st.name)
                self.vars[st.name] = ("thread", store, t)
            else:
                self.vars[st.name] = ("scalar", self.entry_alloca(llvm_type(t), st.name), t)
            ptr, _ = self._var_ptr(st.name)
            b.store(v, ptr)
        elif isinstance(st, K.Assign):
            ptr, _ = self._var_ptr(st.name)
            b.store(self.expr(st.value), ptr)
        elif isinstance(st, K.Store):
            ptr, t = self.address(st.buffer, st.index)
            v = self.expr(st.value)
            b.store(b.zext(v, I8) if t == dt.boolean else v, ptr)
        elif isinstance(st, K.AtomicAdd):
            ptr, t = self.address(st.buffer, st.index)
            b.atomic_rmw("fadd" if t.is_float else "add", ptr, self.expr(st.value), "monotonic")
        elif isinstance(st, K.If):
            cond = self.expr(st.cond)
            if st.orelse:
                with b.if_else(cond) as (then, other):
                    with then:
                        self.block(st.then)
                    with other:
                        self.block(st.orelse)
            else:
                with b.if_then(cond):
                    self.block(st.then)
        elif isinstance(st, K.For):
            self._loop(st, self.block, uniform=False)
        elif isinstance(st, K.Barrier):
            self.barrier()
        elif isinstance(st, K.VecLoad):
            ptr, t = self.address(st.buffer, st.index)
            vec = L.VectorType(_mem_type(t), len(st.names))
            v = b.load(b.bitcast(ptr, L.PointerType(vec, ptr.type.addrspace)))
            for i, nm in enumerate(st.names):
                self.stmt(K.Let(nm, K.Const(0, t)))  # declares the local (typed) then overwrite
                ptr_v, _ = self._var_ptr(nm)
                b.store(b.extract_element(v, L.Constant(I32, i)), ptr_v)
        elif isinstance(st, K.VecStore):
            ptr, t = self.address(st.buffer, st.index)
            vec = L.VectorType(_mem_type(t), len(st.values))
            acc: L.Value = L.Constant(vec, L.Undefined)
            for i, val in enumerate(st.values):
                acc = b.insert_element(acc, self.expr(val), L.Constant(I32, i))
            b.store(acc, b.bitcast(ptr, L.PointerType(vec, ptr.type.addrspace)))
        elif isinstance(st, K.MmaTile):
            self.mma(st)
        elif isinstance(st, K.Mma):
            self.mma_sync(st)
        elif isinstance(st, K.Wgmma):
            self.wgmma(st)
        elif isinstance(st, K.WgmmaSync):
            self.wgmma_sync(st)
        elif isinstance(st, K.CopyAsync):
            self.copy_async(st)
        elif isinstance(st, K.CopyAsyncSync):
            if self.t.name == "nvptx":  # (elsewhere the copies were ordinary loads and stores: nothing to wait for)
                if st.op == "commit":
                    b.call(self.intrinsic("llvm.nvvm.cp.async.commit.group", L.VoidType(), []), [])
                else:
                    b.call(self.intrinsic("llvm.nvvm.cp.async.wait.group", L.VoidType(), [I32]), [L.Constant(I32, st.n)])
        else:
            raise Refusal(f"kernel {self.k.name}", self.t.key, f"cannot lower statement {type(st).__name__}")

    def _loop(self, st: K.For, emit_body, uniform: bool) -> None:  # type: ignore[no-untyped-def]
        b = self.b
        fn = b.function
        start, stop = self.expr(st.start), self.expr(st.stop)
        if uniform or not (self.host and self.barriers):
            var = self.entry_alloca(I32, st.var)
            self.vars[st.var] = ("scalar", var, dt.i32)
        else:
            var = self.entry_alloca(L.ArrayType(I32, self.k.threads), st.var)
            self.vars[st.var] = ("thread", var, dt.i32)
        ptr, _ = self._var_ptr(st.var)
        b.store(start, ptr)
        head, body, done = fn.append_basic_block(f"{st.var}.head"), fn.append_basic_block(f"{st.var}.body"), fn.append_basic_block(f"{st.var}.done")
        b.branch(head)
        b.position_at_end(head)
        ptr, _ = self._var_ptr(st.var)
        b.cbranch(b.icmp_signed("<", b.load(ptr), stop), body, done)
        b.position_at_end(body)
        emit_body(st.body)
        if uniform:
            b.store(L.Constant(I32, 0), self.tid)
        ptr, _ = self._var_ptr(st.var)
        b.store(b.add(b.load(ptr), L.Constant(I32, st.step), flags=("nsw",)), ptr)  # loop counters never wrap
        b.branch(head)
        b.position_at_end(done)
        del self.vars[st.var]

    def barrier(self) -> None:
        b = self.b
        if self.t.name == "nvptx":
            b.call(self.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", L.VoidType(), [I32]), [L.Constant(I32, 0)])
        elif self.t.name == "amdgcn":
            b.fence("release", "workgroup")
            b.call(self.intrinsic("llvm.amdgcn.s.barrier", L.VoidType(), []), [])
            b.fence("acquire", "workgroup")
        elif self.t.name == "spirv":
            b.call(self.intrinsic("llvm.spv.group.memory.barrier.with.group.sync", L.VoidType(), []), [])

    # -- expressions --------------------------------------------------------------------------------
    def address(self, name: str, index: K.Expr) -> tuple[L.Value, DType]:
        base, t, size = self.mem[name]
        self.in_index = True  # index arithmetic is in bounds: it cannot wrap (nsw lets LLVM see strides)
        try:
            idx = self.expr(index)
        finally:
            self.in_index = False
        if size is None:  # a buffer argument
            return self.b.gep(base, [idx], inbounds=True), t
        return self.b.gep(base, [L.Constant(I32, 0), idx], inbounds=True), t

    def builtin(self, e: K.Builtin) -> L.Value:
        b, k = self.b, self.k
        if e.kind == "group_size":
            return L.Constant(I32, k.workgroup[e.dim])
        if e.kind == "subgroup_size":
            return L.Constant(I32, self.t.subgroup)
        if self.host:
            if e.kind == "thread_id":
                tid = b.load(self.tid)
                x, y, _ = k.workgroup
                if e.dim == 0:
                    return b.srem(tid, L.Constant(I32, x)) if (y, k.workgroup[2]) != (1, 1) else tid
                if e.dim == 1:
                    return b.srem(b.sdiv(tid, L.Constant(I32, x)), L.Constant(I32, y))
                return b.sdiv(tid, L.Constant(I32, x * y))
            if e.kind == "lane_id":
                return L.Constant(I32, 0)
            return (self.gid if e.kind == "group_id" else self.ngroups)[e.dim]
        xyz = "xyz"[e.dim]
        if self.t.name == "nvptx":
            reg = {"thread_id": "tid", "group_id": "ctaid", "num_groups": "nctaid", "lane_id": "laneid"}[e.kind]
            name = f"llvm.nvvm.read.ptx.sreg.{reg}" + ("" if reg == "laneid" else f".{xyz}")
            return b.call(self.intrinsic(name, I32, []), [])
        if self.t.name == "amdgcn":
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
            return b.udiv(b.load(gp), L.Constant(I32, k.workgroup[e.dim]))
        # spirv
        name = {"thread_id": "llvm.spv.thread.id.in.group.i32", "group_id": "llvm.spv.group.id.i32", "num_groups": "llvm.spv.num.workgroups.i32"}.get(e.kind)
        if name is None:
            raise Refusal(f"kernel {k.name}", self.t.key, f"builtin {e.kind} is not lowered for SPIR-V")
        return b.call(self.intrinsic(name, I32, [I32]), [L.Constant(I32, e.dim)])

    def expr(self, e: K.Expr) -> L.Value:
        b = self.b
        if isinstance(e, K.Const):
            ty = llvm_type(e.dtype)
            return L.Constant(ty, float(e.value) if e.dtype.is_float else int(e.value))
        if isinstance(e, K.Ref):
            if e.name in self.values:
                return self.values[e.name]
            ptr, _ = self._var_ptr(e.name)
            return b.load(ptr)
        if isinstance(e, K.Builtin):
            return self.builtin(e)
        if isinstance(e, K.Bin):
            return self.binary(e.op, self.expr(e.a), self.expr(e.b), e.a.dtype)
        if isinstance(e, K.Un):
            return self.unary(e.op, self.expr(e.a), e.a.dtype)
        if isinstance(e, K.Cast):
            return self.cast(self.expr(e.a), e.a.dtype, e.dtype)
        if isinstance(e, K.Bitcast):
            return b.bitcast(self.expr(e.a), llvm_type(e.dtype))
        if isinstance(e, K.HalfToF32):
            return b.fpext(b.bitcast(b.trunc(self.expr(e.a), L.IntType(16)), L.HalfType()), llvm_type(dt.f32))
        if isinstance(e, K.Select):
            return b.select(self.expr(e.cond), self.expr(e.a), self.expr(e.b))
        if isinstance(e, K.Load):
            ptr, t = self.address(e.buffer, e.index)
            v = b.load(ptr)
            return b.icmp_unsigned("!=", v, L.Constant(I8, 0)) if t == dt.boolean else v
        if isinstance(e, K.SubgroupReduce):
            return self.subgroup_reduce(e.op, self.expr(e.a), e.a.dtype)
        if isinstance(e, K.SubgroupShuffle):
            return self.shuffle(self.expr(e.a), self.expr(e.lane), e.a.dtype, e.xor)
        if isinstance(e, K.Dot4I8):
            return self.dot4_i8(self.expr(e.a), self.expr(e.b), self.expr(e.c))
        if isinstance(e, K.PackBf16x2):
            return self.pack_bf16x2(self.expr(e.a), self.expr(e.b))
        raise Refusal(f"kernel {self.k.name}", self.t.key, f"cannot lower expression {type(e).__name__}")

    def dot4_i8(self, a: L.Value, c: L.Value, acc: L.Value) -> L.Value:
        """acc + the dot product of the signed bytes of a and c: dp4a on NVIDIA, byte arithmetic elsewhere."""
        b = self.b
        if self.t.name == "nvptx":
            return b.call(self.intrinsic("llvm.nvvm.idp4a.s.s", I32, [I32, I32, I32]), [a, c, acc])
        for i in range(4):
            up = L.Constant(I32, 24 - 8 * i)
            x = b.ashr(b.shl(a, up), L.Constant(I32, 24))
            y = b.ashr(b.shl(c, up), L.Constant(I32, 24))
            acc = b.add(acc, b.mul(x, y))
        return acc

    def pack_bf16x2(self, lo: L.Value, hi: L.Value) -> L.Value:
        """The nearest bf16 of each of two f32, ``lo`` in the low half of an i32: one cvt on NVIDIA."""
        b = self.b
        if self.t.name == "nvptx":  # cvt puts its first source in the upper half
            asm = L.InlineAsm(L.FunctionType(I32, [F32, F32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
            return b.call(asm, [hi, lo])
        halves = []
        for v in (lo, hi):  # round to nearest even in 32-bit integers (SPIR-V here has no 16-bit type)
            bits = b.bitcast(v, I32)
            lsb = b.and_(b.lshr(bits, L.Constant(I32, 16)), L.Constant(I32, 1))
            halves.append(b.lshr(b.add(bits, b.add(L.Constant(I32, 0x7FFF), lsb)), L.Constant(I32, 16)))
        return b.or_(b.and_(halves[0], L.Constant(I32, 0xFFFF)), b.shl(halves[1], L.Constant(I32, 16)))

    def fcall(self, name: str, *args: L.Value) -> L.Value:
        ty = args[0].type
        return self.b.call(self.intrinsic(f"{name}.{_suffix(ty)}", ty, [ty] * len(args)), list(args))

    def binary(self, op: str, a: L.Value, c: L.Value, t: DType) -> L.Value:
        b = self.b
        if t.is_float:
            if op in K.CMP_OPS:
                return b.fcmp_ordered({"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op], a, c)
            if op == "pow":
                if self.t.name == "host":
                    return self.fcall("llvm.pow", a, c)
                return self.unary("exp2", b.fmul(c, self.unary("log2", a, t)), t)
            fn = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv, "rem": b.frem}.get(op)
            if fn is not None:
                if self.host and op in ("add", "sub", "mul"):
                    return fn(a, c, flags=("contract",))  # numerics policy: the host fuses a * b + c into one FMA
                return fn(a, c)
            return self.fcall("llvm.minnum" if op == "min" else "llvm.maxnum", a, c)
        if op in K.CMP_OPS:
            sign = t != dt.u8
            pred = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op]
            return b.icmp_signed(pred, a, c) if sign else b.icmp_unsigned(pred, a, c)
        if op == "min":
            return b.select(b.icmp_signed("<", a, c), a, c)
        if op == "max":
            return b.select(b.icmp_signed(">", a, c), a, c)
        if op in ("add", "sub", "mul") and self.in_index:
            return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](a, c, flags=("nsw",))
        return {"add": b.add, "sub": b.sub, "mul": b.mul, "div": b.sdiv, "rem": b.srem, "and": b.and_, "or": b.or_, "xor": b.xor,
                "shl": b.shl, "shr": b.ashr}[op](a, c)

    def unary(self, op: str, a: L.Value, t: DType) -> L.Value:
        b = self.b
        if op == "neg":
            return b.fneg(a) if t.is_float else b.neg(a)
        if op == "not":
            return b.not_(a)
        if op == "abs":
            return self.fcall("llvm.fabs", a) if t.is_float else b.select(b.icmp_signed("<", a, L.Constant(a.type, 0)), b.neg(a), a)
        one = L.Constant(a.type, 1.0)
        if op == "recip":
            return b.fdiv(one, a)
        if op == "sqrt":
            return self.fcall("llvm.sqrt", a)
        if op == "rsqrt":
            return b.fdiv(one, self.fcall("llvm.sqrt", a))
        if op == "floor":
            return self.fcall("llvm.floor", a)
        if op == "rint":  # to nearest, ties to even
            return self.fcall("llvm.rint", a)
        if op == "erf":
            return self._erf(a)
        gpu = self.t.name in ("nvptx", "amdgcn")
        if op in ("exp", "exp2"):
            x = b.fmul(a, L.Constant(a.type, LOG2E)) if op == "exp" else a
            if self.t.name == "nvptx":
                return b.call(self.intrinsic("llvm.nvvm.ex2.approx.ftz.f", F32, [F32]), [x])
            return self.fcall("llvm.exp2", x) if gpu or op == "exp2" else self.fcall("llvm.exp", a)
        if op in ("log", "log2"):
            if self.t.name == "nvptx":
                y = b.call(self.intrinsic("llvm.nvvm.lg2.approx.ftz.f", F32, [F32]), [a])
            elif gpu:
                y = self.fcall("llvm.log2", a)
            else:
                return self.fcall("llvm.log" if op == "log" else "llvm.log2", a)
            return b.fmul(y, L.Constant(a.type, LN2)) if op == "log" else y
        if op in ("sin", "cos"):
            if self.t.name in ("nvptx", "spirv"):
                # sin.approx (and Vulkan's sin/cos, whose precision the spec leaves open: NVIDIA's
                # driver loses it at large angles) is accurate on [-pi, pi] only: reduce by 2*pi first
                # (Cody-Waite, two constants; k * 6.28125 is exact below 2**15 turns), so large angles
                # (RoPE at long positions) keep about 1e-6 absolute error
                k = self.fcall("llvm.rint", b.fmul(a, L.Constant(F32, 0.15915494309189535)))
                if self.t.name == "spirv":
                    r = b.fsub(a, b.fmul(k, L.Constant(F32, 6.28125)))
                    r = b.fsub(r, b.fmul(k, L.Constant(F32, 0.0019353071795864769)))
                    return self.fcall(f"llvm.{op}", r)
                r = self.fcall("llvm.fma", b.fneg(k), L.Constant(F32, 6.28125), a)
                r = self.fcall("llvm.fma", b.fneg(k), L.Constant(F32, 0.0019353071795864769), r)
                return b.call(self.intrinsic(f"llvm.nvvm.{op}.approx.ftz.f", F32, [F32]), [r])
            return self.fcall(f"llvm.{op}", a)
        if op == "tanh":
            # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both tails, no libm call on any target
            e2 = self.unary("exp", b.fmul(a, L.Constant(a.type, 2.0)), t)
            return b.fsub(one, b.fdiv(L.Constant(a.type, 2.0), b.fadd(e2, one)))
        raise Refusal(f"kernel {self.k.name}", self.t.key, f"function {op} is not lowered")

    def _erf(self, x: L.Value) -> L.Value:
        """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
        b, t = self.b, dt.f32
        ax = self.fcall("llvm.fabs", x)
        tt = b.fdiv(L.Constant(F32, 1.0), b.fadd(L.Constant(F32, 1.0), b.fmul(L.Constant(F32, 0.3275911), ax)))
        poly = L.Constant(F32, 1.061405429)
        for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            poly = b.fadd(b.fmul(poly, tt), L.Constant(F32, c))
        poly = b.fmul(poly, tt)
        y = b.fsub(L.Constant(F32, 1.0), b.fmul(poly, self.unary("exp", b.fneg(b.fmul(ax, ax)), t)))
        if self.t.name == "spirv":  # the sign bit moved by integer operations: LLVM 22's SPIR-V backend
            # crashes on what InstCombine makes of select(x < 0, -y, y) when x is a product
            sign = b.and_(b.bitcast(x, I32), L.Constant(I32, -0x80000000))
            return b.bitcast(b.or_(b.bitcast(y, I32), sign), F32)
        return b.select(b.fcmp_ordered("<", x, L.Constant(F32, 0.0)), b.fneg(y), y)

    def cast(self, v: L.Value, src: DType, dst: DType) -> L.Value:
        b = self.b
        if src == dst:
            return v
        to = llvm_type(dst)
        if src == dt.bf16:  # the upper half of an f32
            return self.cast(b.bitcast(b.shl(b.zext(v, I32), L.Constant(I32, 16)), F32), dt.f32, dst)
        if dst == dt.bf16:  # round to nearest even, keep the upper half
            bits = b.bitcast(self.cast(v, src, dt.f32), I32)
            lsb = b.and_(b.lshr(bits, L.Constant(I32, 16)), L.Constant(I32, 1))
            rounded = b.lshr(b.add(bits, b.add(L.Constant(I32, 0x7FFF), lsb)), L.Constant(I32, 16))
            return b.trunc(rounded, to)
        if dst == dt.boolean:
            return b.fcmp_unordered("!=", v, L.Constant(v.type, 0.0)) if src.is_float else b.icmp_unsigned("!=", v, L.Constant(v.type, 0))
        if src.is_float and dst.is_float:
            return b.fpext(v, to) if dst.bits > src.bits else b.fptrunc(v, to) if dst.bits < src.bits else b.fptrunc(b.fpext(v, F32), to)
        if src.is_float:
            return b.fptosi(v, to)
        if dst.is_float:
            return b.uitofp(v, to) if src in (dt.u8, dt.boolean) else b.sitofp(v, to)
        if dst.bits > src.bits or src == dt.boolean:
            return b.zext(v, to) if src in (dt.u8, dt.boolean) else b.sext(v, to)
        return b.trunc(v, to)

    def subgroup_reduce(self, op: str, v: L.Value, t: DType) -> L.Value:
        width = self.t.subgroup
        off = 1
        while off < width:
            other = self.shuffle(v, L.Constant(I32, off), t, xor=True)
            v = self.binary(op if op != "add" else "add", v, other, t)
            off *= 2
        return v

    def shuffle(self, v: L.Value, lane: L.Value, t: DType, xor: bool) -> L.Value:
        b = self.b
        if self.host:
            return v  # one lane per subgroup
        bits = b.bitcast(v, I32) if t == dt.f32 else v
        if self.t.name == "nvptx":
            name = "llvm.nvvm.shfl.sync.bfly.i32" if xor else "llvm.nvvm.shfl.sync.idx.i32"
            r = b.call(self.intrinsic(name, I32, [I32, I32, I32, I32]), [L.Constant(I32, -1), bits, lane, L.Constant(I32, 0x1F)])
        else:
            me = self.builtin(K.Builtin("lane_id"))
            src = b.xor(me, lane) if xor else lane
            r = b.call(self.intrinsic("llvm.amdgcn.ds.bpermute", I32, [I32, I32]), [b.shl(src, L.Constant(I32, 2)), bits])
        return b.bitcast(r, F32) if t == dt.f32 else r


class _PrivateAlloca(L.instructions.AllocaInstr):
    """An alloca printed with ``addrspace(5)`` (llvmlite's own has no address space)."""

    def descr(self, buf: list[str]) -> None:
        super().descr(buf)
        buf.append(", addrspace(5)")


def _suffix(ty: L.Type) -> str:
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}[str(ty)]


def lower_kernel(k: K.Kernel, tgt: Target) -> L.Module:
    """Verify ``k`` and lower it for ``tgt`` (a Refusal when the target cannot do something)."""
    verify_kernel(k, tgt.max_threads)
    if tgt.name == "spirv":
        from .spirv import SpirvLowerer

        return SpirvLowerer(k, tgt).lower()
    return _Lowerer(k, tgt).lower()


def _datalayout(tgt: Target) -> str:
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    return str(llvm.Target.from_triple(tgt.triple).create_target_machine(cpu=tgt.cpu).target_data)
