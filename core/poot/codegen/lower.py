"""Kernel IR -> LLVM IR (llvmlite.ir): the generic lowering every target shares.

``KernelLowering`` lowers the whole IR; a GPU target subclasses it (named by ``Target.lowering``)
and supplies what is its own: thread and workgroup ids (``gpu_builtin``), barriers, the kernel
function's calling convention and attributes, subgroup shuffles, fast math, and the lowering of
its own statements (``lower_<name>`` for a ``TargetStmt``, ``lower_mma_tile``, asynchronous copies,
waits for the launch before, prefetches). The host lowering is this class itself. The host target gets a workgroup function that runs the workgroup's threads as loops:
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
from ..kernel.verify import awaits_prior, shared_alignment, uses_barriers, verify_kernel
from .arith import I8, I32, ArithmeticLowering, llvm_type
from .arith import mem_type as _mem_type
from .targets import SHARED_ALIGN, Target, import_ref, shared_layout

__all__ = ["KernelLowering", "lower_kernel", "llvm_type", "mem_type"]

mem_type = _mem_type


class KernelLowering(ArithmeticLowering):
    """Lowers one kernel for one target: ``KernelLowering(kernel, target).lower()`` -> an LLVM
    module. Subclasses for GPU targets override the hooks below; every other statement and
    expression lowers the same way on every target."""

    def __init__(self, k: K.Kernel, tgt: Target) -> None:
        self.k, self.t = k, tgt
        self.m = L.Module(name=k.name)
        self.m.triple = tgt.triple
        self.host = tgt.name == "host"
        if k.threads > tgt.max_threads:
            raise Refusal(f"kernel {k.name}", tgt.key, f"workgroup of {k.threads} threads exceeds the target's {tgt.max_threads}")
        shared_bytes = sum(s.size * max(1, s.dtype.bits // 8) for s in k.shared)
        if shared_bytes > tgt.max_shared:
            raise Refusal(f"kernel {k.name}", tgt.key, f"{shared_bytes} bytes of workgroup memory exceed the target's {tgt.max_shared}")
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
            return self.b.alloca(ty, name=name)

    # -- what a GPU target supplies -----------------------------------------------------------------
    def kernel_function(self, fn: L.Function) -> None:
        """Mark ``fn`` as the target's kernel entry (calling convention, attributes)."""

    def gpu_builtin(self, e: K.Builtin) -> L.Value:
        """A thread's id, its workgroup's, the grid's size or its lane, from the target's intrinsics."""
        raise Refusal(f"kernel {self.k.name}", self.t.key, f"builtin {e.kind} is not lowered for this target")

    def barrier(self) -> None:
        """A workgroup barrier (memory ordered across it)."""
        raise Refusal(f"kernel {self.k.name}", self.t.key, "workgroup barriers are not lowered for this target")

    def fence(self) -> None:
        """``Fence``: order this thread's memory operations for other workgroups."""
        self.b.fence("acq_rel")

    def await_prior(self) -> None:
        """``AwaitPrior``: nothing where launches are not programmatic."""

    def prefetch(self, st: K.Prefetch) -> None:
        """``Prefetch``: a hint. On the host, each 64-byte line of a range of constant length (16
        lines at most) is asked for (``llvm.prefetch``: read, locality 2, x86's ``prefetcht1``: into
        the L2, not the L1, where it would hold one of the core's few L1 miss buffers that the
        loads of the moment need);
        nothing on targets with no engine for it."""
        if not self.host or not isinstance(st.nbytes, K.Const):
            return
        ptr, _ = self.address(st.buffer, st.index)
        i8p = L.PointerType(I8, ptr.type.addrspace)
        fn = self.intrinsic("llvm.prefetch.p0", L.VoidType(), [i8p, I32, I32, I32])
        base = self.b.bitcast(ptr, i8p)
        for line in range(0, min(int(st.nbytes.value), 1024), 64):
            at = self.b.gep(base, [L.Constant(I32, line)]) if line else base
            self.b.call(fn, [at, L.Constant(I32, 0), L.Constant(I32, 2), L.Constant(I32, 1)])

    def copy_async(self, st: K.CopyAsync) -> None:
        """``CopyAsync`` where the target has no copy engine: four loads and stores of the 4-byte
        elements (``copy_same_type`` targets refuse copies between arrays of other element types)."""
        b = self.b
        for i in range(4):
            frm, ft = self.address(st.buffer, K.Bin("add", st.index, K.Const(i, dt.i32)))
            to, tt = self.address(st.shared, K.Bin("add", st.at, K.Const(i, dt.i32)))
            if ft != tt and self.copy_same_type:
                raise Refusal(
                    f"kernel {self.k.name}",
                    self.t.key,
                    f"an asynchronous copy from {ft} '{st.buffer}' into {tt} '{st.shared}': this target copies between arrays of one element type",
                )
            v = b.load(frm)
            b.store(v if ft == tt else b.bitcast(v, to.type.pointee), to)

    copy_same_type = False

    def copy_async_sync(self, st: K.CopyAsyncSync) -> None:
        """``CopyAsyncSync``: nothing where copies were ordinary loads and stores."""

    def lower_mma_tile(self, st: K.MmaTile) -> None:
        raise Refusal(f"kernel {self.k.name}", self.t.key, "no matrix multiply-accumulate instructions are lowered for this target")

    def target_stmt(self, st: K.TargetStmt) -> None:
        """A target's own statement, by its ``lower_<lowering>`` method."""
        method = getattr(self, f"lower_{st.lowering}", None) if st.lowering else None
        if method is None:
            raise Refusal(f"kernel {self.k.name}", self.t.key, f"cannot lower {type(st).__name__} (a statement of another target)")
        method(st)

    def lower_dot_bytes(self, st: K.DotBytes) -> None:
        """``DotBytes``: on hosts with VNNI, 16 lanes (AVX-512) or 8 (AVX-VNNI) a ``vpdpbusd``;
        elsewhere each lane's four byte products by integer arithmetic."""
        b = self.b
        feats = set(self.t.features.split(",")) if self.host else set()
        width = 16 if "+avx512vnni" in feats else 8 if "+avxvnni" in feats or {"+avx512vnni", "+avx512vl"} <= feats else 1
        if st.n % width:
            width = 1
        for c in range(0, st.n, width):
            ptrs = [self.address(arr, K.Bin("add", at, K.Const(c, dt.i32)))[0] for arr, at in ((st.acc, st.acc_at), (st.a, st.a_at), (st.b, st.b_at))]
            if width == 1:
                acc, x, y = (b.load(p) for p in ptrs)
                for i in range(4):
                    up = L.Constant(I32, 24 - 8 * i)
                    xi = b.lshr(b.shl(x, up), L.Constant(I32, 24))
                    yi = b.ashr(b.shl(y, up), L.Constant(I32, 24))
                    acc = b.add(acc, b.mul(xi, yi))
                b.store(acc, ptrs[0])
                continue
            vec = L.VectorType(I32, width)
            acc, x, y = (b.load(b.bitcast(p, L.PointerType(vec, p.type.addrspace)), align=4) for p in ptrs)
            fn = self.intrinsic(f"llvm.x86.avx512.vpdpbusd.{32 * width}", vec, [vec, vec, vec])
            b.store(b.call(fn, [acc, x, y]), b.bitcast(ptrs[0], L.PointerType(vec, ptrs[0].type.addrspace)), align=4)

    def lower_spread_bits(self, st: K.SpreadBits) -> None:
        """``SpreadBits``: with AVX-512 BW the 64 bits as a mask of 64 bytes; elsewhere each byte's
        bit by shifts."""
        b = self.b
        ptr, _ = self.address(st.arr, st.at)
        lo, hi = self.expr(st.lo), self.expr(st.hi)
        if self.host and "+avx512bw" in self.t.features.split(","):
            i64 = L.IntType(64)
            bits = b.or_(b.zext(lo, i64), b.shl(b.zext(hi, i64), L.Constant(i64, 32)))
            v8 = L.VectorType(I8, 64)
            spread = b.zext(b.bitcast(bits, L.VectorType(L.IntType(1), 64)), v8)
            if st.shift:
                spread = b.shl(spread, L.Constant(v8, [st.shift] * 64))
            vp = b.bitcast(ptr, L.PointerType(v8, ptr.type.addrspace))
            b.store(b.or_(b.load(vp, align=4), spread), vp, align=4)
            return
        for lane in range(16):
            word = lo if lane < 8 else hi
            p, _ = self.address(st.arr, K.Bin("add", st.at, K.Const(lane, dt.i32)))
            acc = b.load(p)
            for byte in range(4):
                bit = b.and_(b.lshr(word, L.Constant(I32, (4 * lane + byte) % 32)), L.Constant(I32, 1))
                acc = b.or_(acc, b.shl(bit, L.Constant(I32, 8 * byte + st.shift)))
            b.store(acc, p)

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
            g.align = SHARED_ALIGN if shared_alignment(k) > 16 else 16  # (a swizzle atom at an address aligned to its size)
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
        self.kernel_function(fn)
        self._bind_params(fn)
        self.b = L.IRBuilder(fn.append_basic_block("entry"))
        if not awaits_prior(self.k):  # a kernel that places no wait of its own waits first
            self.await_prior()
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
            old = b.atomic_rmw("fadd" if t.is_float else "add", ptr, self.expr(st.value), "monotonic")  # ordered by Fence statements
            if st.old:
                self.stmt(K.Let(st.old, K.Const(0, t)))
                dst, _ = self._var_ptr(st.old)
                b.store(old, dst)
        elif isinstance(st, K.Fence):
            self.fence()
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
            self.lower_mma_tile(st)
        elif isinstance(st, K.CopyAsync):
            self.copy_async(st)
        elif isinstance(st, K.AwaitPrior):
            self.await_prior()
        elif isinstance(st, K.Prefetch):
            self.prefetch(st)
        elif isinstance(st, K.CopyAsyncSync):
            self.copy_async_sync(st)
        elif isinstance(st, K.TargetStmt):
            self.target_stmt(st)
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
        return self.gpu_builtin(e)

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
        if isinstance(e, K.LoadWord):
            if self.host:
                ptr, _ = self.address(e.buffer, e.index)
                return b.load(b.bitcast(ptr, L.PointerType(I32, ptr.type.addrspace)), align=1)
            word: L.Value = L.Constant(I32, 0)
            for i in range(4):
                ptr, _ = self.address(e.buffer, K.Bin("add", e.index, K.Const(i, dt.i32)))
                word = b.or_(word, b.shl(b.zext(b.load(ptr), I32), L.Constant(I32, 8 * i)))
            return word
        if isinstance(e, K.SubgroupReduce):
            return self.subgroup_reduce(e.op, self.expr(e.a), e.a.dtype)
        if isinstance(e, K.SubgroupShuffle):
            return self.shuffle(self.expr(e.a), self.expr(e.lane), e.a.dtype, e.xor)
        if isinstance(e, K.Dot4I8):
            return self.dot4_i8(self.expr(e.a), self.expr(e.b), self.expr(e.c))
        if isinstance(e, K.PackBf16x2):
            return self.pack_bf16x2(self.expr(e.a), self.expr(e.b))
        if isinstance(e, K.Fma):
            t = llvm_type(e.dtype)
            return b.call(self.intrinsic(f"llvm.fma.f{e.dtype.bits}", t, [t, t, t]), [self.expr(e.a), self.expr(e.b), self.expr(e.c)])
        raise Refusal(f"kernel {self.k.name}", self.t.key, f"cannot lower expression {type(e).__name__}")


def lower_kernel(k: K.Kernel, tgt: Target) -> L.Module:
    """Verify ``k`` and lower it for ``tgt`` by the target's lowering (``Target.lowering``; a
    Refusal when the target cannot do something)."""
    verify_kernel(k, tgt.max_threads)
    return lowering_class(tgt)(k, tgt).lower()


def lowering_class(tgt: Target) -> type[KernelLowering]:
    """The ``KernelLowering`` subclass ``tgt`` names (``module:Class``), or the host's."""
    if not tgt.lowering:
        if tgt.name != "host":
            raise Refusal("compile", tgt.key, "the target names no lowering (Target.lowering): its backend must bring one")
        return KernelLowering
    try:
        cls = import_ref(tgt.lowering)
    except (ImportError, AttributeError) as e:
        raise Refusal("compile", tgt.key, f"its lowering {tgt.lowering} cannot be loaded ({e}): is its backend installed?") from None
    if not (isinstance(cls, type) and issubclass(cls, KernelLowering)):
        raise Refusal("compile", tgt.key, f"its lowering {tgt.lowering} is not a KernelLowering")
    return cls
