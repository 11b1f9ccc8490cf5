"""Vulkan SPIR-V: lowering differences from the other GPU targets, and the post-pass over the binary.

A kernel becomes a logical-SPIR-V compute shader (Shader capability) with one entry point,
``ENTRY``, whose workgroup size is the kernel's. Its interface is descriptor set 0:

* binding ``i`` is the ``i``-th Buffer parameter (in parameter order), a storage buffer holding a
  runtime array of the buffer's element type (NonWritable when the parameter is read-only);
* binding ``len(buffers)`` (present only when the kernel has scalar parameters) is a read-only
  storage buffer of 32-bit words, one per ScalarParam in parameter order (``scalar_words``).

Scalars travel in a storage buffer rather than as push constants: it is the same mechanism as the
other bindings (one descriptor set, nothing else to declare), and wgpu only offers push constants as
a native-only feature, so the same module also runs through wgpu/naga.

llvmlite cannot spell LLVM's ``target("spirv.VulkanBuffer", ...)`` types, so each binding's handle
gets an opaque placeholder struct type that ``SpirvModule.__str__`` replaces in the printed IR.

``post_pass`` fixes up what LLVM 22 emits (facts: shared/TARGETS.md): the barrier's memory semantics,
the Int8 capability the binding-name strings pull in, and a Linkage capability, which means an
unresolved call. ``for_wgpu`` makes a module acceptable to naga.
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
from .lower import F32, I32, _Lowerer, llvm_type

__all__ = ["SpirvLowerer", "SpirvModule", "ENTRY", "post_pass", "for_wgpu", "validate", "scalar_words", "bindings", "BARRIER_SEMANTICS"]

ENTRY = "main"
STORAGE_AS = 11  # SPIR-V StorageBuffer storage class
#: AcquireRelease | UniformMemory | WorkgroupMemory
BARRIER_SEMANTICS = 0x148
_TYPES = (dt.f32, dt.i32, dt.boolean)  # value types the module may compute with
_MEMORY = (dt.f32, dt.i32)  # element types of buffers and shared arrays, and scalar parameter types

_OPTYPE = {dt.f32: "f32", dt.i32: "i32"}
_TEXT = {dt.f32: "float", dt.i32: "i32"}


def bindings(k: K.Kernel) -> list[tuple[int, str, DType, bool]]:
    """The kernel's descriptor-set-0 bindings: (binding, name, element type, writable). The scalar
    word buffer, when present, comes last under the name ``SCALARS``."""
    out = [(i, p.name, p.dtype, not p.readonly) for i, p in enumerate(k.buffers)]
    if k.scalars:
        out.append((len(out), SCALARS, dt.i32, False))
    return out


SCALARS = "poot.scalars"


def scalar_words(k: K.Kernel, values: dict[str, float | int]) -> np.ndarray:
    """The scalar buffer's contents: one 32-bit word per ScalarParam, in parameter order."""
    words = np.zeros(max(1, len(k.scalars)), np.uint32)
    for j, p in enumerate(k.scalars):
        if p.name not in values:
            raise KeyError(f"kernel {k.name}: scalar parameter '{p.name}' has no value")
        np_t = np.float32 if p.dtype == dt.f32 else np.int32
        words[j : j + 1].view(np_t)[0] = np_t(values[p.name])
    return words


def _buffer_type(t: DType, writable: bool) -> str:
    return f'target("spirv.VulkanBuffer", [0 x {_TEXT[t]}], 12, {int(writable)})'


def _mangled(t: DType, writable: bool) -> str:
    return f"tspirv.VulkanBuffer_a0{_OPTYPE[t]}_12_{int(writable)}t"


class SpirvModule(L.Module):
    """An llvmlite module whose text has the placeholder handle types replaced by SPIR-V buffer types."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.placeholders: dict[str, str] = {}  # printed placeholder type -> target("spirv.VulkanBuffer", ...)

    def __str__(self) -> str:
        text = super().__repr__()
        lines = [ln for ln in text.splitlines() if not any(ln.startswith(f"{ph} = type opaque") for ph in self.placeholders)]
        text = "\n".join(lines) + "\n"
        for ph, real in self.placeholders.items():
            text = text.replace(ph, real)
        # bindings of the same kind now declare the same intrinsic: keep one declaration
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


def _walk_exprs(e: K.Expr):  # type: ignore[no-untyped-def]
    yield e
    for f in ("a", "b", "cond", "index", "lane"):
        sub = getattr(e, f, None)
        if sub is not None and not isinstance(sub, (str, int, float, bool)):
            yield from _walk_exprs(sub)


def _walk_stmts(body):  # type: ignore[no-untyped-def]
    for st in body:
        yield st
        for f in ("then", "orelse", "body"):
            yield from _walk_stmts(getattr(st, f, ()))


class SpirvLowerer(_Lowerer):
    """Kernel IR -> a Vulkan compute shader module (see the module docstring for its interface)."""

    def __init__(self, k: K.Kernel, tgt) -> None:  # type: ignore[no-untyped-def]
        super().__init__(k, tgt)  # refuses subgroup operations, oversized workgroups and shared memory
        self.m = SpirvModule(k.name)
        self.m.triple = tgt.triple
        self._check(k)
        self._getptr: dict[str, L.Function] = {}

    def refuse(self, reason: str) -> Refusal:
        return Refusal(f"kernel {self.k.name}", self.t.key, reason)

    def _check(self, k: K.Kernel) -> None:
        for p in k.params:
            if p.dtype not in _MEMORY:
                kind = "buffer" if isinstance(p, K.Buffer) else "scalar parameter"
                raise self.refuse(f"{kind} '{p.name}' is {p.dtype}; the Vulkan target handles f32 and i32 only "
                                  "(8/16/64-bit types need device features it does not request)")
        for sh in k.shared:
            if sh.dtype not in _MEMORY:
                raise self.refuse(f"shared array '{sh.name}' is {sh.dtype}; the Vulkan target handles f32 and i32 only")
        for st in _walk_stmts(k.body):
            if isinstance(st, K.AtomicAdd):
                mem = k.param(st.buffer)
                if mem is None or mem.dtype != dt.i32:
                    raise self.refuse(f"atomic add on '{st.buffer}': only i32 atomics on buffers are lowered for Vulkan "
                                      "(f32 atomics need VK_EXT_shader_atomic_float)")
            for f in ("value", "index", "cond", "start", "stop"):
                e = getattr(st, f, None)
                if e is None:
                    continue
                for x in _walk_exprs(e):
                    t = getattr(x, "dtype", None)
                    if t is not None and t not in _TYPES:
                        raise self.refuse(f"{type(x).__name__} computes in {t}; the Vulkan target handles f32, i32 and bool only")
                    if isinstance(x, K.Builtin) and x.kind in ("lane_id", "subgroup_size"):
                        raise self.refuse(f"builtin {x.kind} (subgroups) is not lowered for SPIR-V")

    # -- resources ----------------------------------------------------------------------------------
    def _handle(self, binding: int, name: str, t: DType, writable: bool) -> tuple[L.Value, L.Function]:
        """The binding's resource handle (created in the entry block) and its getpointer function."""
        ph = self.m.context.get_identified_type(f"poot.spv.handle.{binding}")
        self.m.placeholders[f'%"poot.spv.handle.{binding}"'] = _buffer_type(t, writable)
        # one intrinsic declaration per binding: the placeholder types differ until they are patched,
        # and the handle types of bindings of the same kind print identically afterwards
        mangled = _mangled(t, writable)
        make = L.Function(self.m, L.FunctionType(ph, [I32, I32, I32, I32, L.PointerType()]), f"poot.spv.bind.{binding}")
        getp = L.Function(self.m, L.FunctionType(L.PointerType(llvm_type(t), STORAGE_AS), [ph, I32]), f"poot.spv.ptr.{binding}")
        self.m.placeholders[f'@"poot.spv.bind.{binding}"'] = f"@llvm.spv.resource.handlefrombinding.{mangled}"
        self.m.placeholders[f'@"poot.spv.ptr.{binding}"'] = f"@llvm.spv.resource.getpointer.p{STORAGE_AS}.{mangled}"
        label = name.encode() + b"\0"
        g = L.GlobalVariable(self.m, L.ArrayType(L.IntType(8), len(label)), f"poot.spv.name.{binding}")
        g.linkage = "private"
        g.global_constant = True
        g.initializer = L.Constant(L.ArrayType(L.IntType(8), len(label)), bytearray(label))
        c = lambda v: L.Constant(I32, v)  # noqa: E731
        h = self.b.call(make, [c(0), c(binding), c(1), c(0), g.bitcast(L.PointerType())], name=f"h.{name}")
        return h, getp

    def _gpu_function(self, params: list[L.Type]) -> None:
        k = self.k
        fn = L.Function(self.m, L.FunctionType(L.VoidType(), []), ENTRY)
        x, y, z = k.workgroup
        set.add(fn.attributes, f'"hlsl.numthreads"="{x},{y},{z}"')
        set.add(fn.attributes, '"hlsl.shader"="compute"')
        set.add(fn.attributes, "noinline")  # optnone needs it
        set.add(fn.attributes, "optnone")  # see the module docstring
        self.b = L.IRBuilder(fn.append_basic_block("entry"))
        for binding, name, t, writable in bindings(k):
            h, getp = self._handle(binding, name, t, writable)
            if name != SCALARS:
                self.mem[name] = (h, t, None)
                self._getptr[name] = getp
                continue
            for j, p in enumerate(k.scalars):
                word = self.b.load(self.b.call(getp, [h, L.Constant(I32, j)]), name=p.name)
                self.values[p.name] = self.b.bitcast(word, F32, name=p.name + ".f") if p.dtype == dt.f32 else word
        self.block(k.body)
        self.b.ret_void()

    def address(self, name: str, index: K.Expr) -> tuple[L.Value, DType]:
        base, t, size = self.mem[name]
        if size is not None:  # a shared array: gep [N x T], @global, 0, i (the form the backend needs)
            return super().address(name, index)
        return self.b.call(self._getptr[name], [base, self.expr(index)]), t


# -- the binary post-pass ---------------------------------------------------------------------------

_OP_CAPABILITY, _OP_DECORATE, _OP_CONSTANT, _OP_TYPE_INT = 17, 71, 43, 21
_OP_LOAD, _OP_STORE, _OP_CONTROL_BARRIER = 61, 62, 224
_CAP_LINKAGE, _CAP_INT8 = 5, 39
_DEC_LINKAGE_ATTRIBUTES = 41
_MAGIC = 0x07230203
#: spirv-opt's performance recipe (it ends with dead-code elimination, which drops the name strings)
OPT_PASSES = ("-O", "--eliminate-dead-code-aggressive")


def _error(msg: str) -> Exception:
    from .compile import CompileError

    return CompileError(msg)


def _tool(exe: str) -> str:
    path = shutil.which(exe)
    if path is None:
        raise _error(f"{exe} is not installed; SPIR-V output needs SPIRV-Tools (apt install spirv-tools)")
    return path


def _words(spv: bytes, name: str) -> list[int]:
    if len(spv) % 4 or len(spv) < 20:
        raise _error(f"kernel {name}: the SPIR-V backend produced {len(spv)} bytes, not a SPIR-V module")
    words = list(struct.unpack(f"<{len(spv) // 4}I", spv))
    if words[0] != _MAGIC:
        raise _error(f"kernel {name}: the SPIR-V backend's output has no SPIR-V magic number")
    return words


def _instructions(words: list[int]):  # type: ignore[no-untyped-def]
    """(offset, opcode, operand words) of each instruction after the header."""
    i = 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        if n == 0:
            raise ValueError(f"malformed SPIR-V: zero-length instruction at word {i}")
        yield i, op, words[i + 1 : i + n]
        i += n


def _string(operands: list[int]) -> str:
    raw = struct.pack(f"<{len(operands)}I", *operands)
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _encode(op: int, operands: list[int]) -> list[int]:
    return [(len(operands) + 1) << 16 | op] + operands


def _check_linkage(words: list[int], name: str) -> None:
    if not any(op == _OP_CAPABILITY and ops[0] == _CAP_LINKAGE for _, op, ops in _instructions(words)):
        return
    linked = [_string(ops[2:-1]) for _, op, ops in _instructions(words) if op == _OP_DECORATE and ops[1] == _DEC_LINKAGE_ATTRIBUTES]
    raise _error(f"kernel {name}: the SPIR-V module needs linking (OpCapability Linkage): it calls or exports "
                 f"{', '.join(linked) or 'an unresolved symbol'}, which the Vulkan target cannot provide")


def fix_barriers(words: list[int]) -> list[int]:
    """Point every OpControlBarrier's memory semantics at a constant BARRIER_SEMANTICS of the same type."""
    words = list(words)
    consts = {ops[1]: (off, ops[0], ops[2]) for off, op, ops in _instructions(words) if op == _OP_CONSTANT and len(ops) == 3}
    barriers = [off for off, op, _ in _instructions(words) if op == _OP_CONTROL_BARRIER]
    if not barriers:
        return words
    new_ids: dict[int, int] = {}  # constant type -> id of the BARRIER_SEMANTICS constant
    for cid, (_, ty, value) in consts.items():
        if value == BARRIER_SEMANTICS:
            new_ids.setdefault(ty, cid)
    inserts: list[tuple[int, list[int]]] = []
    for off in barriers:
        sem = words[off + 3]
        if sem not in consts:
            raise ValueError(f"barrier memory semantics %{sem} is not an OpConstant")
        coff, ty, _ = consts[sem]
        if ty not in new_ids:
            new_ids[ty] = words[3]
            words[3] += 1  # the id bound
            inserts.append((coff + (words[coff] >> 16), _encode(_OP_CONSTANT, [ty, new_ids[ty], BARRIER_SEMANTICS])))
        words[off + 3] = new_ids[ty]
    for at, ins in sorted(inserts, reverse=True):
        words[at:at] = ins
    return words


def _drop_capability(words: list[int], cap: int) -> list[int]:
    out = words[:5]
    for off, op, ops in _instructions(words):
        if op == _OP_CAPABILITY and ops[0] == cap:
            continue
        out.extend(words[off : off + len(ops) + 1])
    return out


def _uses_int8(words: list[int]) -> bool:
    return any(op == _OP_TYPE_INT and ops[1] == 8 for _, op, ops in _instructions(words))


def _pack(words: list[int]) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


def _run(cmd: list[str], data: bytes, name: str, what: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.spv", Path(d) / "out.spv"
        src.write_bytes(data)
        r = subprocess.run(cmd + [str(src)] + (["-o", str(dst)] if what == "spirv-opt" else []), capture_output=True, text=True, timeout=120)
        if r.returncode:
            msg = (r.stderr + r.stdout).strip()[-1500:]
            raise _error(f"kernel {name}: {what} rejected the SPIR-V module: {msg}")
        return dst.read_bytes() if what == "spirv-opt" else data


def validate(spv: bytes, name: str) -> None:
    """spirv-val for the Vulkan 1.3 environment; a CompileError quoting it on failure."""
    _run([_tool("spirv-val"), "--target-env", "vulkan1.3"], spv, name, "spirv-val")


def post_pass(obj: bytes, name: str) -> bytes:
    """LLVM's SPIR-V -> a module Vulkan drivers run correctly: barrier semantics 0x148, no Int8
    capability, no Linkage; validated by spirv-val (vulkan1.3)."""
    opt, _ = _tool("spirv-opt"), _tool("spirv-val")
    words = _words(obj, name)
    _check_linkage(words, name)
    try:
        words = fix_barriers(words)
    except ValueError as e:
        raise _error(f"kernel {name}: cannot fix the barrier semantics: {e}") from None
    spv = _run([opt, "--target-env=vulkan1.3", *OPT_PASSES], _pack(words), name, "spirv-opt")
    words = _words(spv, name)
    if not _uses_int8(words):
        words = _drop_capability(words, _CAP_INT8)
    spv = _pack(words)
    validate(spv, name)
    return spv


def for_wgpu(spv: bytes) -> bytes:
    """The module with the ``Aligned`` memory operands dropped from OpLoad/OpStore (naga rejects them)."""
    words = _words(spv, "(wgpu)")
    out = words[:5]
    for off, op, ops in _instructions(words):
        fixed = 2 if op == _OP_STORE else 3 if op == _OP_LOAD else None
        if fixed is not None and len(ops) > fixed and ops[fixed] & 0x2:
            mask = ops[fixed] & ~0x2
            extra = ops[fixed + 2 :]  # Aligned's literal is the first mask operand (Volatile has none)
            ops = ops[:fixed] + ([mask] + extra if mask else [])
            out.extend(_encode(op, ops))
        else:
            out.extend(words[off : off + len(ops) + 1])
    return _pack(out)
