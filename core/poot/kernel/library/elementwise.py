"""Fused elementwise chains: a DAG of elementwise graph ops becomes one kernel, one thread per output
element, operands read with per-dimension strides (0 where an operand broadcasts), so one binary
serves every shape of up to four dimensions. Arithmetic is in f32 (f16/bf16 operands are widened on
load), ints in i32, as the oracle's numerics policy says."""

from __future__ import annotations

from collections.abc import Sequence

from ...graph import dtypes as dt
from ...graph.ir import Node, Value
from .. import ir as K
from ..verify import verify_kernel

__all__ = ["fuse_elementwise", "MAX_RANK"]

MAX_RANK = 4
_UN = {
    "neg": "neg",
    "abs": "abs",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "recip": "recip",
    "sin": "sin",
    "cos": "cos",
    "tanh": "tanh",
    "erf": "erf",
    "floor": "floor",
    "logical_not": "not",
}
_BIN = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "pow": "pow",
    "maximum": "max",
    "minimum": "min",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "eq": "eq",
    "ne": "ne",
    "logical_and": "and",
    "logical_or": "or",
}


def _compute(t: dt.DType) -> dt.DType:
    if t.is_float:
        return dt.f32
    if t == dt.boolean:
        return dt.boolean
    return dt.i32


def _key(v: Value) -> tuple[int, int]:
    return (v.node.id, v.index)


def fuse_elementwise(
    name: str, nodes: Sequence[Node], inputs: Sequence[Value], output: Value, block: int = 256, stored: Sequence[dt.DType] | None = None
) -> K.Kernel:
    """A kernel computing ``output`` from ``inputs`` through ``nodes`` (elementwise ops, in order).

    Buffers: ``in0..`` then ``out``; scalars: ``n`` (elements), ``d0..d3`` (output dims, outermost
    first, padded with 1), ``s{i}_{d}`` (input i's element stride along d, 0 to broadcast) and ``o{i}``
    (its first element), ``ot{d}`` and ``o_out`` (where the output element goes: a slice of a bigger
    buffer, such as a part of a concat, is written in place). Grid: ``ceil(n / block)`` workgroups.
    ``stored`` gives each input's element type in memory where it differs from the default (bf16
    activations are widened to f32; bf16 weights are read as their 16-bit patterns).
    """
    params: list[K.Param] = []
    for i, v in enumerate(inputs):
        st = stored[i] if stored is not None else (v.dtype if v.dtype != dt.bf16 else dt.f32)
        params.append(K.Buffer(f"in{i}", st))
    params.append(K.Buffer("out", output.dtype if output.dtype != dt.bf16 else dt.f32, readonly=False))
    params.append(K.ScalarParam("n", dt.i32))
    params += [K.ScalarParam(f"d{d}", dt.i32) for d in range(MAX_RANK)]
    params += [K.ScalarParam(f"s{i}_{d}", dt.i32) for i in range(len(inputs)) for d in range(MAX_RANK)]
    params += [K.ScalarParam(f"o{i}", dt.i32) for i in range(len(inputs))]
    params += [K.ScalarParam(f"ot{d}", dt.i32) for d in range(MAX_RANK)] + [K.ScalarParam("o_out", dt.i32)]
    i32 = lambda x: K.Const(x, dt.i32)  # noqa: E731
    idx = K.Bin("add", K.Bin("mul", K.Builtin("group_id", 0), i32(block)), K.Builtin("thread_id", 0))
    body: list[K.Stmt] = [K.Let("idx", idx)]

    def element(coords: Sequence[K.Expr], tag: str) -> list[K.Stmt]:
        """Load each input at ``coords`` (the output element's coordinates), compute, store."""
        stmts: list[K.Stmt] = []
        env: dict[tuple[int, int], K.Expr] = {}
        for i, v in enumerate(inputs):
            off: K.Expr = K.Ref(f"o{i}", dt.i32)
            for d, c in enumerate(coords):
                if c is not None:
                    off = K.Bin("add", off, K.Bin("mul", c, K.Ref(f"s{i}_{d}", dt.i32)))
            load: K.Expr = K.Load(f"in{i}", off, params[i].dtype)
            ct = _compute(v.dtype)
            if load.dtype != ct:
                load = K.Cast(load, ct)
            stmts.append(K.Let(f"v{i}{tag}", load))
            env[_key(v)] = K.Ref(f"v{i}{tag}", ct)
        for j, nd in enumerate(nodes):
            e = _node_expr(name, nd, [env[_key(a)] for a in nd.inputs])
            stmts.append(K.Let(f"t{j}{tag}", e))
            env[_key(nd.outputs[0])] = K.Ref(f"t{j}{tag}", e.dtype)
        result = env[_key(output)]
        out_t = params[len(inputs)].dtype
        if result.dtype != out_t:
            result = K.Cast(result, out_t)
        dst: K.Expr = K.Ref("o_out", dt.i32)
        for d, c in enumerate(coords):
            if c is not None:
                dst = K.Bin("add", dst, K.Bin("mul", c, K.Ref(f"ot{d}", dt.i32)))
        stmts.append(K.Store("out", dst, result))
        return stmts

    # one dimension (n == d3: the planner merges the dimensions every operand walks alike, so a
    # contiguous chain is one): the element's index is its coordinate, no division per element
    flat = element([None] * (MAX_RANK - 1) + [K.Ref("idx", dt.i32)], "f")
    # coordinates of the output element, innermost dimension last
    general: list[K.Stmt] = []
    rest: K.Expr = K.Ref("idx", dt.i32)
    coords: list[K.Expr] = [i32(0)] * MAX_RANK
    for d in reversed(range(MAX_RANK)):
        general.append(K.Let(f"c{d}", K.Bin("rem", rest, K.Ref(f"d{d}", dt.i32))))
        coords[d] = K.Ref(f"c{d}", dt.i32)
        general.append(K.Let(f"r{d}", K.Bin("div", rest, K.Ref(f"d{d}", dt.i32))))
        rest = K.Ref(f"r{d}", dt.i32)
    general += element(coords, "")
    one_dim = K.Bin("eq", K.Ref("n", dt.i32), K.Ref(f"d{MAX_RANK - 1}", dt.i32))
    body.append(K.If(K.Bin("lt", K.Ref("idx", dt.i32), K.Ref("n", dt.i32)), (K.If(one_dim, tuple(flat), tuple(general)),)))
    k = K.Kernel(name, tuple(params), tuple(body), (block, 1, 1))
    verify_kernel(k)
    return k


def _node_expr(name: str, nd: Node, args: list[K.Expr]) -> K.Expr:
    """The expression of elementwise node ``nd`` on ``args``."""
    op = nd.op
    if op in _UN:
        return K.Un(_UN[op], args[0])
    if op == "sigmoid":
        one = K.Const(1.0, dt.f32)
        return K.Bin("div", one, K.Bin("add", one, K.Un("exp", K.Un("neg", args[0]))))
    if op in _BIN:
        return K.Bin(_BIN[op], args[0], args[1])
    if op == "where":
        return K.Select(args[0], args[1], args[2])
    if op == "cast":
        to = nd.attrs["dtype"]
        ct = _compute(to)
        e = args[0] if args[0].dtype == ct else K.Cast(args[0], ct)
        if to == dt.f16:  # round through the narrow type, as the oracle does
            e = K.Cast(K.Cast(e, dt.f16), dt.f32)
        elif to == dt.bf16:
            e = _round_bf16(e)
        return e
    if op == "constant":
        arr = nd.attrs["value"].array
        if arr.size != 1:
            raise ValueError(f"{name}: only scalar constants can be fused, got shape {arr.shape}")
        ct = _compute(nd.outputs[0].dtype)
        x = arr.reshape(-1)[0]
        return K.Const(float(x) if ct.is_float else (bool(x) if ct == dt.boolean else int(x)), ct)
    raise ValueError(f"{name}: op '{op}' is not elementwise")


def _round_bf16(e: K.Expr) -> K.Expr:
    """Round an f32 to the nearest bfloat16 (ties to even), kept in f32."""
    bits = K.Bitcast(e, dt.i32)
    lsb = K.Bin("and", K.Bin("shr", bits, K.Const(16, dt.i32)), K.Const(1, dt.i32))
    rounded = K.Bin("and", K.Bin("add", bits, K.Bin("add", K.Const(0x7FFF, dt.i32), lsb)), K.Const(-65536, dt.i32))
    return K.Bitcast(rounded, dt.f32)


def round_f16(e: K.Expr) -> K.Expr:
    """Round an f32 to the nearest IEEE half (ties to even), kept in f32, with integer and f32
    operations only (for targets without f16 values): overflow to infinity from 65520, NaN and
    infinity kept, subnormal halves by adding and removing 0.5 (whose ulp is the half's 2^-24)."""
    i = lambda v: K.Const(v, dt.i32)  # noqa: E731
    bits = K.Bitcast(e, dt.i32)
    sign = K.Bin("and", bits, i(-0x80000000))
    mag = K.Bin("and", bits, i(0x7FFFFFFF))
    lsb = K.Bin("and", K.Bin("shr", mag, i(13)), i(1))
    normal = K.Bin("or", sign, K.Bin("and", K.Bin("add", mag, K.Bin("add", i(0x0FFF), lsb)), i(~0x1FFF)))
    half = K.Const(0.5, dt.f32)
    tiny = K.Bin("or", sign, K.Bitcast(K.Bin("sub", K.Bin("add", K.Bitcast(mag, dt.f32), half), half), dt.i32))
    out = K.Select(K.Bin("ge", mag, i(0x38800000)), normal, tiny)
    out = K.Select(K.Bin("ge", mag, i(0x477FF000)), K.Bin("or", sign, i(0x7F800000)), out)
    out = K.Select(K.Bin("ge", mag, i(0x7F800000)), bits, out)
    return K.Bitcast(out, dt.f32)


def f16_bits(e: K.Expr) -> K.Expr:
    """The 16 bits (in the low half of an i32) of the IEEE half nearest an f32 (ties to even), with
    integer and f32 operations only: normals from ``round_f16``'s value re-encoded (exponent
    rebiased), subnormals as the value's count of 2^-24 steps rounded by ``rint``, infinity and NaN
    kept as such."""
    i = lambda v: K.Const(v, dt.i32)  # noqa: E731
    bits = K.Bitcast(round_f16(e), dt.i32)
    sign = K.Bin("and", K.Bin("shr", bits, i(16)), i(0x8000))
    mag = K.Bin("and", bits, i(0x7FFFFFFF))
    man = K.Bin("and", K.Bin("shr", mag, i(13)), i(0x3FF))
    normal = K.Bin("or", K.Bin("shl", K.Bin("sub", K.Bin("shr", mag, i(23)), i(112)), i(10)), man)
    # below 2^-14: the count of 2^-24 steps, rounded by rint from the value itself (scaling by 2^24 is
    # exact); round_f16's own subnormal rounding adds and removes 0.5, which a SPIR-V driver may fold
    tiny = K.Cast(K.Un("rint", K.Bin("mul", K.Un("abs", e), K.Const(16777216.0, dt.f32))), dt.i32)
    special = K.Bin("or", K.Bin("or", i(0x7C00), man), K.Select(K.Bin("gt", mag, i(0x7F800000)), i(0x200), i(0)))
    out = K.Select(K.Bin("ge", mag, i(0x38800000)), normal, tiny)
    out = K.Select(K.Bin("ge", mag, i(0x7F800000)), special, out)
    return K.Bin("or", sign, out)
