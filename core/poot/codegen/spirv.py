"""Vulkan SPIR-V: lowering differences from the other GPU targets, and the post-pass over the binary.

A kernel becomes a logical-SPIR-V compute shader (Shader capability, GLSL450 memory model) with one
entry point, ``ENTRY``, whose workgroup size is the kernel's. Its interface is descriptor set 0
(``bindings``):

* binding ``i`` is the ``i``-th Buffer parameter (in parameter order): a storage buffer holding a
  runtime array of the buffer's element type, NonWritable when the parameter is read-only; a
  read-only u8 buffer (packed weights) is an array of 32-bit words whose bytes are read by shift and
  mask, so no 8-bit storage feature is needed;
* binding ``len(buffers)``, present only when the kernel has scalar parameters, is a read-only
  storage buffer of 32-bit words, one per ScalarParam in parameter order (``scalar_words``).

Scalars travel in a storage buffer rather than as push constants: it is the mechanism the other
bindings use (one descriptor set, one pipeline layout, nothing else to declare), and wgpu offers push
constants only as a native-only feature, so the same module also runs through wgpu/naga.

llvmlite cannot spell LLVM's ``target("spirv.VulkanBuffer", ...)`` types, so each binding's handle has
an opaque placeholder type that ``SpirvModule`` replaces when the module is printed.

LLVM 22's SPIR-V backend turns only some pointer shapes into logical-SPIR-V access chains, and the
O3 pipeline canonicalises away the ones it needs (facts checked against llvmlite 0.50):

* buffer elements are addressed by ``llvm.spv.resource.getpointer(handle, i)`` alone: the optimiser
  cannot see through it, so there is no pointer arithmetic to legalise;
* a shared array is a ``{ [N x T] }`` global addressed by ``gep {[N x T]}, @g, 0, 0, i``: InstCombine
  rewrites a plain ``[N x T]`` global's ``gep 0, i`` into ``gep T, @g, i`` (the backend asserts on a
  non-zero first index) and splits ``a[i + C]`` into an ``i8`` GEP (the backend aborts on it);
  ``i`` goes through ``llvm.spv.sclamp`` to [0, N), which the optimiser cannot fold either, so a
  constant or range-known index cannot become an ``i8`` GEP. It also keeps shared accesses in bounds;
* bitcasts (float scalars from their words, ``as_f32``/``as_i32``) are ``llvm.spv.bitcast`` calls
  marked readnone: InstCombine folds a plain bitcast of a loaded value into a load of the other type
  through the same pointer, which the backend cannot legalise;
* a barrier is ``fence release; llvm.spv.group.memory.barrier.with.group.sync; fence acquire``:
  the intrinsic is declared ``nosync`` and shared arrays are internal globals that never escape, so
  without fences alias analysis lets GVN forward a shared-memory load across the barrier.

``post_pass`` then fixes the binary (shared/TARGETS.md), spirv-val checking the result: barrier memory
semantics 0x148 (the fences' OpMemoryBarriers, which have no storage-class bits and which Vulkan
rejects, are dropped: the barrier's own semantics cover them); 64-bit GEP indices narrowed to 32 bits,
so the module needs no Int64; the Int8 capability of the binding-name strings removed after
dead-code elimination; 8- and 16-bit arithmetic that LLVM narrowed index math to redone in 32 bits
(``_widen_narrow_ints``), so no kernel needs shaderInt8 or shaderInt16; a Linkage capability (an unresolved call) reported as an error. It also
repairs three defects of LLVM 22's output: block labels that now and then reuse module-level ids,
merge instructions scheduled away from their branch, and OpConstantNull struct indices. Because the
backend carries state from one module to the next within a process, lowering a kernel for this target
retires the compile worker after every SPIR-V module (``compile.compile_kernel``).

``for_wgpu`` makes a module acceptable to naga.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from llvmlite import ir as L

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.dtypes import DType
from ..kernel import ir as K
from ..kernel.verify import uses_subgroups
from .arith import F32, I32, llvm_type
from .arith import mem_type as _mem_type
from .lower import KernelLowering

__all__ = ["SpirvLowerer", "SpirvModule", "ENTRY", "SCALARS", "bindings", "scalar_words", "post_pass", "for_wgpu", "validate", "BARRIER_SEMANTICS"]

ENTRY = "main"
SCALARS = "poot.scalars"  # the name of the scalar-word binding
STORAGE_AS = 11  # SPIR-V StorageBuffer storage class
BARRIER_SEMANTICS = 0x148  # AcquireRelease | UniformMemory | WorkgroupMemory
_VALUE_TYPES = (dt.f32, dt.i32, dt.boolean)  # what a module may compute with
_MEMORY_TYPES = (dt.f32, dt.i32)  # element types of buffers and shared arrays; scalar parameter types
_MANGLE = {dt.f32: "f32", dt.i32: "i32"}
_SPELL = {dt.f32: "float", dt.i32: "i32"}


def _suffix(t: L.Type) -> str:
    return {"float": "f32", "i32": "i32"}[str(t)]


def _rounds_through_half(e: K.Expr) -> bool:
    """``f32(f16(x))``: x rounded to the nearest half."""
    return isinstance(e, K.Cast) and e.dtype == dt.f32 and isinstance(e.a, K.Cast) and e.a.dtype == dt.f16 and e.a.a.dtype in (dt.f32, dt.i32)


def bindings(k: K.Kernel) -> list[tuple[int, str, DType, bool]]:
    """The kernel's descriptor-set-0 bindings: (binding, name, element type, writable). The scalar
    words, when the kernel has scalar parameters, come last under the name ``SCALARS``."""
    out = [(i, p.name, p.dtype, not p.readonly) for i, p in enumerate(k.buffers)]
    if k.scalars:
        out.append((len(out), SCALARS, dt.i32, False))
    return out


def scalar_words(k: K.Kernel, values: dict[str, float | int]) -> np.ndarray:
    """The contents of the scalar binding: one 32-bit word per ScalarParam, in parameter order."""
    words = np.zeros(max(1, len(k.scalars)), np.uint32)
    for j, p in enumerate(k.scalars):
        if p.name not in values:
            raise KeyError(f"kernel {k.name}: scalar parameter '{p.name}' has no value")
        np_type = np.float32 if p.dtype == dt.f32 else np.int32
        words[j : j + 1].view(np_type)[0] = np_type(values[p.name])
    return words


def _buffer_type(t: DType, writable: bool, width: int = 1) -> str:
    elem = _SPELL[t] if width == 1 else f"<{width} x {_SPELL[t]}>"
    return f'target("spirv.VulkanBuffer", [0 x {elem}], 12, {int(writable)})'


def _mangled(t: DType, writable: bool, width: int = 1) -> str:
    return f"tspirv.VulkanBuffer_a0{'' if width == 1 else f'v{width}'}{_MANGLE[t]}_12_{int(writable)}t"


def _vec4_buffers(k: K.Kernel) -> set[str]:
    """Read-only 32-bit buffers that the kernel reads only four elements at a time (VecLoad: the
    index a multiple of four): bound as arrays of 4-vectors, so that each read is one 16-byte load."""
    seen: dict[str, bool] = {}
    for st in _stmts(k.body):
        if isinstance(st, K.VecLoad):
            seen[st.buffer] = seen.get(st.buffer, True) and len(st.names) == 4
        elif getattr(st, "buffer", None) is not None:  # stores and atomics
            seen[st.buffer] = False  # type: ignore[union-attr]
        roots = [getattr(st, f) for f in ("value", "index", "cond", "start", "stop") if getattr(st, f, None) is not None]
        for e in roots + list(getattr(st, "values", ())):
            for x in _exprs(e):
                if isinstance(x, K.Load):
                    seen[x.buffer] = False
    return {p.name for p in k.buffers if p.readonly and p.dtype in _MEMORY_TYPES and seen.get(p.name)}


class SpirvModule(L.Module):
    """An llvmlite module printed with its placeholder names replaced by SPIR-V buffer types and intrinsics."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.replace: dict[str, str] = {}  # printed placeholder -> replacement

    def __str__(self) -> str:
        lines = super().__repr__().splitlines()
        text = "\n".join(ln for ln in lines if not (ln.startswith('%"poot.spv.handle.') and ln.endswith("= type opaque")))
        for old, new in self.replace.items():
            text = text.replace(old, new)
        # bindings of one kind now declare the same intrinsic: keep one declaration of each
        seen: set[str] = set()
        out = []
        for ln in text.splitlines():
            if ln.startswith("declare "):
                if ln in seen:
                    continue
                seen.add(ln)
            out.append(ln)
        return "\n".join(out) + "\n"

    __repr__ = __str__


def _exprs(e: K.Expr):  # type: ignore[no-untyped-def]
    yield e
    for f in ("a", "b", "c", "cond", "index", "lane"):
        sub = getattr(e, f, None)
        if sub is not None and not isinstance(sub, (str, int, float, bool)):
            yield from _exprs(sub)


def _stmts(body):  # type: ignore[no-untyped-def]
    for st in body:
        yield st
        for f in ("then", "orelse", "body"):
            yield from _stmts(getattr(st, f, ()))


class SpirvLowerer(KernelLowering):
    """Kernel IR -> a Vulkan compute shader module (its interface: the module docstring)."""

    copy_same_type = True  # LLVM's SPIR-V backend cannot lower the bitcast of a loaded value
    sincos_reduced = True  # Vulkan's sin/cos keep their precision on [-pi, pi] only
    natural_exp = True

    def __init__(self, k: K.Kernel, tgt) -> None:  # type: ignore[no-untyped-def]
        super().__init__(k, tgt)  # refuses oversized workgroups / shared memory
        if uses_subgroups(k) and tgt.subgroup <= 1:
            raise Refusal(
                f"kernel {k.name}",
                tgt.key,
                "subgroup operations need the device's subgroup width: compile for spirv_target(n) on a Vulkan device whose subgroups run them",
            )
        self.m = SpirvModule(k.name)
        self.m.triple = tgt.triple
        self._getptr: dict[str, L.Function] = {}
        self._check()

    def _refuse(self, reason: str) -> Refusal:
        return Refusal(f"kernel {self.k.name}", self.t.key, reason)

    def _check(self) -> None:
        k = self.k
        self._words = {p.name for p in k.buffers if p.dtype == dt.u8 and p.readonly}
        self._halves = {p.name for p in k.buffers if p.dtype in (dt.bf16, dt.f16) and (p.readonly or p.dtype == dt.f16)}
        self._vec4 = _vec4_buffers(k) - self._words - self._halves
        for p in k.params:
            if p.name in self._words or p.name in self._halves:
                continue  # packed bytes and 16-bit values: bound as 32-bit words, read by shift and mask
            if p.dtype not in _MEMORY_TYPES:
                kind = "buffer" if isinstance(p, K.Buffer) else "scalar parameter"
                raise self._refuse(
                    f"{kind} '{p.name}' is {p.dtype}; the Vulkan target handles f32 and i32 (8-, 16- and 64-bit types need device features it does not request)"
                )
        for sh in k.shared:
            if sh.dtype not in _MEMORY_TYPES:
                raise self._refuse(f"shared array '{sh.name}' is {sh.dtype}; the Vulkan target handles f32 and i32")
        pairs: set[int] = set()  # the f16 casts of values stored two halves a word: lowered with integer operations
        for st in _stmts(k.body):
            buf = getattr(st, "buffer", None)
            if buf in self._halves and not k.param(buf).readonly:  # a writable buffer of halves
                if not (isinstance(st, K.VecStore) and len(st.values) == 2):
                    raise self._refuse(
                        f"'{buf}' holds 16-bit values: write them two at a time (vstore(buf, i, a, b), i even), so that each store is a whole 32-bit word"
                    )
                if not all(isinstance(v, K.Cast) and v.dtype == dt.f16 and v.a.dtype == dt.f32 for v in st.values):
                    raise self._refuse(f"values stored into '{buf}' must be f32 values converted to f16")
                pairs |= {id(v) for v in st.values}
            if isinstance(st, K.AtomicAdd):
                mem = k.param(st.buffer)
                if not isinstance(mem, K.Buffer) or mem.dtype != dt.i32:
                    raise self._refuse(
                        f"atomic add on '{st.buffer}': the Vulkan target lowers i32 atomics on buffers only (f32 atomics need VK_EXT_shader_atomic_float)"
                    )
            roots = [getattr(st, f) for f in ("value", "index", "cond", "start", "stop") if getattr(st, f, None) is not None]
            for e in roots + list(getattr(st, "values", ())):
                bytes_ok = {id(x.a) for x in _exprs(e) if isinstance(x, K.Cast) and x.dtype == dt.i32 and isinstance(x.a, K.Load) and x.a.buffer in self._words}
                halves_ok = {
                    id(x.a) for x in _exprs(e) if isinstance(x, K.Cast) and x.dtype == dt.f32 and isinstance(x.a, K.Load) and x.a.buffer in self._halves
                }
                # f32(f16(x)) rounds through a half: lowered with integer operations, no f16 value
                halves = {id(x.a) for x in _exprs(e) if _rounds_through_half(x)}
                for x in _exprs(e):
                    if id(x) in halves or id(x) in pairs:
                        continue
                    if isinstance(x, K.Load) and x.buffer in self._words:
                        if id(x) not in bytes_ok:
                            raise self._refuse(f"bytes of '{x.buffer}' must be widened to i32 where they are read (i32(buf[i]))")
                        continue
                    if isinstance(x, K.Load) and x.buffer in self._halves:
                        if id(x) not in halves_ok:
                            raise self._refuse(f"16-bit values of '{x.buffer}' must be widened to f32 where they are read (f32(buf[i]))")
                        continue
                    if isinstance(x, K.Cast) and (id(x.a) in bytes_ok or id(x.a) in halves_ok):
                        continue
                    t = getattr(x, "dtype", None)
                    if t is not None and t not in _VALUE_TYPES:
                        raise self._refuse(f"{type(x).__name__} computes in {t}; the Vulkan target handles f32, i32 and bool")
                    if isinstance(x, K.Builtin) and x.kind in ("lane_id", "subgroup_size") and self.t.subgroup <= 1:
                        raise self._refuse(f"builtin {x.kind}(): subgroup operations need spirv_target(n), n the device's subgroup width")

    # -- module and entry point ---------------------------------------------------------------------
    def lower(self) -> L.Module:
        k = self.k
        for sh in k.shared:
            ty = L.LiteralStructType([L.ArrayType(_mem_type(sh.dtype), sh.size)])
            g = L.GlobalVariable(self.m, ty, f"{k.name}.{sh.name}", addrspace=self.t.shared_as)
            g.linkage = "internal"
            g.initializer = L.Constant(ty, L.Undefined)
            g.align = 16
            self.mem[sh.name] = (g, sh.dtype, sh.size)
        self._gpu_function([])
        return self.m

    def _gpu_function(self, params: list[L.Type]) -> None:
        k = self.k
        fn = L.Function(self.m, L.FunctionType(L.VoidType(), []), ENTRY)
        x, y, z = k.workgroup
        set.add(fn.attributes, f'"hlsl.numthreads"="{x},{y},{z}"')  # string attributes go in raw
        set.add(fn.attributes, '"hlsl.shader"="compute"')
        self.b = L.IRBuilder(fn.append_basic_block("entry"))
        for binding, name, t, writable in bindings(k):
            h, getp = self._binding(binding, name, dt.i32 if name in self._words or name in self._halves else t, writable, 4 if name in self._vec4 else 1)
            if name != SCALARS:
                self.mem[name] = (h, dt.i32 if name in self._halves else t, None)
                self._getptr[name] = getp
                continue
            for j, p in enumerate(k.scalars):
                word = self.b.load(self.b.call(getp, [h, L.Constant(I32, j)]), name=p.name)
                self.values[p.name] = self.bitcast(word, F32) if p.dtype == dt.f32 else word
        self.block(k.body)
        self.b.ret_void()

    def _binding(self, binding: int, name: str, t: DType, writable: bool, width: int = 1) -> tuple[L.Value, L.Function]:
        """The binding's resource handle, made in the entry block, and its getpointer function
        (``width`` 4: the buffer is an array of 4-vectors, read 16 bytes a load)."""
        m = self.m
        ph = m.context.get_identified_type(f"poot.spv.handle.{binding}")
        mangled = _mangled(t, writable, width)
        make = L.Function(m, L.FunctionType(ph, [I32, I32, I32, I32, L.PointerType()]), f"poot.spv.bind.{binding}")
        elem = llvm_type(t) if width == 1 else L.VectorType(llvm_type(t), width)
        getp = L.Function(m, L.FunctionType(L.PointerType(elem, STORAGE_AS), [ph, I32]), f"poot.spv.ptr.{binding}")
        m.replace[f'%"poot.spv.handle.{binding}"'] = _buffer_type(t, writable, width)
        m.replace[f'@"poot.spv.bind.{binding}"'] = f"@llvm.spv.resource.handlefrombinding.{mangled}"
        m.replace[f'@"poot.spv.ptr.{binding}"'] = f"@llvm.spv.resource.getpointer.p{STORAGE_AS}.{mangled}"
        label = name.encode() + b"\0"  # one distinct name string per binding
        g = L.GlobalVariable(m, L.ArrayType(L.IntType(8), len(label)), f"poot.spv.name.{binding}")
        g.linkage = "private"
        g.global_constant = True
        g.initializer = L.Constant(L.ArrayType(L.IntType(8), len(label)), bytearray(label))
        args = [L.Constant(I32, v) for v in (0, binding, 1, 0)] + [g.bitcast(L.PointerType())]  # set, binding, range, index, name
        return self.b.call(make, args, name=f"h.{name}"), getp

    # -- subgroups (spirv_target(n)): GroupNonUniform operations at Subgroup scope ----------------------
    def gpu_builtin(self, e: K.Builtin) -> L.Value:
        if e.kind == "lane_id":  # the SubgroupLocalInvocationId input
            return self.b.call(self.intrinsic("llvm.spv.subgroup.local.invocation.id", I32, []), [])
        name = {"thread_id": "llvm.spv.thread.id.in.group.i32", "group_id": "llvm.spv.group.id.i32", "num_groups": "llvm.spv.num.workgroups.i32"}[e.kind]
        return self.b.call(self.intrinsic(name, I32, [I32]), [L.Constant(I32, e.dim)])

    def copysign(self, y: L.Value, x: L.Value) -> L.Value:
        """y with x's sign by integer operations: LLVM 22's SPIR-V backend crashes on what
        InstCombine makes of select(x < 0, -y, y) when x is a product."""
        b = self.b
        sign = b.and_(b.bitcast(x, I32), L.Constant(I32, -0x80000000))
        return b.bitcast(b.or_(b.bitcast(y, I32), sign), F32)

    def subgroup_reduce(self, op: str, v: L.Value, t: DType) -> L.Value:
        """OpGroupNonUniform{F,I}Add / {F,S}Max / {F,S}Min, Reduce: every active lane gets the result."""
        name = {"add": "sum", "max": "max", "min": "min"}[op]
        suffix = "f32" if t.is_float else "i32"
        return self.b.call(self.intrinsic(f"llvm.spv.wave.reduce.{name}.{suffix}", v.type, [v.type]), [v])

    def shuffle(self, v: L.Value, lane: L.Value, t: DType, xor: bool) -> L.Value:
        """OpGroupNonUniformShuffle (the lane index may differ per lane)."""
        if xor:
            lane = self.b.xor(self.builtin(K.Builtin("lane_id")), lane)
        suffix = "f32" if t.is_float else "i32"
        return self.b.call(self.intrinsic(f"llvm.spv.wave.readlane.{suffix}", v.type, [v.type, I32]), [v, lane])

    # -- expressions --------------------------------------------------------------------------------
    def bitcast(self, v: L.Value, to: L.Type) -> L.Value:
        """``llvm.spv.bitcast`` marked readnone at the call: InstCombine folds a plain bitcast of a
        loaded value into a load of the other type, which the backend cannot legalise (it aborts)."""
        fn = self.intrinsic(f"llvm.spv.bitcast.{_suffix(to)}.{_suffix(v.type)}", to, [v.type])
        return self.b.call(fn, [v], attrs=("readnone",))

    def expr(self, e: K.Expr) -> L.Value:
        if _rounds_through_half(e):
            from ..kernel.library.elementwise import round_f16

            inner = e.a.a  # type: ignore[union-attr]
            return self.expr(round_f16(inner if inner.dtype == dt.f32 else K.Cast(inner, dt.f32)))
        if isinstance(e, K.HalfToF32):  # no f16 values here: integer operations
            from ..kernel.translate import expand_half_to_f32

            return self.expr(expand_half_to_f32(e.a))
        if isinstance(e, K.Bitcast):
            return self.bitcast(self.expr(e.a), llvm_type(e.dtype))
        if isinstance(e, K.Cast) and isinstance(e.a, K.Load) and e.a.buffer in self._words:
            # byte i of a word buffer: (word[i >> 2] >> 8 * (i & 3)) & 0xFF (little-endian words)
            b = self.b
            i = self.expr(e.a.index)
            base, _, _ = self.mem[e.a.buffer]
            word = b.load(b.call(self._getptr[e.a.buffer], [base, b.ashr(i, L.Constant(I32, 2))]))
            shift = b.shl(b.and_(i, L.Constant(I32, 3)), L.Constant(I32, 3))
            return b.and_(b.lshr(word, shift), L.Constant(I32, 0xFF))
        if isinstance(e, K.Cast) and isinstance(e.a, K.Load) and e.a.buffer in self._halves:
            # value i of a 16-bit buffer: the half (i & 1) of word i >> 1, widened with integer operations
            i = e.a.index
            word = K.Load(e.a.buffer, K.Bin("shr", i, K.Const(1, dt.i32)), dt.i32)
            bits = K.Bin("and", K.Bin("shr", word, K.Bin("shl", K.Bin("and", i, K.Const(1, dt.i32)), K.Const(4, dt.i32))), K.Const(0xFFFF, dt.i32))
            wide = K.Bitcast(K.Bin("shl", bits, K.Const(16, dt.i32)), dt.f32) if e.a.dtype == dt.bf16 else K.HalfToF32(bits)
            return self.expr(wide)
        return super().expr(e)

    # -- memory and barriers ------------------------------------------------------------------------
    def address(self, name: str, index: K.Expr) -> tuple[L.Value, DType]:
        base, t, size = self.mem[name]
        idx = self.expr(index)
        if size is None:
            return self.b.call(self._getptr[name], [base, idx]), t
        clamp = self.intrinsic("llvm.spv.sclamp.i32", I32, [I32, I32, I32])
        idx = self.b.call(clamp, [idx, L.Constant(I32, 0), L.Constant(I32, size - 1)])
        return self.b.gep(base, [L.Constant(I32, 0), L.Constant(I32, 0), idx], inbounds=True), t

    def stmt(self, st: K.Stmt) -> None:
        if isinstance(st, K.AtomicAdd):  # device scope: Vulkan rejects LLVM's default (system: CrossDevice)
            ptr, _ = self.address(st.buffer, st.index)
            self.b.atomic_rmw("add", ptr, self.expr(st.value), 'syncscope("device") monotonic')
        elif isinstance(st, K.VecLoad) and st.buffer in self._vec4:  # element index / 4 of an array of 4-vectors
            base, t, _ = self.mem[st.buffer]
            b = self.b
            v = b.load(b.call(self._getptr[st.buffer], [base, b.ashr(self.expr(st.index), L.Constant(I32, 2))]))
            for i, name in enumerate(st.names):
                self.stmt(K.Let(name, K.Const(0, t)))  # declares the local (typed), then its value
                ptr_v, _ = self._var_ptr(name)
                b.store(b.extract_element(v, L.Constant(I32, i)), ptr_v)
        elif isinstance(st, K.VecLoad):  # element by element: the backend aborts on a vector load from an array element
            for i, name in enumerate(st.names):
                self.stmt(K.Let(name, K.Load(st.buffer, K.Bin("add", st.index, K.Const(i, dt.i32)), st.dtype)))
        elif isinstance(st, K.VecStore) and st.buffer in self._halves:  # two halves: one 32-bit word at i / 2
            from ..kernel.library.elementwise import f16_bits

            lo, hi = (f16_bits(v.a) for v in st.values)  # type: ignore[attr-defined]
            word = K.Bin("or", K.Bin("and", lo, K.Const(0xFFFF, dt.i32)), K.Bin("shl", hi, K.Const(16, dt.i32)))
            super().stmt(K.Store(st.buffer, K.Bin("shr", st.index, K.Const(1, dt.i32)), word))
        elif isinstance(st, K.VecStore):
            for i, value in enumerate(st.values):
                self.stmt(K.Store(st.buffer, K.Bin("add", st.index, K.Const(i, dt.i32)), value))
        else:
            super().stmt(st)

    def barrier(self) -> None:
        self.b.fence("release", "workgroup")
        self.b.call(self.intrinsic("llvm.spv.group.memory.barrier.with.group.sync", L.VoidType(), []), [])
        self.b.fence("acquire", "workgroup")


# -- the binary post-pass ---------------------------------------------------------------------------

_MAGIC = 0x07230203
_OP_TYPE_INT, _OP_CONSTANT, _OP_FUNCTION, _OP_CAPABILITY, _OP_DECORATE = 21, 43, 54, 17, 71
_OP_LOAD, _OP_STORE, _OP_UCONVERT, _OP_SCONVERT = 61, 62, 113, 114
_OP_CONTROL_BARRIER, _OP_MEMORY_BARRIER = 224, 225
_OP_LOOP_MERGE, _OP_SELECTION_MERGE = 246, 247
_TERMINATORS = (249, 250, 251, 252, 253, 254, 255, 4416)  # OpBranch ... OpUnreachable, OpTerminateInvocation
_ACCESS_CHAINS = (65, 66, 67, 70)  # OpAccessChain, OpInBoundsAccessChain, OpPtrAccessChain, OpInBoundsPtrAccessChain
_CAP_LINKAGE, _CAP_INT64, _CAP_INT16, _CAP_INT8 = 5, 11, 22, 39
_DEC_LINKAGE_ATTRIBUTES = 41
_STORAGE_CLASS_SEMANTICS = 0x1FC0  # Uniform|Subgroup|Workgroup|CrossWorkgroup|AtomicCounter|Image|Output memory


def _error(msg: str) -> Exception:
    from .compile import CompileError  # compile imports this module's users: import late

    return CompileError(msg)


class _Spv:
    """A SPIR-V binary as its header and a list of [opcode, operand words]: enough for the rewrites here."""

    def __init__(self, data: bytes, name: str) -> None:
        if len(data) % 4 or len(data) < 20:
            raise _error(f"kernel {name}: {len(data)} bytes are not a SPIR-V module")
        words = list(struct.unpack(f"<{len(data) // 4}I", data))
        if words[0] != _MAGIC:
            raise _error(f"kernel {name}: no SPIR-V magic number")
        self.header, self.insts = words[:5], []
        i = 5
        while i < len(words):
            n = words[i] >> 16
            if n == 0 or i + n > len(words):
                raise _error(f"kernel {name}: malformed SPIR-V instruction at word {i}")
            self.insts.append([words[i] & 0xFFFF, words[i + 1 : i + n]])
            i += n

    def to_bytes(self) -> bytes:
        words = list(self.header)
        for op, ops in self.insts:
            words += [(len(ops) + 1) << 16 | op, *ops]
        return struct.pack(f"<{len(words)}I", *words)

    def of(self, *ops: int) -> list[list[int]]:
        """The operands of every instruction with one of these opcodes (live lists: editable)."""
        return [i[1] for i in self.insts if i[0] in ops]

    def capabilities(self) -> set[int]:
        return {ops[0] for ops in self.of(_OP_CAPABILITY)}

    def int_types(self) -> dict[int, int]:
        """id -> width of every OpTypeInt."""
        return {ops[0]: ops[1] for ops in self.of(_OP_TYPE_INT)}

    def constant(self, ty: int, value: int) -> int:
        """The id of an OpConstant of 32-bit type ``ty`` and ``value``; declared if there is none."""
        for ops in self.of(_OP_CONSTANT):
            if ops[0] == ty and ops[2:] == [value]:
                return ops[1]
        new = self.header[3]
        self.header[3] += 1  # the id bound
        at = next(n for n, (op, _) in enumerate(self.insts) if op == _OP_FUNCTION)  # after every type
        self.insts.insert(at, [_OP_CONSTANT, [ty, new, value]])
        return new

    def drop(self, pred) -> None:  # type: ignore[no-untyped-def]
        self.insts = [i for i in self.insts if not pred(i[0], i[1])]


def _string(operands: list[int]) -> str:
    return struct.pack(f"<{len(operands)}I", *operands).split(b"\0", 1)[0].decode(errors="replace")


def _check_linkage(m: _Spv, name: str) -> None:
    if _CAP_LINKAGE not in m.capabilities():
        return
    linked = [_string(ops[2:-1]) for ops in m.of(_OP_DECORATE) if ops[1] == _DEC_LINKAGE_ATTRIBUTES]
    raise _error(
        f"kernel {name}: the SPIR-V module needs linking (OpCapability Linkage): it imports or exports "
        f"{', '.join(linked) or 'an unresolved symbol'}; a Vulkan shader must be self-contained"
    )


_MODULE_TYPES = set(range(19, 39))  # OpTypeVoid ... OpTypePipe: the result id is the first operand
_MODULE_VALUES = {1, 41, 42, 43, 44, 45, 46, 48, 49, 50, 51, 52, 59}  # OpUndef, constants, OpVariable: [type, id, ...]
_OP_NAME, _OP_LABEL, _OP_PHI = 5, 248, 245
_OP_BRANCH, _OP_BRANCH_CONDITIONAL, _OP_SWITCH = 249, 250, 251


def _module_ids(m: _Spv) -> set[int]:
    """The ids defined before the first function (types, constants, global variables, imports)."""
    out: set[int] = set()
    for op, ops in m.insts:
        if op == _OP_FUNCTION:
            break
        if op in _MODULE_TYPES or op in (7, 11, 73):  # types, OpString, OpExtInstImport, OpDecorationGroup
            out.add(ops[0])
        elif op in _MODULE_VALUES:
            out.add(ops[1])
    return out


def fix_label_ids(m: _Spv) -> int:
    """Renumber the block labels that reuse a module-level id (see ``compile.compile_kernel`` for when
    LLVM 22 emits them); a label is only used as a branch target, a merge block or a phi's parent, so
    the references are unambiguous. Labels that reuse each other's ids cannot be told apart: a
    ValueError. Returns the number renumbered."""
    taken = _module_ids(m)
    labels = [ops[0] for op, ops in m.insts if op == _OP_LABEL]
    if len(set(labels)) < len(labels):
        raise ValueError(
            "two blocks have the same label id, so branches are ambiguous (LLVM's SPIR-V backend "
            "reused state from an earlier module in this process: compile in a fresh process)"
        )
    fresh: dict[int, int] = {}
    for op, ops in m.insts:
        if op == _OP_LABEL and ops[0] in taken and ops[0] not in fresh:
            fresh[ops[0]] = m.header[3]
            m.header[3] += 1
    if not fresh:
        return 0
    label_operands = {_OP_LABEL: (0,), _OP_BRANCH: (0,), _OP_BRANCH_CONDITIONAL: (1, 2), _OP_SELECTION_MERGE: (0,), _OP_LOOP_MERGE: (0, 1)}
    in_function = False
    for op, ops in m.insts:
        in_function = in_function or op == _OP_FUNCTION
        if not in_function:
            continue
        if op == _OP_PHI:  # result type, result, (value, parent)...
            positions: tuple[int, ...] = tuple(range(3, len(ops), 2))
        elif op == _OP_SWITCH:  # selector, default, (32-bit literal, label)...
            positions = (1, *range(3, len(ops), 2))
        else:
            positions = label_operands.get(op, ())
        for n in positions:
            ops[n] = fresh.get(ops[n], ops[n])
    m.drop(lambda op, ops: op == _OP_NAME and ops[0] in fresh)  # which of the two it named is unknown
    return len(fresh)


def fix_barriers(m: _Spv) -> int:
    """Give every OpControlBarrier the memory semantics BARRIER_SEMANTICS and drop the OpMemoryBarriers
    without storage-class bits (the fences around barriers); returns the number of control barriers."""
    consts = {ops[1]: ops for ops in m.of(_OP_CONSTANT) if len(ops) == 3}
    barriers = m.of(_OP_CONTROL_BARRIER)
    for ops in barriers:  # exec scope, memory scope, semantics: ids of constants
        sem = consts.get(ops[2])
        if sem is None:
            raise ValueError(f"barrier memory semantics %{ops[2]} is not a 32-bit OpConstant")
        ops[2] = m.constant(sem[0], BARRIER_SEMANTICS)
    fences = {id(ops) for ops in m.of(_OP_MEMORY_BARRIER) if ops[1] in consts and not consts[ops[1]][2] & _STORAGE_CLASS_SEMANTICS}
    m.drop(lambda op, ops: id(ops) in fences)
    return len(barriers)


def fix_merges(m: _Spv) -> int:
    """Move each OpSelectionMerge / OpLoopMerge to just before its block's terminator, where SPIR-V
    requires it: LLVM 22's backend sometimes schedules an instruction in between. Returns the number moved."""
    moved = 0
    n = 0
    while n < len(m.insts):
        op = m.insts[n][0]
        if op in (_OP_SELECTION_MERGE, _OP_LOOP_MERGE) and m.insts[n + 1][0] not in _TERMINATORS:
            end = next(j for j in range(n + 1, len(m.insts)) if m.insts[j][0] in _TERMINATORS)
            m.insts.insert(end - 1, m.insts.pop(n))  # the block's other instructions do not branch
            moved += 1
            continue  # the instruction now at n has not been looked at
        n += 1
    return moved


def fix_null_indices(m: _Spv) -> int:
    """Replace OpConstantNull integer access-chain indices (LLVM 22 emits one for a constant index 0,
    which is invalid where the index selects a struct member) by an OpConstant 0. Returns the count."""
    ints = m.int_types()
    nulls = {ops[1] for ops in m.of(46) if ops[0] in ints}  # OpConstantNull
    u32 = _u32(m)
    count = 0
    for ops in m.of(*_ACCESS_CHAINS) if nulls and u32 is not None else ():
        for n in range(3, len(ops)):
            if ops[n] in nulls:
                ops[n] = m.constant(u32, 0)
                count += 1
    return count


def _u32(m: _Spv) -> int | None:
    return next((ops[0] for ops in m.of(_OP_TYPE_INT) if ops[1:] == [32, 0]), None)


def narrow_indices(m: _Spv) -> bool:
    """Replace 64-bit access-chain indices (LLVM's sign-extended GEP indices and i64 constants) by their
    32-bit values, so that the module needs no Int64; returns whether anything changed. Only
    conversions from 32-bit values are undone (an index widened from 8 or 16 bits stays)."""
    widths = m.int_types()
    wide = {t for t, w in widths.items() if w == 64}
    u32 = _u32(m)
    if not wide or u32 is None:
        return False
    of32 = {ops[1] for op, ops in m.insts if op not in _NO_RESULT_TYPE and len(ops) >= 2 and widths.get(ops[0]) == 32}
    converted = {ops[1]: ops[2] for ops in m.of(_OP_SCONVERT, _OP_UCONVERT) if ops[0] in wide and ops[2] in of32}
    constants = {ops[1]: ops[2] for ops in m.of(_OP_CONSTANT) if ops[0] in wide and len(ops) == 4 and ops[3] == 0 and ops[2] < 2**31}
    changed = False
    for ops in m.of(*_ACCESS_CHAINS):  # result type, result, base, indices...
        for n in range(3, len(ops)):
            if ops[n] in converted:
                ops[n] = converted[ops[n]]
            elif ops[n] in constants:
                ops[n] = m.constant(u32, constants[ops[n]])
            else:
                continue
            changed = True
    return changed


def _drop_unused_int_capabilities(m: _Spv) -> None:
    widths = set(m.int_types().values())
    unused = {cap for cap, w in ((_CAP_INT8, 8), (_CAP_INT16, 16), (_CAP_INT64, 64)) if w not in widths}
    m.drop(lambda op, ops: op == _OP_CAPABILITY and ops[0] in unused)


def _tool(exe: str) -> str:
    path = shutil.which(exe)
    if path is None:
        raise _error(f"{exe} is not installed: compiling for Vulkan needs SPIRV-Tools (apt install spirv-tools)")
    return path


def _run_tool(args: list[str], spv: bytes, name: str, output: bool) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.spv", Path(d) / "out.spv"
        src.write_bytes(spv)
        r = subprocess.run(args + [str(src)] + (["-o", str(dst)] if output else []), capture_output=True, text=True, timeout=120)
        if r.returncode:
            said = (r.stderr + r.stdout).strip()[-2000:]
            raise _error(f"kernel {name}: {Path(args[0]).name} rejected the SPIR-V module: {said}")
        return dst.read_bytes() if output else spv


def _dce(spv: bytes, name: str) -> bytes:
    return _run_tool([_tool("spirv-opt"), "--target-env=vulkan1.3", "--eliminate-dead-code-aggressive"], spv, name, output=True)


def validate(spv: bytes, name: str) -> None:
    """spirv-val for the Vulkan 1.3 environment; a CompileError quoting it when the module is invalid."""
    _run_tool([_tool("spirv-val"), "--target-env", "vulkan1.3"], spv, name, output=False)


def post_pass(obj: bytes, name: str) -> bytes:
    """LLVM's SPIR-V -> a module Vulkan drivers run correctly (see the module docstring), validated by
    spirv-val for Vulkan 1.3."""
    _tool("spirv-opt"), _tool("spirv-val")
    m = _Spv(obj, name)
    _check_linkage(m, name)
    try:
        fix_label_ids(m)
        fix_barriers(m)
    except ValueError as e:
        raise _error(f"kernel {name}: cannot repair the SPIR-V module: {e}") from None
    fix_merges(m)
    fix_null_indices(m)
    m = _Spv(_dce(m.to_bytes(), name), name)  # drops the binding-name strings (8-bit integers)
    if narrow_indices(m):
        m = _Spv(_dce(m.to_bytes(), name), name)  # drops the 64-bit conversions and constants
    if any(w in (8, 16) for w in m.int_types().values()) and _widen_narrow_ints(m):
        m = _Spv(_dce(m.to_bytes(), name), name)  # 8/16-bit arithmetic in 32 bits: no shaderInt8/16 needed
    _drop_unused_int_capabilities(m)
    spv = m.to_bytes()
    validate(spv, name)
    return spv


_OP_BITCAST, _OP_EXT_INST, _OP_EXT_INST_IMPORT = 124, 12, 11
# opcodes whose integer operands are signed whatever their type: (operand positions, result is an integer)
_SIGNED_OPS = {
    110: ((), True),
    111: ((2,), False),
    126: ((2,), True),
    135: ((2, 3), True),
    138: ((2, 3), True),
    139: ((2, 3), True),
    173: ((2, 3), False),
    175: ((2, 3), False),
    177: ((2, 3), False),
    179: ((2, 3), False),
    195: ((2,), True),
}
_GLSL_SIGNED = {5, 7, 39, 42, 45}  # GLSL.std.450 SAbs, SSign, SMin, SMax, SClamp
_NO_RESULT_TYPE = {5, 6, 15, 16, 71, 72} | set(range(19, 40))  # names, entry points, decorations, type declarations


# opcodes on narrow (8/16-bit) integers and how to widen them: 'wrap' (compute in 32 bits, keep the
# low bits), 'keep' (zero-extended operands give the same result), 'signed' (operands sign-extended
# first, integer results wrapped), 'cmp-signed' (sign-extended operands, a bool result)
_NARROW_OPS = {
    128: "wrap",
    130: "wrap",
    132: "wrap",
    196: "wrap",
    126: "signed",
    200: "wrap",  # IAdd, ISub, IMul, ShiftLeftLogical, SNegate, Not
    197: "keep",
    198: "keep",
    199: "keep",
    194: "keep",
    134: "keep",
    137: "keep",  # BitwiseOr/Xor/And, ShiftRightLogical, UDiv, UMod
    135: "signed",
    138: "signed",
    139: "signed",
    195: "signed",  # SDiv, SRem, SMod, ShiftRightArithmetic
    170: "keep",
    171: "keep",
    172: "keep",
    174: "keep",
    176: "keep",
    178: "keep",  # IEqual, INotEqual, UGreaterThan(Equal), ULessThan(Equal)
    173: "cmp-signed",
    175: "cmp-signed",
    177: "cmp-signed",
    179: "cmp-signed",  # SGreaterThan(Equal), SLessThan(Equal)
    245: "keep",
    169: "keep",
    83: "keep",  # Phi, Select, CopyObject
}
# GLSL.std.450 integer instructions on narrow integers, by the same kinds: SAbs, SMin, SMax, SClamp;
# UMin, UMax, UClamp
_NARROW_GLSL = {5: "signed", 39: "signed", 42: "signed", 45: "signed", 38: "keep", 41: "keep", 44: "keep"}
_OP_CONVERT_S_TO_F = 111
_OP_SHL, _OP_SHR_ARITH, _OP_AND, _OP_COPY = 196, 195, 199, 83


def _id_operands(op: int, ops: list[int]) -> list[int]:
    """The ids among an instruction's operands after its result type and result id, leaving out the
    literals of those that have them: an extended instruction's number and a group operation (one
    literal, ids after it), memory operands, component indices."""
    if op == _OP_EXT_INST or 349 <= op <= 358:  # GroupNonUniform IAdd .. FMax
        return [ops[2], *ops[4:]]
    end = {_OP_LOAD: 3, _OP_STORE: 2, 79: 4, 81: 3, 82: 4}.get(op, len(ops))  # VectorShuffle, CompositeExtract, CompositeInsert
    return ops[2:end]


def _widen_narrow_ints(m: _Spv) -> bool:
    """8- and 16-bit integer arithmetic (LLVM narrows index math whose range it knows) rewritten in
    32 bits, each narrow value held zero-extended: Vulkan would need shaderInt8/16, naga takes none.
    Returns False (module unchanged) where an instruction it does not know uses them."""
    ints = {ops[0]: (ops[1], ops[2]) for ops in m.of(_OP_TYPE_INT)}
    narrow = {t: w for t, (w, _) in ints.items() if w in (8, 16)}
    if not narrow:
        return True
    u32 = next((t for t, (w, sg) in ints.items() if w == 32 and sg == 0), None)
    if u32 is None:
        return False
    consts: dict[int, int] = {}  # narrow constant id -> its zero-extended value
    width: dict[int, int] = {}  # narrow-typed result id -> its width
    for op, ops in m.insts:
        if op == _OP_CONSTANT and ops[0] in narrow:
            consts[ops[1]] = ops[2] & ((1 << narrow[ops[0]]) - 1)
            width[ops[1]] = narrow[ops[0]]
        elif op not in _NO_RESULT_TYPE and len(ops) >= 2 and ops[0] in narrow:
            width[ops[1]] = narrow[ops[0]]
    glsl = {ops[0] for ops in m.of(_OP_EXT_INST_IMPORT) if _string(ops[1:]) == "GLSL.std.450"}

    def glsl_kind(op: int, ops: list[int]) -> str | None:  # a GLSL integer instruction this pass widens
        return _NARROW_GLSL.get(ops[3]) if op == _OP_EXT_INST and ops[2] in glsl else None

    known = set(_NARROW_OPS) | {_OP_UCONVERT, _OP_SCONVERT, _OP_CONVERT_S_TO_F, _OP_CONSTANT}
    for op, ops in m.insts:
        if op in _NO_RESULT_TYPE or len(ops) < 2:
            continue
        if (ops[0] in narrow or any(o in width for o in _id_operands(op, ops))) and op not in known and glsl_kind(op, ops) is None:
            return False
    needed = set(consts.values()) | {(1 << w) - 1 for w in narrow.values()} | {32 - w for w in narrow.values()}
    c32 = {v: m.constant(u32, v) for v in sorted(needed)}  # declared first: declaring edits m.insts

    def fresh() -> int:
        m.header[3] += 1
        return m.header[3] - 1

    out: list[list] = []

    def sext(x: int, w: int) -> int:
        a, b = fresh(), fresh()
        out.append([_OP_SHL, [u32, a, x, c32[32 - w]]])
        out.append([_OP_SHR_ARITH, [u32, b, a, c32[32 - w]]])
        return b

    for op, ops in list(m.insts):
        if op in (_OP_TYPE_INT, _OP_CONSTANT) and ops[0] in narrow:
            continue
        ops = list(ops)
        ext = None if op in _NO_RESULT_TYPE or len(ops) < 4 else glsl_kind(op, ops)
        if op in _NO_RESULT_TYPE or len(ops) < 2 or (op not in known and ext is None) or op == _OP_CONSTANT:  # (literals are not ids)
            out.append([op, ops])
            continue
        first = 4 if ext else 2  # an extended instruction's set and number are not operands
        src_w = {i: width[ops[i]] for i in range(first, len(ops)) if ops[i] in width}  # operand position -> its narrow width
        for i in range(first, len(ops)):
            if ops[i] in consts:
                ops[i] = c32[consts[ops[i]]]
        out_w = narrow.get(ops[0])
        if op in (_OP_UCONVERT, _OP_SCONVERT):
            if out_w:  # to a narrow type: keep the low bits
                out.append([_OP_AND, [u32, ops[1], ops[2], c32[(1 << out_w) - 1]]])
            elif 2 in src_w:  # from narrow to 32 bits: zero-extended already, or sign-extended
                out.append([_OP_COPY, [ops[0], ops[1], sext(ops[2], src_w[2]) if op == _OP_SCONVERT else ops[2]]])
            else:
                out.append([op, ops])
            continue
        if op == _OP_CONVERT_S_TO_F:
            if 2 in src_w:
                ops[2] = sext(ops[2], src_w[2])
            out.append([op, ops])
            continue
        kind = ext or _NARROW_OPS.get(op)
        if kind is None or (out_w is None and not src_w):
            out.append([op, ops])
            continue
        if kind in ("signed", "cmp-signed"):
            for i, w in src_w.items():
                if not (op == _OP_SHR_ARITH and i == 3):  # a shift amount is unsigned
                    ops[i] = sext(ops[i], w)
        if out_w:
            ops[0] = u32
            if kind in ("wrap", "signed"):
                result, ops[1] = ops[1], fresh()
                out.append([op, ops])
                out.append([_OP_AND, [u32, result, ops[1], c32[(1 << out_w) - 1]]])
                continue
        out.append([op, ops])
    m.insts = out
    return True


def _signed_operands(m: _Spv) -> None:
    """Signed integer instructions on operands of signedless (unsigned-declared) integer types, as
    LLVM emits them, given operands bitcast to a signed type (and results bitcast back): naga takes an
    instruction's signedness from its operands' types, so ``OpConvertSToF`` of an unsigned-typed -1
    would give 4294967295 and ``OpShiftRightArithmetic`` would shift in zeros; and from its result
    type, so ``OpConvertFToS`` to an unsigned type clamped -3.0 to 0."""
    unsigned = {ops[0]: ops[1] for ops in m.of(_OP_TYPE_INT) if ops[2] == 0}
    glsl = {ops[0] for ops in m.of(_OP_EXT_INST_IMPORT) if _string(ops[1:]) == "GLSL.std.450"}
    type_of: dict[int, int] = {}
    for op, ops in m.insts:
        if op not in _NO_RESULT_TYPE and len(ops) >= 2 and ops[0] in unsigned:
            type_of[ops[1]] = ops[0]

    def positions(op: int, ops: list[int]) -> tuple[tuple[int, ...], bool] | None:
        if op in _SIGNED_OPS:
            return _SIGNED_OPS[op]
        if op == _OP_EXT_INST and ops[2] in glsl and ops[3] in _GLSL_SIGNED:
            return tuple(range(4, len(ops))), True
        return None

    unsigned = {t: w for t, w in unsigned.items() if w == 32}  # the only integer width naga takes here

    def unsigned_use(ops: list[int], p: tuple[tuple[int, ...], bool]) -> bool:
        return any(type_of.get(ops[i]) in unsigned for i in p[0]) or (p[1] and ops[0] in unsigned)

    todo = [(op, ops) for op, ops in m.insts if (p := positions(op, ops)) and unsigned_use(ops, p)]
    if not todo:
        return
    signed: dict[int, int] = {ops[1]: ops[0] for ops in m.of(_OP_TYPE_INT) if ops[2] == 1}  # width -> id
    for width in sorted(set(unsigned.values())):
        if width not in signed:
            signed[width] = m.header[3]
            m.header[3] += 1
            at = max(n for n, (op, _) in enumerate(m.insts) if op == _OP_TYPE_INT) + 1
            m.insts.insert(at, [_OP_TYPE_INT, [signed[width], width, 1]])

    def fresh() -> int:
        m.header[3] += 1
        return m.header[3] - 1

    out: list[list] = []
    for op, ops in m.insts:
        p = positions(op, ops)
        if p is None or not unsigned_use(ops, p):
            out.append([op, ops])
            continue
        idx, int_result = p
        ops = list(ops)
        for i in idx:
            t = type_of.get(ops[i])
            if t in unsigned:
                cast = fresh()
                out.append([_OP_BITCAST, [signed[unsigned[t]], cast, ops[i]]])
                ops[i] = cast
        if int_result and ops[0] in unsigned:
            rtype, result = ops[0], ops[1]
            ops[0], ops[1] = signed[unsigned[rtype]], fresh()
            out += [[op, ops], [_OP_BITCAST, [rtype, result, ops[1]]]]
        else:
            out.append([op, ops])
    m.insts = out


_GROUP_VALUE = {345: 3, 346: 3, **{op: 4 for op in range(349, 359)}}  # OpGroupNonUniform Shuffle(Xor), arithmetic: value operand


def _group_ops_not_first(m: _Spv) -> None:
    """naga 29 panics (aborting the process) on a subgroup operation that is the first instruction
    of a block, or that follows another: its expression emitter has not been (re)started. Such an
    operation gets a copy of its value (OpCopyObject) before it, which starts the emitter."""
    out: list[list] = []
    for i, (op, ops) in enumerate(m.insts):
        at = _GROUP_VALUE.get(op)
        if at is not None and i and (m.insts[i - 1][0] == _OP_LABEL or m.insts[i - 1][0] in _GROUP_VALUE) and len(ops) > at:
            new = m.header[3]
            m.header[3] += 1
            out.append([_OP_COPY, [ops[0], new, ops[at]]])
            ops[at] = new
        out.append([op, ops])
    m.insts = out


_OP_TYPE_FLOAT = 22
_F32_INF, _F32_MAX = 0x7F800000, 0x7F7FFFFF


def _finite_float_constants(m: _Spv) -> None:
    """Infinite f32 constants become the largest finite f32 of their sign: naga refuses an infinite
    literal ("Float literal is infinite"). Where a kernel uses one (a mask of -inf before a softmax
    or a top-k) the largest finite value masks alike: exp(-max - x) is 0, and no score is below it."""
    floats = {ops[0] for ops in m.of(_OP_TYPE_FLOAT) if ops[1] == 32}
    for ops in m.of(_OP_CONSTANT):
        if ops[0] in floats and len(ops) == 3 and ops[2] & 0x7FFFFFFF == _F32_INF:
            ops[2] = (ops[2] & 0x80000000) | _F32_MAX


def for_wgpu(spv: bytes) -> bytes:
    """The module as naga takes it: without the ``Aligned`` memory operands of OpLoad/OpStore (naga
    rejects them), signed instructions given signed operands (see ``_signed_operands``), no
    subgroup operation first in its block (``_group_ops_not_first``) and no infinite constant
    (``_finite_float_constants``)."""
    m = _Spv(spv, "(for wgpu)")  # (its 8/16-bit arithmetic is widened already, by post_pass)
    _signed_operands(m)
    _group_ops_not_first(m)
    _finite_float_constants(m)
    for op, ops in m.insts:
        at = {_OP_LOAD: 3, _OP_STORE: 2}.get(op)
        if at is None or len(ops) <= at:
            continue
        mask = ops[at]
        rest = ops[at + 1 :]
        if not mask & 0x2:
            continue
        rest = rest[1:]  # Aligned's literal comes first (Volatile, bit 0x1, has none)
        mask &= ~0x2
        ops[at:] = [mask, *rest] if mask else []
    return m.to_bytes()
