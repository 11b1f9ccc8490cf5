"""The ``@kernel`` front end's translator: a kernel function's syntax tree, in the restricted Python
subset ``poot.kernel.frontend`` documents, to Kernel IR statements; calls of ``@inline`` functions
are expanded in place (their statements before the statement that calls them, their locals renamed
apart), and compile-time values fold as they go."""

from __future__ import annotations

import ast
import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PootError
from ..graph import dtypes as dt
from ..graph.dtypes import DType
from . import ir

__all__ = ["KernelSyntaxError", "InlineFunction", "Context", "translate", "expand_half_to_f32", "DTYPES"]


class KernelSyntaxError(PootError):
    """Python outside the kernel subset, located by file and line."""


DTYPES = {"f32": dt.f32, "f16": dt.f16, "bf16": dt.bf16, "f64": dt.f64, "i32": dt.i32, "i64": dt.i64, "i8": dt.i8, "u8": dt.u8, "bool": dt.boolean}
_BUILTINS = {"thread_id", "group_id", "group_size", "num_groups", "lane_id", "subgroup_size"}
_MATH = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "abs", "floor", "rint", "erf", "recip"}
_BINOPS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "div",
    ast.Mod: "rem",
    ast.BitAnd: "and",
    ast.BitOr: "or",
    ast.BitXor: "xor",
    ast.LShift: "shl",
    ast.RShift: "shr",
    ast.Pow: "pow",
}
_CMPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_PY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "rem": lambda a, b: int(math.fmod(a, b)),
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b,
    "shr": lambda a, b: a >> b,
    "pow": lambda a, b: a**b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "min": min,
    "max": max,
}


class InlineFunction:
    """A function in the kernel subset that kernels call as an expression (``@inline``): each call
    is expanded in place, its parameters bound to the arguments' values and its locals renamed
    apart. Its body ends with ``return value`` (the only return); it sees its parameters only (no
    buffers, no names of the calling kernel), and may call other inline functions but not itself.
    A parameter annotated with a dtype is a run-time value of that type (a constant argument is
    converted); one without an annotation takes the argument as it comes, so compile-time constants
    stay compile-time inside."""

    def __init__(self, fn: Any, tree: ast.FunctionDef, file: str, line0: int, annotations: Mapping[str, Any]) -> None:
        self.fn, self.tree, self.file, self.line0 = fn, tree, file, line0
        self.name = tree.name
        self.params = [a.arg for a in tree.args.args]
        self.types = {p: a for p, a in annotations.items() if isinstance(a, DType)}
        err = lambda node, msg: KernelSyntaxError(f"{file}:{line0 + getattr(node, 'lineno', 1) - 1}: {msg}")  # noqa: E731
        a = tree.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
            raise err(tree, f"inline function {self.name} takes plain positional parameters only (no defaults, *args or **kwargs)")
        body = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            raise err(tree, f"inline function {self.name} must end with 'return value'")
        if any(isinstance(x, ast.Return) for s in body[:-1] for x in ast.walk(s)):
            raise err(tree, f"inline function {self.name}: 'return' only as its last statement")
        self.body = body
        self.assigned = {x.id for s in body for x in ast.walk(s) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}
        called = {id(x.func) for s in body for x in ast.walk(s) if isinstance(x, ast.Call)}
        known = set(self.params) | self.assigned | {"True", "False"} | set(DTYPES)
        for s in body:
            for x in ast.walk(s):
                if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load) and id(x) not in called and x.id not in known:
                    raise err(x, f"inline function {self.name} uses '{x.id}', which is not its parameter or local variable")

    def __call__(self, *args: Any) -> Any:
        raise TypeError(f"inline function {self.name} is called from kernels only")


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.names.get(node.id, node.id), node.ctx), node)


@dataclass
class Context:
    """What a kernel's translation knows: its source location, compile-time constants, parameters,
    locals and shared arrays so far, and its module's names."""

    file: str
    line0: int
    consts: dict[str, Any]
    buffers: dict[str, ir.Buffer]
    scalars: dict[str, DType]
    locals: dict[str, DType]
    shared: dict[str, ir.Shared]
    names: Mapping[str, Any] = field(default_factory=dict)  # the kernel's module globals: where ``@inline`` functions are found
    counter: int = 0

    def err(self, node: ast.AST, msg: str) -> KernelSyntaxError:
        return KernelSyntaxError(f"{self.file}:{self.line0 + getattr(node, 'lineno', 1) - 1}: {msg}")


Value = Any  # an ir.Expr, or a Python int/float/bool known at compile time


def _lit(v: Any, like: DType | None) -> ir.Expr:
    if isinstance(v, bool):
        return ir.Const(v, dt.boolean)
    if like is not None and like.is_float:
        return ir.Const(float(v), like)
    if isinstance(v, float):
        return ir.Const(v, dt.f32)
    return ir.Const(int(v), like if like is not None and like.is_int else dt.i32)


def _typed(a: Value, b: Value) -> tuple[ir.Expr, ir.Expr]:
    ta = a.dtype if not isinstance(a, (int, float, bool)) else None
    tb = b.dtype if not isinstance(b, (int, float, bool)) else None
    return (a if ta else _lit(a, tb)), (b if tb else _lit(b, ta))


def translate(ctx: Context, body: list[ast.stmt]) -> list[ir.Stmt]:
    """Kernel IR statements for a kernel function's ``body`` in the context ``ctx`` (its parameters,
    constants and module globals); ``ctx`` collects the shared arrays it declares."""
    return _Translator(ctx).block(body)


class _Translator:
    def __init__(self, ctx: Context) -> None:
        self.c = ctx
        self.pending: list[ir.Stmt] = []  # an inline call's statements, placed before the statement that calls it
        self.inlining: list[str] = []

    # -- expressions --------------------------------------------------------------------------------
    def expr(self, n: ast.expr) -> Value:
        c = self.c
        if isinstance(n, ast.Constant):
            if isinstance(n.value, (bool, int, float, str)):
                return n.value
            raise c.err(n, f"constant {n.value!r} is not a number")
        if isinstance(n, ast.Name):
            if n.id in c.consts:
                return c.consts[n.id]
            if n.id in c.scalars:
                return ir.Ref(n.id, c.scalars[n.id])
            if n.id in c.locals:
                return ir.Ref(n.id, c.locals[n.id])
            if n.id in ("True", "False"):
                return n.id == "True"
            raise c.err(n, f"'{n.id}' is not a parameter, local variable or constant of this kernel")
        if isinstance(n, ast.BinOp):
            op = _BINOPS.get(type(n.op))
            if op is None:
                raise c.err(n, f"operator {type(n.op).__name__} is not supported in kernels")
            a, b = self.expr(n.left), self.expr(n.right)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                if isinstance(n.op, ast.Div):
                    return a / b
                if isinstance(n.op, ast.FloorDiv):
                    return int(a / b) if isinstance(a, int) and isinstance(b, int) else a // b
                return _PY[op](a, b)
            ea, eb = _typed(a, b)
            if ea.dtype != eb.dtype:
                raise c.err(n, f"operands differ: {ea.dtype} {op} {eb.dtype} (cast one, e.g. f32(x))")
            if isinstance(n.op, ast.Div) and ea.dtype.is_int:
                raise c.err(n, "use // for integer division (it truncates toward zero)")
            return ir.Bin(op, ea, eb)
        if isinstance(n, ast.Compare):
            if len(n.ops) != 1:
                raise c.err(n, "chained comparisons are not supported; use 'and'")
            op = _CMPS.get(type(n.ops[0]))
            if op is None:
                raise c.err(n, f"comparison {type(n.ops[0]).__name__} is not supported")
            a, b = self.expr(n.left), self.expr(n.comparators[0])
            if isinstance(a, str) or isinstance(b, str):
                if not (isinstance(a, str) and isinstance(b, str)):
                    raise c.err(n, "strings compare only with compile-time strings")
                return _PY[op](a, b)
            if not isinstance(a, ir.Expr.__args__) and not isinstance(b, ir.Expr.__args__):  # type: ignore[attr-defined]
                return _PY[op](a, b)
            ea, eb = _typed(a, b)
            if ea.dtype != eb.dtype:
                raise c.err(n, f"comparing {ea.dtype} with {eb.dtype}")
            return ir.Bin(op, ea, eb)
        if isinstance(n, ast.BoolOp):
            vals = [self.expr(v) for v in n.values]
            op = "and" if isinstance(n.op, ast.And) else "or"
            out = vals[0]
            for v in vals[1:]:
                if isinstance(out, bool) or isinstance(v, bool):  # a compile-time side decides or drops out
                    known, other = (out, v) if isinstance(out, bool) else (v, out)
                    out = (other if known else False) if op == "and" else (True if known else other)
                    continue
                ea, eb = _typed(out, v)
                if ea.dtype != dt.boolean or eb.dtype != dt.boolean:
                    raise c.err(n, f"'{op}' needs bool operands")
                out = ir.Bin(op, ea, eb)
            return out
        if isinstance(n, ast.UnaryOp):
            v = self.expr(n.operand)
            if isinstance(n.op, ast.USub):
                return -v if isinstance(v, (int, float)) else ir.Un("neg", v)
            if isinstance(n.op, ast.Not):
                return (not v) if isinstance(v, bool) else ir.Un("not", v)
            if isinstance(n.op, ast.UAdd):
                return v
            raise c.err(n, f"unary {type(n.op).__name__} is not supported")
        if isinstance(n, ast.IfExp):
            cond = self.expr(n.test)
            if isinstance(cond, bool):
                return self.expr(n.body if cond else n.orelse)
            a, b = _typed(self.expr(n.body), self.expr(n.orelse))
            if a.dtype != b.dtype:
                raise c.err(n, f"conditional branches differ: {a.dtype} vs {b.dtype}")
            return ir.Select(cond, a, b)
        if isinstance(n, ast.Subscript):
            name = self._memory(n.value)
            mem = c.buffers.get(name) or c.shared[name]
            return ir.Load(name, self.index(n.slice), mem.dtype)
        if isinstance(n, ast.Call):
            return self.call(n)
        raise c.err(n, f"{type(n).__name__} is not supported in kernels")

    def _memory(self, n: ast.expr) -> str:
        if isinstance(n, ast.Name) and (n.id in self.c.buffers or n.id in self.c.shared):
            return n.id
        raise self.c.err(n, "only buffer parameters and shared arrays can be indexed")

    def index(self, n: ast.expr) -> ir.Expr:
        v = self.expr(n)
        e = _lit(v, dt.i32) if isinstance(v, (int, float, bool)) else v
        if e.dtype != dt.i32:
            raise self.c.err(n, f"an index must be i32, got {e.dtype}")
        return e

    def call(self, n: ast.Call) -> Value:
        c = self.c
        if not isinstance(n.func, ast.Name):
            raise c.err(n, "only plain function calls are supported (no methods or attributes)")
        f = n.func.id
        if f in ("dequant", "dequant_in_block"):  # quant.bodies: (QTYPE, packed buffer, byte offset, index)
            return self._dequant(n, f)
        if f == "load_word":  # four bytes of a u8 buffer as a little-endian i32
            if len(n.args) != 2:
                raise c.err(n, "load_word() takes a buffer and a byte index")
            return ir.LoadWord(self._memory(n.args[0]), self.index(n.args[1]))
        args = [self.expr(a) for a in n.args]
        if n.keywords:
            raise c.err(n, f"{f}() takes no keyword arguments in kernels")
        if f in _BUILTINS:
            dim = args[0] if args else 0
            if not isinstance(dim, int) or not 0 <= dim <= 2:
                raise c.err(n, f"{f}() takes a constant dimension 0, 1 or 2")
            return ir.Builtin(f, dim)
        if f == "ilog2":  # compile time only: log2 of a power of two
            (a,) = args
            if not isinstance(a, int) or a < 1 or a & (a - 1):
                raise c.err(n, "ilog2() takes a compile-time power of two")
            return a.bit_length() - 1
        if f in _MATH:
            (a,) = args
            if isinstance(a, (int, float)):
                a = _lit(float(a), dt.f32)
            return ir.Un(f, a)
        if f in ("min", "max"):
            if len(args) != 2:
                raise c.err(n, f"{f}() takes two arguments in kernels")
            if all(isinstance(a, (int, float)) for a in args):
                return _PY[f](*args)
            a, b = _typed(*args)
            return ir.Bin(f, a, b)
        if f in DTYPES:
            (a,) = args
            if isinstance(a, (int, float, bool)):
                return _lit(a, DTYPES[f]) if f != "bool" else ir.Const(bool(a), dt.boolean)
            return a if a.dtype == DTYPES[f] else ir.Cast(a, DTYPES[f])
        if f in ("subgroup_add", "subgroup_max", "subgroup_min"):
            (a,) = args
            return ir.SubgroupReduce(f.split("_")[1], a)
        if f in ("shuffle", "shuffle_xor"):
            a, lane = args
            return ir.SubgroupShuffle(a, _lit(lane, dt.i32) if isinstance(lane, int) else lane, xor=f == "shuffle_xor")
        if f == "select":
            cond, a, b = args
            a, b = _typed(a, b)
            return ir.Select(cond, a, b)
        if f in ("as_f32", "as_i32"):
            (a,) = args
            a = _lit(a, dt.i32 if f == "as_f32" else dt.f32) if isinstance(a, (int, float)) else a
            return ir.Bitcast(a, dt.f32 if f == "as_f32" else dt.i32)
        if f == "fma":  # a * b + c rounded once, whatever the target's contraction policy
            if len(args) != 3:
                raise c.err(n, "fma() takes three arguments")
            a, b, cc = (_lit(float(v), dt.f32) if isinstance(v, (int, float)) else v for v in args)
            return ir.Fma(a, b, cc)
        if f == "half_to_f32":  # IEEE half bits (in an i32) -> f32, subnormals included
            (a,) = args
            return ir.HalfToF32(a if not isinstance(a, int) else _lit(a, dt.i32))
        if isinstance(c.names.get(f), InlineFunction):
            return self._inline(n, c.names[f], args)
        raise c.err(n, f"'{f}' cannot be called in a kernel")

    def _inline(self, n: ast.Call, h: InlineFunction, args: list[Value]) -> Value:
        """The value of a call of inline function ``h``: its statements go to ``pending`` with its
        parameters and locals renamed apart; errors inside it name its own file and line."""
        c = self.c
        if len(args) != len(h.params):
            raise c.err(n, f"{h.name}() takes {len(h.params)} arguments, got {len(args)}")
        if h.name in self.inlining:
            raise c.err(n, f"inline function {h.name} calls itself ({' -> '.join([*self.inlining, h.name])}); kernels have no recursion")
        c.counter += 1
        names = {v: f"_{h.name}{c.counter}_{v}" for v in (*h.params, *h.assigned)}
        for p, v in zip(h.params, args):
            want = h.types.get(p)
            if isinstance(v, str) or (want is None and isinstance(v, (int, float, bool)) and p not in h.assigned):
                if want is not None:
                    raise c.err(n, f"{h.name}(): parameter '{p}' is {want}, got the string {v!r}")
                c.consts[names[p]] = v  # compile-time inside the function too
                continue
            e = _lit(v, want) if isinstance(v, (int, float, bool)) else v
            if want is not None and e.dtype != want:
                raise c.err(n, f"{h.name}(): parameter '{p}' is {want}, got {e.dtype} (cast it, e.g. {want}(x))")
            c.locals[names[p]] = e.dtype
            self.pending.append(ir.Let(names[p], e))
        rename = _Rename(names)
        saved = (c.file, c.line0)
        c.file, c.line0 = h.file, h.line0
        self.inlining.append(h.name)
        try:
            for s in h.body[:-1]:
                self.pending.extend(self.stmt(rename.visit(copy.deepcopy(s))))
            ret = h.body[-1]
            value = self.expr(rename.visit(copy.deepcopy(ret.value)))
            want = h.types.get("return")
            if want is not None:
                value = _lit(value, want) if isinstance(value, (int, float, bool)) else value
                if value.dtype != want:
                    raise c.err(ret, f"{h.name} returns {value.dtype}, annotated {want}")
        finally:
            self.inlining.pop()
            c.file, c.line0 = saved
            for p in h.params:
                c.consts.pop(names[p], None)
        return value

    def _dequant(self, n: ast.Call, f: str) -> ir.Expr:
        from ..quant.bodies import dequant_expr, dequant_in_block

        c = self.c
        if len(n.args) != 4:
            raise c.err(n, "dequant(QTYPE, buffer, row_byte_offset, k) takes four arguments")
        qtype = self.expr(n.args[0])
        if not isinstance(qtype, str):
            raise c.err(n, "dequant's packed type must be a compile-time constant such as 'q4_k'")
        buf = self._memory(n.args[1])
        if c.buffers[buf].dtype != dt.u8:
            raise c.err(n, f"dequant reads packed bytes: '{buf}' must be In[u8]")
        try:
            fn = dequant_expr if f == "dequant" else dequant_in_block
            return fn(qtype, buf, self.index(n.args[2]), self.index(n.args[3]))
        except KeyError as e:
            raise c.err(n, str(e.args[0])) from None

    # -- statements ---------------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in stmts:
            out.extend(self.stmt(s))
        return out

    def _scoped(self, stmts: list[ast.stmt]) -> tuple[ir.Stmt, ...]:
        saved = dict(self.c.locals)
        body = self.block(stmts)
        self.c.locals = saved
        return tuple(body)

    def stmt(self, n: ast.stmt) -> list[ir.Stmt]:
        """``n`` as Kernel IR, after the statements of the inline calls in it."""
        outer, self.pending = self.pending, []
        try:
            out = self._stmt(n)
            return self.pending + out
        finally:
            self.pending = outer

    def _stmt(self, n: ast.stmt) -> list[ir.Stmt]:
        c = self.c
        if isinstance(n, ast.Expr):
            if isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
                return []  # docstring
            if isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name):
                f = n.value.func.id
                if f == "barrier" and not n.value.args:
                    return [ir.Barrier()]
                if f == "atomic_add" and len(n.value.args) == 3:
                    name = self._memory(n.value.args[0])
                    return [ir.AtomicAdd(name, self.index(n.value.args[1]), self._value_for(name, n.value.args[2]))]
                if f == "vstore" and len(n.value.args) >= 4:
                    name = self._memory(n.value.args[0])
                    vals = tuple(self._value_for(name, a) for a in n.value.args[2:])
                    return [ir.VecStore(name, self.index(n.value.args[1]), vals)]
                if f == "reduce_shared" and len(n.value.args) in (2, 3):
                    return self._reduce_shared(n.value)
                if f == "reduce_argmax" and len(n.value.args) == 2:
                    return self._reduce_argmax(n.value)
                if f == "prefetch" and len(n.value.args) == 3:  # (buffer, index, bytes): a hint
                    a = n.value.args
                    return [ir.Prefetch(self._memory(a[0]), self.index(a[1]), self.index(a[2]))]
                if f == "spread_bits" and len(n.value.args) == 5:  # (arr, at, lo, hi, shift)
                    a = n.value.args
                    shift = self.expr(a[4])
                    if not isinstance(shift, int):
                        raise c.err(n, "spread_bits' shift must be a compile-time constant")
                    return [ir.SpreadBits(self._memory(a[0]), self.index(a[1]), self.index(a[2]), self.index(a[3]), shift)]
                if f == "dot_bytes" and len(n.value.args) == 7:  # (acc, at, a, at, b, at, lanes)
                    a = n.value.args
                    lanes = self.expr(a[6])
                    if not isinstance(lanes, int):
                        raise c.err(n, "dot_bytes' lane count must be a compile-time constant")
                    mems = [self._memory(a[i]) for i in (0, 2, 4)]
                    return [ir.DotBytes(mems[0], self.index(a[1]), mems[1], self.index(a[3]), mems[2], self.index(a[5]), lanes)]
                if f == "mma_tile" and len(n.value.args) == 3:
                    a, b, cc = (self._memory(x) for x in n.value.args)
                    return [ir.MmaTile(a, b, cc)]
            raise c.err(
                n,
                "an expression statement must be barrier(), atomic_add(buf, i, v), vstore(buf, i, ...), reduce_shared(arr, op), "
                "reduce_argmax(values, ids), dot_bytes(acc, i, a, i, b, i, lanes), spread_bits(arr, i, lo, hi, shift) or mma_tile(a, b, c)",
            )
        if isinstance(n, ast.Pass):
            return []
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            target = n.targets[0] if isinstance(n, ast.Assign) else n.target
            if isinstance(n, ast.Assign) and len(n.targets) != 1:
                raise c.err(n, "one assignment target at a time")
            if isinstance(target, ast.Tuple):  # a0, a1, a2, a3 = vload(buf, i, 4)
                call = n.value
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "vload" and len(call.args) == 2):
                    raise c.err(n, "tuple assignment is only for a, b, ... = vload(buffer, index)")
                names = tuple(t.id for t in target.elts if isinstance(t, ast.Name))
                if len(names) != len(target.elts):
                    raise c.err(n, "vload assigns to plain names")
                buf = self._memory(call.args[0])
                mem = c.buffers.get(buf) or c.shared[buf]
                for nm in names:
                    if nm in c.locals or nm in c.scalars or nm in c.consts:
                        raise c.err(n, f"'{nm}' is already defined")
                    c.locals[nm] = mem.dtype
                return [ir.VecLoad(names, buf, self.index(call.args[1]), mem.dtype)]
            if isinstance(target, ast.Subscript):
                name = self._memory(target.value)
                return [ir.Store(name, self.index(target.slice), self._value_for(name, n.value))]
            if not isinstance(target, ast.Name):
                raise c.err(n, "assign to a name or to buffer[index]")
            if isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) and n.value.func.id == "shared":
                return self._shared(n, target.id, n.value)
            v = self.expr(n.value)
            if target.id in c.consts or target.id in c.scalars or target.id in c.buffers:
                raise c.err(n, f"'{target.id}' is a parameter or constant and cannot be assigned")
            e = _lit(v, None) if isinstance(v, (int, float, bool)) else v
            if target.id in c.locals:
                if c.locals[target.id] != e.dtype:
                    e = _lit(v, c.locals[target.id]) if isinstance(v, (int, float)) else e
                if c.locals[target.id] != e.dtype:
                    raise c.err(n, f"'{target.id}' is {c.locals[target.id]}, assigned {e.dtype}")
                return [ir.Assign(target.id, e)]
            c.locals[target.id] = e.dtype
            return [ir.Let(target.id, e)]
        if isinstance(n, ast.AugAssign):
            op = _BINOPS.get(type(n.op))
            if op is None:
                raise c.err(n, f"operator {type(n.op).__name__}= is not supported")
            if isinstance(n.target, ast.Subscript):
                name = self._memory(n.target.value)
                idx = self.index(n.target.slice)
                mem = c.buffers.get(name) or c.shared[name]
                a, b = _typed(ir.Load(name, idx, mem.dtype), self.expr(n.value))
                return [ir.Store(name, idx, ir.Bin(op, a, b))]
            if not isinstance(n.target, ast.Name) or n.target.id not in c.locals:
                raise c.err(n, "augmented assignment needs an existing local variable")
            cur = ir.Ref(n.target.id, c.locals[n.target.id])
            a, b = _typed(cur, self.expr(n.value))
            if a.dtype != b.dtype:
                raise c.err(n, f"'{n.target.id}' is {a.dtype}, combined with {b.dtype}")
            return [ir.Assign(n.target.id, ir.Bin(op, a, b))]
        if isinstance(n, ast.If):
            cond = self.expr(n.test)
            if isinstance(cond, (bool, int, str)):  # compile-time: keep one branch
                return self.block(n.body if cond else n.orelse)
            if cond.dtype != dt.boolean:
                raise c.err(n, f"condition must be bool, got {cond.dtype}")
            return [ir.If(cond, self._scoped(n.body), self._scoped(n.orelse))]
        if isinstance(n, ast.For):
            return self._for(n)
        raise c.err(n, f"{type(n).__name__} statements are not supported in kernels")

    def _reduce_shared(self, call: ast.Call) -> list[ir.Stmt]:
        """reduce_shared(arr, "add"|"max"|"min"[, subgroup]): barrier, then a tree over the shared
        array (one element per thread, power-of-two size); afterwards arr[0] holds the result for
        every thread. With a compile-time ``subgroup`` > 0 (the device's subgroup size): each
        subgroup reduces its elements by a subgroup operation, then the subgroups' results are
        reduced the same way: three barriers for up to subgroup**2 elements instead of log2(size) + 1."""
        c = self.c
        name = self._memory(call.args[0])
        op = self.expr(call.args[1])
        sub = self.expr(call.args[2]) if len(call.args) > 2 else 0
        sh = c.shared.get(name)
        if sh is None or sh.size & (sh.size - 1) or op not in ("add", "max", "min") or not isinstance(sub, int):
            raise c.err(
                call, "reduce_shared(shared_array, 'add'|'max'|'min'[, subgroup]) needs a shared array of power-of-two size and a compile-time subgroup size"
            )
        tid = ir.Builtin("thread_id", 0)
        if sub > 0:
            return self._reduce_subgroups(name, sh, op, sub)
        out: list[ir.Stmt] = [ir.Barrier()]
        step = sh.size // 2
        while step:
            a = ir.Load(name, tid, sh.dtype)
            b = ir.Load(name, ir.Bin("add", tid, ir.Const(step, dt.i32)), sh.dtype)
            out.append(ir.If(ir.Bin("lt", tid, ir.Const(step, dt.i32)), (ir.Store(name, tid, ir.Bin(op, a, b)),)))
            out.append(ir.Barrier())
            step //= 2
        return out

    def _reduce_argmax(self, call: ast.Call) -> list[ir.Stmt]:
        """reduce_argmax(values, ids): barrier, then a tree over two shared arrays of one size (a
        value and its id per thread; ids i32); afterwards values[0] holds the largest value and
        ids[0] its id, ties to the lower id, for every thread."""
        c = self.c
        vals, ids = self._memory(call.args[0]), self._memory(call.args[1])
        sv, si = c.shared.get(vals), c.shared.get(ids)
        if sv is None or si is None or sv.size != si.size or sv.size & (sv.size - 1) or si.dtype != dt.i32:
            raise c.err(call, "reduce_argmax(values, ids) needs two shared arrays of one power-of-two size, ids of i32")
        tid = ir.Builtin("thread_id", 0)
        out: list[ir.Stmt] = [ir.Barrier()]
        step = sv.size // 2
        while step:
            other = ir.Bin("add", tid, ir.Const(step, dt.i32))
            a, b = ir.Load(vals, tid, sv.dtype), ir.Load(vals, other, sv.dtype)
            ia, ib = ir.Load(ids, tid, dt.i32), ir.Load(ids, other, dt.i32)
            better = ir.Bin("or", ir.Bin("gt", b, a), ir.Bin("and", ir.Bin("eq", b, a), ir.Bin("lt", ib, ia)))
            out.append(ir.If(ir.Bin("lt", tid, ir.Const(step, dt.i32)), (ir.If(better, (ir.Store(vals, tid, b), ir.Store(ids, tid, ib))),)))
            out.append(ir.Barrier())
            step //= 2
        return out

    def _reduce_subgroups(self, name: str, sh: ir.Shared, op: str, sub: int) -> list[ir.Stmt]:
        """Each subgroup reduces its elements and stores its result at its index; the results are
        reduced the same way, level by level, until one is left (two levels for 1,024 elements on
        32-lane subgroups, four on 8-lane ones)."""
        self._reductions = getattr(self, "_reductions", 0) + 1
        tid = ir.Builtin("thread_id", 0)
        i32 = lambda v: ir.Const(v, dt.i32)  # noqa: E731
        identity = ir.Const({"add": 0.0, "max": -3.0e38, "min": 3.0e38}[op], sh.dtype) if sh.dtype.is_float else ir.Const(0, sh.dtype)
        leader = ir.Bin("eq", ir.Bin("rem", tid, i32(sub)), i32(0))
        out: list[ir.Stmt] = []
        count, level = sh.size, 0
        while count > 1 or level == 0:
            v = f"_sub{self._reductions}_{level}"
            mine = (
                ir.Load(name, tid, sh.dtype)
                if level == 0
                else ir.Select(ir.Bin("lt", tid, i32(count)), ir.Load(name, ir.Bin("min", tid, i32(sh.size - 1)), sh.dtype), identity)
            )
            nxt = -(-count // sub)
            if level and nxt == 1:  # the last level: one subgroup reads what is left and lane 0 stores it
                out += [
                    ir.If(
                        ir.Bin("lt", tid, i32(sub)),
                        (ir.Let(v, ir.SubgroupReduce(op, mine)), ir.If(ir.Bin("eq", tid, i32(0)), (ir.Store(name, i32(0), ir.Ref(v, sh.dtype)),))),
                    ),
                    ir.Barrier(),
                ]
            else:  # every thread has read its element before a subgroup's result overwrites one
                keep = leader if level == 0 else ir.Bin("and", leader, ir.Bin("lt", tid, i32(count)))
                out += [
                    ir.Let(v, ir.SubgroupReduce(op, mine)),
                    ir.Barrier(),
                    ir.If(keep, (ir.Store(name, ir.Bin("div", tid, i32(sub)), ir.Ref(v, sh.dtype)),)),
                    ir.Barrier(),
                ]
            count, level = nxt, level + 1
        return out

    def _value_for(self, name: str, node: ast.expr) -> ir.Expr:
        """The value stored into ``name``: a float converts to the memory's float type (rounded to
        nearest even, as C converts on assignment); other types must match."""
        mem = self.c.buffers.get(name) or self.c.shared[name]
        v = self.expr(node)
        if isinstance(v, (int, float, bool)):
            return _lit(v, mem.dtype)
        if v.dtype != mem.dtype and v.dtype.is_float and mem.dtype.is_float:
            return ir.Cast(v, mem.dtype)
        return v

    def _shared(self, n: ast.stmt, name: str, call: ast.Call) -> list[ir.Stmt]:
        c = self.c
        if len(call.args) != 2 or not isinstance(call.args[0], ast.Name) or call.args[0].id not in DTYPES:
            raise c.err(n, "shared(dtype, size) takes a dtype and a constant size")
        size = self.expr(call.args[1])
        if not isinstance(size, int) or size < 1:
            raise c.err(n, "a shared array's size must be a positive compile-time constant")
        if name in c.shared or name in c.locals:
            raise c.err(n, f"'{name}' is already defined")
        c.shared[name] = ir.Shared(name, DTYPES[call.args[0].id], size)
        return []

    def _for(self, n: ast.For) -> list[ir.Stmt]:
        c = self.c
        if not isinstance(n.target, ast.Name) or not isinstance(n.iter, ast.Call) or not isinstance(n.iter.func, ast.Name):
            raise c.err(n, "loops must be 'for name in range(...)' or 'static_range(...)'")
        if n.orelse:
            raise c.err(n, "for/else is not supported")
        args = [self.expr(a) for a in n.iter.args]
        var = n.target.id
        if n.iter.func.id == "static_range":  # unrolled at compile time
            if not all(isinstance(a, int) for a in args):
                raise c.err(n, "static_range needs compile-time constant bounds")
            out: list[ir.Stmt] = []
            for i in range(*args):  # one scope for all copies: a name set in the body is one variable
                c.consts[var] = i
                out.extend(self.block(n.body))
            c.consts.pop(var, None)
            return out
        if n.iter.func.id != "range" or not 1 <= len(args) <= 3:
            raise c.err(n, "loops must be 'for name in range(...)' or 'static_range(...)'")
        start, stop = (0, args[0]) if len(args) == 1 else (args[0], args[1])
        step = args[2] if len(args) == 3 else 1
        if not isinstance(step, int) or step < 1:
            raise c.err(n, "the loop step must be a positive compile-time constant")
        if var in c.locals or var in c.scalars or var in c.consts:
            raise c.err(n, f"loop variable '{var}' shadows an existing name")
        c.locals[var] = dt.i32
        body = self._scoped(n.body)
        del c.locals[var]
        return [ir.For(var, _lit(start, dt.i32) if isinstance(start, int) else start, _lit(stop, dt.i32) if isinstance(stop, int) else stop, body, step)]


def expand_half_to_f32(h: ir.Expr) -> ir.Expr:
    """f32 from the 16 bits of an IEEE half: exponent rebias for normals, inf/nan kept, and
    subnormals as mantissa * 2^-24 (exact in f32)."""
    i = lambda v: ir.Const(v, dt.i32)  # noqa: E731
    sign = ir.Bin("shl", ir.Bin("and", h, i(0x8000)), i(16))
    exp = ir.Bin("and", ir.Bin("shr", h, i(10)), i(0x1F))
    man = ir.Bin("and", h, i(0x3FF))
    normal = ir.Bitcast(ir.Bin("or", sign, ir.Bin("or", ir.Bin("shl", ir.Bin("add", exp, i(112)), i(23)), ir.Bin("shl", man, i(13)))), dt.f32)
    special = ir.Bitcast(ir.Bin("or", sign, ir.Bin("or", i(0x7F800000), ir.Bin("shl", man, i(13)))), dt.f32)
    sub_mag = ir.Bin("mul", ir.Cast(man, dt.f32), ir.Const(2.0**-24, dt.f32))
    subnormal = ir.Select(ir.Bin("ne", sign, i(0)), ir.Un("neg", sub_mag), sub_mag)
    return ir.Select(ir.Bin("eq", exp, i(0)), subnormal, ir.Select(ir.Bin("eq", exp, i(31)), special, normal))
