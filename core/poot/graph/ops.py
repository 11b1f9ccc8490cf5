"""The primitive op set and its type rules.

Each op is an ``OpDef``: a name, a category the planner and passes reason with, and ``infer``,
which maps operand types and attributes to result types or raises ``ShapeError`` naming the op.
Semantics are written once, as plain numpy, in poot.eval (the oracle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ShapeError
from . import dtypes as dt
from .attention import AttentionSpec, attention_operand_names
from .dims import Dim, Shape, as_dim, as_shape, numel, shape_str
from .ir import TensorType

__all__ = ["OpDef", "OPS", "UNARY", "BINARY", "COMPARE", "LOGICAL", "REDUCE", "infer", "broadcast_shapes"]

Infer = Callable[[Sequence[TensorType], Mapping[str, Any]], list[TensorType]]


@dataclass(frozen=True)
class OpDef:
    name: str
    category: str  # source | elementwise | reduction | matmul | data | index | rope | attention | cache
    infer: Infer
    pure: bool = True  # False: never removed by CSE (sources carry identity)


UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "recip", "sin", "cos", "tanh", "sigmoid", "erf", "floor")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL = ("logical_and", "logical_or", "logical_not")
REDUCE = ("sum", "max", "min", "mean")


def _fail(op: str, msg: str) -> ShapeError:
    return ShapeError(f"{op}: {msg}")


def broadcast_shapes(op: str, *shapes: Shape) -> Shape:
    """Numpy broadcasting over possibly symbolic dims (a symbol broadcasts only with 1 or itself)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    one = as_dim(1)
    for i in range(rank):
        dim = one
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == one:
                continue
            if dim == one:
                dim = d
            elif dim != d:
                raise _fail(op, f"cannot broadcast shapes {', '.join(shape_str(x) for x in shapes)} (axis {i}: {dim} vs {d})")
        out.append(dim)
    return tuple(out)


def _norm_axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise _fail(op, f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _src(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    return [TensorType(a["dtype"], as_shape(a["shape"]))]


def _const(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    arr = a["value"].array
    return [TensorType(a["dtype"], as_shape(arr.shape))]


def _unary(op: str) -> Infer:
    def f(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
        (x,) = t
        if op == "logical_not":
            if x.dtype != dt.boolean:
                raise _fail(op, f"needs a bool operand, got {x.dtype}")
        elif op in ("neg", "abs"):
            if not (x.dtype.is_float or x.dtype.is_int):
                raise _fail(op, f"needs a numeric operand, got {x.dtype}")
        elif not x.dtype.is_float:
            raise _fail(op, f"needs a float operand, got {x.dtype}")
        return [x]

    return f


def _binary(op: str) -> Infer:
    def f(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
        x, y = t
        if x.dtype != y.dtype:
            raise _fail(op, f"operand dtypes differ: {x.dtype} vs {y.dtype} (insert a cast)")
        if x.dtype.is_packed:
            raise _fail(op, "packed operands must be dequantized by matmul or gather first")
        shape = broadcast_shapes(op, x.shape, y.shape)
        if op in COMPARE:
            return [TensorType(dt.boolean, shape)]
        if op in LOGICAL:
            if x.dtype != dt.boolean:
                raise _fail(op, f"needs bool operands, got {x.dtype}")
        elif x.dtype == dt.boolean:
            raise _fail(op, "needs numeric operands, got bool")
        if op == "pow" and not x.dtype.is_float:
            raise _fail(op, f"needs float operands, got {x.dtype}")
        return [TensorType(x.dtype, shape)]

    return f


def _where(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    c, x, y = t
    if c.dtype != dt.boolean:
        raise _fail("where", f"condition must be bool, got {c.dtype}")
    if x.dtype != y.dtype:
        raise _fail("where", f"branch dtypes differ: {x.dtype} vs {y.dtype}")
    return [TensorType(x.dtype, broadcast_shapes("where", c.shape, x.shape, y.shape))]


def _cast(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    to = a["dtype"]
    if x.dtype.is_packed or to.is_packed:
        raise _fail("cast", "packed types are not cast; matmul and gather dequantize them")
    return [TensorType(to, x.shape)]


def _reduce(op: str) -> Infer:
    def f(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
        (x,) = t
        if x.dtype.is_packed or x.dtype == dt.boolean:
            raise _fail(op, f"cannot reduce {x.dtype}")
        if op == "mean" and not x.dtype.is_float:
            raise _fail(op, f"needs a float operand, got {x.dtype}")
        axes = sorted({_norm_axis(op, ax, x.rank) for ax in a["axes"]})
        if not axes:
            raise _fail(op, "needs at least one axis")
        keep = a["keepdims"]
        shape = tuple(as_dim(1) if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        return [TensorType(x.dtype, shape)]

    return f


def _argmax(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    ax = _norm_axis("argmax", a["axis"], x.rank)
    shape = tuple(d for i, d in enumerate(x.shape) if i != ax)
    return [TensorType(dt.i32, shape)]


def _topk(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    ax = _norm_axis("topk", a["axis"], x.rank)
    k = a["k"]
    n = x.shape[ax]
    if k < 1 or (n.is_static and k > n.value):
        raise _fail("topk", f"k={k} out of range for axis of size {n}")
    shape = tuple(as_dim(k) if i == ax else d for i, d in enumerate(x.shape))
    return [TensorType(x.dtype, shape), TensorType(dt.i32, shape)]


def _matmul(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    x, w = t
    tb = a["transpose_b"]
    if x.rank < 2 or w.rank < 2:
        raise _fail("matmul", f"operands need rank >= 2, got {x} and {w}")
    if not x.dtype.is_float:
        raise _fail("matmul", f"left operand must be float, got {x.dtype}")
    if w.dtype.is_packed or (w.dtype in (dt.f16, dt.bf16) and x.dtype == dt.f32 and tb):  # 16-bit weights widen in the product
        if not tb:
            raise _fail("matmul", "a packed weight is stored [N, K]: use transpose_b=True")
    elif w.dtype != x.dtype:
        raise _fail("matmul", f"operand dtypes differ: {x.dtype} vs {w.dtype}")
    k1 = x.shape[-1]
    n, k2 = (w.shape[-2], w.shape[-1]) if tb else (w.shape[-1], w.shape[-2])
    if k1 != k2:
        raise _fail("matmul", f"contraction sizes differ: {x} @ {w}{'ᵀ' if tb else ''} ({k1} vs {k2})")
    batch = broadcast_shapes("matmul", x.shape[:-2], w.shape[:-2])
    return [TensorType(x.dtype, batch + (x.shape[-2], n))]


def _gather(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    table, idx = t
    if not idx.dtype.is_int:
        raise _fail("gather", f"indices must be integers, got {idx.dtype}")
    ax = _norm_axis("gather", a["axis"], table.rank)
    if table.dtype.is_packed:
        if ax != 0 or table.rank != 2:
            raise _fail("gather", "a packed table gathers whole rows: rank 2, axis 0")
        out_dtype = a.get("dtype") or dt.f32
    else:
        out_dtype = table.dtype
    return [TensorType(out_dtype, table.shape[:ax] + idx.shape + table.shape[ax + 1 :])]


def _reshape(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    target = list(a["shape"])
    total = numel(x.shape)
    holes = [i for i, d in enumerate(target) if isinstance(d, int) and d == -1]
    if len(holes) > 1:
        raise _fail("reshape", "at most one -1 in the target shape")
    if holes:
        known = numel(tuple(as_dim(d) for i, d in enumerate(target) if i != holes[0]))
        rest = total.exact_div(known)
        if rest is None:
            raise _fail("reshape", f"cannot infer -1: {shape_str(x.shape)} has {total} elements, not a multiple of {known}")
        target[holes[0]] = rest
    shape = as_shape(target)
    if numel(shape) != total:
        raise _fail("reshape", f"{shape_str(x.shape)} ({total} elements) cannot become {shape_str(shape)} ({numel(shape)})")
    return [TensorType(x.dtype, shape)]


def _transpose(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    perm = a["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise _fail("transpose", f"perm {perm} is not a permutation of {x.rank} axes")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


def _slice(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    ax = _norm_axis("slice", a["axis"], x.rank)
    start, stop, step = a["start"], a["stop"], a["step"]
    n = x.shape[ax]
    if step < 1 or start < 0:
        raise _fail("slice", f"needs start >= 0 and step >= 1, got start={start} step={step}")
    if stop is None:
        length = n - start
        if step != 1:
            if not n.is_static:
                raise _fail("slice", "a strided slice to the end of a symbolic axis has no static length")
            length = as_dim(len(range(start, n.value, step)))
    else:
        if n.is_static and stop > n.value:
            raise _fail("slice", f"stop {stop} past axis {ax} of size {n}")
        if stop < start:
            raise _fail("slice", f"stop {stop} < start {start}")
        length = as_dim(len(range(start, stop, step)))
    return [TensorType(x.dtype, x.shape[:ax] + (length,) + x.shape[ax + 1 :])]


def _concat(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    if not t:
        raise _fail("concat", "needs at least one operand")
    first = t[0]
    ax = _norm_axis("concat", a["axis"], first.rank)
    total = as_dim(0)
    for x in t:
        if x.dtype != first.dtype or x.rank != first.rank:
            raise _fail("concat", f"operands differ: {first} vs {x}")
        for i in range(first.rank):
            if i != ax and x.shape[i] != first.shape[i]:
                raise _fail("concat", f"operands differ off the concat axis {ax}: {first} vs {x}")
        total = total + x.shape[ax]
    return [TensorType(first.dtype, first.shape[:ax] + (total,) + first.shape[ax + 1 :])]


def _expand(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    (x,) = t
    shape = as_shape(a["shape"])
    if broadcast_shapes("expand", x.shape, shape) != shape:
        raise _fail("expand", f"{x} does not broadcast to {shape_str(shape)}")
    return [TensorType(x.dtype, shape)]


def _iota(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    shape = as_shape(a["shape"])
    _norm_axis("iota", a["axis"], len(shape))
    return [TensorType(a["dtype"], shape)]


def _cache_write(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    pool, new, slots = t
    if pool.rank < 3:
        raise _fail("cache_write", f"pool must be [blocks, block_size, ...], got {pool}")
    if slots.rank != 1 or not slots.dtype.is_int:
        raise _fail("cache_write", f"slot map must be a 1-D int tensor, got {slots}")
    if new.dtype != pool.dtype and not (new.dtype.is_float and pool.dtype.is_float):
        raise _fail("cache_write", f"values {new.dtype} differ from pool {pool.dtype}")  # floats convert to the pool's type as written
    if new.shape[1:] != pool.shape[2:] or new.shape[0] != slots.shape[0]:
        raise _fail("cache_write", f"values {new} do not fit pool {pool} with slot map {slots}")
    return [pool]


def _rope(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    x, pos = t
    if x.rank != 3 or x.dtype != dt.f32:
        raise _fail("rope", f"rotates f32 [tokens, heads, head_dim] values, got {x}")
    if pos.rank != 1 or pos.dtype != dt.i32 or pos.shape[0] != x.shape[0]:
        raise _fail("rope", f"positions must be an i32 [tokens] tensor matching {x}, got {pos}")
    dim, head = a["dim"], x.shape[2]
    if dim <= 0 or dim % 2 or not head.is_static or dim > head.value:
        raise _fail("rope", f"rotary dim {dim} must be even and at most the head width {head}")
    if a["layout"] not in ("neox", "interleaved"):
        raise _fail("rope", f"layout must be 'neox' or 'interleaved', got {a['layout']!r}")
    if a["inv_freq"].array.shape != (dim // 2,):
        raise _fail("rope", f"inv_freq must hold dim/2 = {dim // 2} frequencies, got shape {a['inv_freq'].array.shape}")
    return [x]


def _attention(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    spec: AttentionSpec = a["spec"]
    names = attention_operand_names(spec)
    if len(t) != len(names):
        raise _fail("attention", f"expects operands {names}, got {len(t)}")
    ops = dict(zip(names, t))
    q, k, v = ops["q"], ops["k"], ops["v"]
    for name in ("positions", "seq_ids", "ctx_lens"):
        x = ops[name]
        if x.rank != 1 or not x.dtype.is_int:
            raise _fail("attention", f"{name} must be a 1-D int tensor, got {x}")
    if ops["positions"].shape != ops["seq_ids"].shape or ops["positions"].shape[0] != q.shape[0]:
        raise _fail("attention", f"positions/seq_ids must be [T] for q {q}")
    if q.rank != 3 or k.rank != 4 or v.rank != 4:
        raise _fail("attention", f"q must be [T, Hq, Dq] and k, v rank 4, got {q}, {k}, {v}")
    if not q.dtype.is_float or k.dtype != v.dtype or not k.dtype.is_float:
        raise _fail("attention", f"q, k, v must be float and k, v alike, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:3] != v.shape[:3]:
        raise _fail("attention", f"k {k} and v {v} differ before the head width")
    hq, hkv = q.shape[1], k.shape[2]
    if hq.is_static and hkv.is_static and hq.value % hkv.value:
        raise _fail("attention", f"{hq} query heads are not a multiple of {hkv} KV heads")
    dk = k.shape[3]
    if spec.k_shared:
        ks = ops["k_shared"]
        if ks.rank != 3 or ks.shape[:2] != k.shape[:2] or ks.dtype != k.dtype:
            raise _fail("attention", f"k_shared must be {k.dtype}[{k.shape[0]}, {k.shape[1]}, Dr], got {ks}")
        dk = dk + ks.shape[2]
    if q.shape[2] != dk:
        raise _fail("attention", f"query head width {q.shape[2]} != key head width {dk}")
    ctx = ops["ctx_lens"]
    if spec.paged:
        bt = ops["block_tables"]
        if bt.rank != 2 or not bt.dtype.is_int or bt.shape[0] != ctx.shape[0]:
            raise _fail("attention", f"block_tables must be int [B, max_blocks] with B = len(ctx_lens), got {bt}")
    elif k.shape[0] != ctx.shape[0]:
        raise _fail("attention", f"dense k {k} must have one row per sequence of ctx_lens {ctx}")
    return [TensorType(q.dtype, (q.shape[0], hq, v.shape[3]))]


SAMPLE_OPERANDS = (
    "logits",
    "counts",
    "count_rows",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition",
    "presence",
    "frequency",
    "seeds",
    "steps",
    "mask",
    "bias_ids",
    "bias_vals",
)
_SAMPLE_INT = {"counts", "count_rows", "top_k", "seeds", "steps", "mask", "bias_ids"}


def _count_tokens(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    counts, tokens, seq_ids, count_rows = t
    if counts.rank != 2 or counts.dtype != dt.i32:
        raise _fail("count_tokens", f"counts must be i32 [rows, vocab], got {counts}")
    for name, v in (("tokens", tokens), ("seq_ids", seq_ids), ("count_rows", count_rows)):
        if v.rank != 1 or not v.dtype.is_int:
            raise _fail("count_tokens", f"{name} must be a 1-D int tensor, got {v}")
    if tokens.shape[0] != seq_ids.shape[0]:
        raise _fail("count_tokens", f"tokens {tokens} and seq_ids {seq_ids} differ in length")
    return [counts]


def _feed_tokens(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    last, tokens, seq_ids, count_rows = t
    for name, v in (("last", last), ("tokens", tokens), ("seq_ids", seq_ids), ("count_rows", count_rows)):
        if v.rank != 1 or v.dtype != dt.i32:
            raise _fail("feed_tokens", f"{name} must be a 1-D i32 tensor, got {v}")
    if tokens.shape[0] != seq_ids.shape[0]:
        raise _fail("feed_tokens", f"tokens {tokens} and seq_ids {seq_ids} differ in length")
    return [tokens]


def _keep_tokens(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    last, sampled, rows = t
    for name, v in (("last", last), ("sampled", sampled), ("rows", rows)):
        if v.rank != 1 or v.dtype != dt.i32:
            raise _fail("keep_tokens", f"{name} must be a 1-D i32 tensor, got {v}")
    if sampled.shape[0] != rows.shape[0]:
        raise _fail("keep_tokens", f"sampled {sampled} and rows {rows} differ in length")
    return [last]


def _sample(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    if len(t) != len(SAMPLE_OPERANDS):
        raise _fail("sample", f"takes {len(SAMPLE_OPERANDS)} operands ({', '.join(SAMPLE_OPERANDS)}), got {len(t)}")
    ops = dict(zip(SAMPLE_OPERANDS, t))
    logits = ops["logits"]
    if logits.rank != 2 or logits.dtype != dt.f32:
        raise _fail("sample", f"logits must be f32 [rows, vocab], got {logits}")
    rows, vocab = logits.shape
    for name, v in ops.items():
        want = dt.i32 if name in _SAMPLE_INT else dt.f32
        if v.dtype != want:
            raise _fail("sample", f"{name} must be {want}, got {v}")
        if name in ("mask", "bias_ids", "bias_vals"):
            if v.rank != 2 or v.shape[0] != rows:
                raise _fail("sample", f"{name} must be [rows, n], got {v}")
        elif name == "counts":
            if v.rank != 2 or v.shape[1] != vocab:
                raise _fail("sample", f"counts must be [history rows, vocab], got {v}")
        elif name != "logits" and (v.rank != 1 or v.shape[0] != rows):
            raise _fail("sample", f"{name} must be [rows], got {v}")
    if ops["bias_ids"].shape != ops["bias_vals"].shape:
        raise _fail("sample", f"bias_ids {ops['bias_ids']} and bias_vals {ops['bias_vals']} differ")
    if vocab.is_static and ops["mask"].shape[1].is_static and ops["mask"].shape[1].value * 32 < vocab.value:
        raise _fail("sample", f"mask {ops['mask']} has fewer than vocab / 32 words")
    return [TensorType(dt.i32, (rows,)), TensorType(dt.f32, (rows, vocab))]


def _logprobs(t: Sequence[TensorType], a: Mapping[str, Any]) -> list[TensorType]:
    logits, tokens = t
    n = a["n"]
    if logits.rank != 2 or logits.dtype != dt.f32 or tokens.rank != 1 or tokens.dtype != dt.i32 or tokens.shape[0] != logits.shape[0]:
        raise _fail("logprobs", f"wants f32 [rows, vocab] logits and i32 [rows] tokens, got {logits} and {tokens}")
    if n < 1 or (logits.shape[1].is_static and n > logits.shape[1].value):
        raise _fail("logprobs", f"n={n} out of range")
    rows = logits.shape[0]
    return [TensorType(dt.f32, (rows,)), TensorType(dt.i32, (rows, as_dim(n))), TensorType(dt.f32, (rows, as_dim(n)))]


OPS: dict[str, OpDef] = {}


def _def(name: str, category: str, f: Infer, pure: bool = True) -> None:
    OPS[name] = OpDef(name, category, f, pure)


_def("input", "source", _src, pure=False)
_def("weight", "source", _src, pure=False)
_def("constant", "source", _const)
for _n in UNARY + ("logical_not",):
    _def(_n, "elementwise", _unary(_n))
for _n in BINARY + COMPARE + ("logical_and", "logical_or"):
    _def(_n, "elementwise", _binary(_n))
_def("where", "elementwise", _where)
_def("cast", "elementwise", _cast)
for _n in REDUCE:
    _def(_n, "reduction", _reduce(_n))
_def("argmax", "reduction", _argmax)
_def("topk", "reduction", _topk)
_def("matmul", "matmul", _matmul)
_def("gather", "index", _gather)
_def("reshape", "data", _reshape)
_def("transpose", "data", _transpose)
_def("slice", "data", _slice)
_def("concat", "data", _concat)
_def("expand", "data", _expand)
_def("iota", "source", _iota)
_def("cache_write", "cache", _cache_write)
_def("rope", "rope", _rope)
_def("attention", "attention", _attention)
_def("count_tokens", "cache", _count_tokens)
_def("feed_tokens", "index", _feed_tokens)
_def("keep_tokens", "cache", _keep_tokens)
_def("sample", "sampling", _sample)
_def("logprobs", "sampling", _logprobs)


def infer(op: str, types: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
    """Result types of ``op`` on operands of ``types``; raises ShapeError naming the op."""
    if op not in OPS:
        raise ShapeError(f"unknown op '{op}' (known: {', '.join(sorted(OPS))})")
    return OPS[op].infer(types, attrs)
