"""GraphBuilder: the one way graphs are made. Every call type-checks at once and names the op on error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import GraphError
from . import dtypes as dt
from .attention import AttentionSpec
from .dims import DimLike, as_shape
from .dtypes import DType
from .ir import ConstData, Graph, Node, Value
from .ops import infer

__all__ = ["GraphBuilder"]

Operand = Value | float | int | bool


class GraphBuilder:
    """Appends typed nodes; ``build(outputs)`` returns the Graph."""

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._names: dict[str, Node] = {}

    # -- core -----------------------------------------------------------------------------------
    def node(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Node:
        for v in inputs:
            if not isinstance(v, Value):
                raise GraphError(f"{op}: operand {v!r} is not a graph value")
        types = infer(op, [v.type for v in inputs], attrs)
        n = Node(len(self._nodes), op, tuple(inputs), dict(attrs))
        n.outputs = tuple(Value(n, i, t) for i, t in enumerate(types))
        if op in ("input", "weight"):
            name = attrs["name"]
            if name in self._names:
                raise GraphError(f"{op} '{name}' is already defined (as {self._names[name].op})")
            self._names[name] = n
        self._nodes.append(n)
        return n

    def _one(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Value:
        return self.node(op, inputs, **attrs).out

    def build(self, outputs: Mapping[str, Value]) -> Graph:
        if not outputs:
            raise GraphError("a graph needs at least one output")
        return Graph(list(self._nodes), dict(outputs))

    # -- sources --------------------------------------------------------------------------------
    def _source(self, op: str, name: str, dtype: DType | str, shape: Sequence[DimLike]) -> Value:
        return self.node(op, [], name=name, dtype=dt.dtype_of(dtype), shape=as_shape(shape)).out

    def input(self, name: str, dtype: DType | str, shape: Sequence[DimLike]) -> Value:
        """A per-step input (token ids, positions, slot map ...), bound at run time."""
        return self._source("input", name, dtype, shape)

    def weight(self, name: str, dtype: DType | str, shape: Sequence[DimLike]) -> Value:
        """A checkpoint tensor by name. Packed types keep their logical (dequantized) shape."""
        return self._source("weight", name, dtype, shape)

    def const(self, value: Any, dtype: DType | str = dt.f32) -> Value:
        dtype = dt.dtype_of(dtype)
        arr = np.asarray(value, dtype=dtype.numpy)
        if dtype == dt.bf16:
            arr = dt.round_to_bf16(arr)
        return self._one("constant", [], value=ConstData(arr), dtype=dtype)

    def iota(self, shape: Sequence[DimLike], axis: int = 0, dtype: DType | str = dt.i32) -> Value:
        return self._one("iota", [], shape=as_shape(shape), axis=axis, dtype=dt.dtype_of(dtype))

    # -- elementwise ----------------------------------------------------------------------------
    def _lift(self, x: Operand, like: Value) -> Value:
        if isinstance(x, Value):
            return x
        return self.const(x, like.dtype)

    def unary(self, op: str, x: Value) -> Value:
        return self._one(op, [x])

    def binary(self, op: str, x: Operand, y: Operand) -> Value:
        if not isinstance(x, Value) and not isinstance(y, Value):
            raise GraphError(f"{op}: at least one operand must be a graph value")
        like = x if isinstance(x, Value) else y
        return self._one(op, [self._lift(x, like), self._lift(y, like)])  # type: ignore[arg-type]

    def add(self, x: Operand, y: Operand) -> Value:
        return self.binary("add", x, y)

    def sub(self, x: Operand, y: Operand) -> Value:
        return self.binary("sub", x, y)

    def mul(self, x: Operand, y: Operand) -> Value:
        return self.binary("mul", x, y)

    def div(self, x: Operand, y: Operand) -> Value:
        return self.binary("div", x, y)

    def pow(self, x: Operand, y: Operand) -> Value:
        return self.binary("pow", x, y)

    def maximum(self, x: Operand, y: Operand) -> Value:
        return self.binary("maximum", x, y)

    def minimum(self, x: Operand, y: Operand) -> Value:
        return self.binary("minimum", x, y)

    def neg(self, x: Value) -> Value:
        return self.unary("neg", x)

    def exp(self, x: Value) -> Value:
        return self.unary("exp", x)

    def log(self, x: Value) -> Value:
        return self.unary("log", x)

    def sqrt(self, x: Value) -> Value:
        return self.unary("sqrt", x)

    def rsqrt(self, x: Value) -> Value:
        return self.unary("rsqrt", x)

    def tanh(self, x: Value) -> Value:
        return self.unary("tanh", x)

    def sigmoid(self, x: Value) -> Value:
        return self.unary("sigmoid", x)

    def where(self, cond: Value, x: Operand, y: Operand) -> Value:
        like = x if isinstance(x, Value) else y
        if not isinstance(like, Value):
            raise GraphError("where: at least one branch must be a graph value")
        return self._one("where", [cond, self._lift(x, like), self._lift(y, like)])

    def cast(self, x: Value, dtype: DType | str) -> Value:
        dtype = dt.dtype_of(dtype)
        if x.dtype == dtype:
            return x
        return self._one("cast", [x], dtype=dtype)

    # -- reductions -----------------------------------------------------------------------------
    def reduce(self, op: str, x: Value, axes: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
        axes_t = (axes,) if isinstance(axes, int) else tuple(axes)
        return self._one(op, [x], axes=axes_t, keepdims=keepdims)

    def sum(self, x: Value, axes: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
        return self.reduce("sum", x, axes, keepdims)

    def max(self, x: Value, axes: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
        return self.reduce("max", x, axes, keepdims)

    def mean(self, x: Value, axes: int | Sequence[int] = -1, keepdims: bool = False) -> Value:
        return self.reduce("mean", x, axes, keepdims)

    def argmax(self, x: Value, axis: int = -1) -> Value:
        return self._one("argmax", [x], axis=axis)

    def topk(self, x: Value, k: int, axis: int = -1) -> tuple[Value, Value]:
        """Largest ``k`` along ``axis``, in descending order (ties: lower index first)."""
        n = self.node("topk", [x], k=k, axis=axis)
        return n.outputs[0], n.outputs[1]

    # -- matmul, indexing, data movement ------------------------------------------------------------
    def matmul(self, a: Value, b: Value, transpose_b: bool = False) -> Value:
        """[..., M, K] @ [..., K, N] (or [..., N, K] with transpose_b). ``b`` may be packed-quantized."""
        return self._one("matmul", [a, b], transpose_b=transpose_b)

    def linear(self, x: Value, w: Value, bias: Value | None = None) -> Value:
        """x[..., K] @ w[N, K]ᵀ (+ bias[N]): the checkpoint layout of a projection."""
        if x.rank == 1:
            raise GraphError(f"linear: input must have rank >= 2, got {x.type}")
        y = self.matmul(x, w, transpose_b=True)
        return y if bias is None else self.add(y, self.cast(bias, y.dtype))

    def gather(self, table: Value, indices: Value, axis: int = 0, dtype: DType | str | None = None) -> Value:
        """Rows of ``table`` at ``indices``; a packed table yields dequantized rows of ``dtype`` (f32)."""
        attrs: dict[str, Any] = {"axis": axis}
        if table.dtype.is_packed:
            attrs["dtype"] = dt.dtype_of(dtype or dt.f32)
        return self._one("gather", [table, indices], **attrs)

    def reshape(self, x: Value, shape: Sequence[DimLike]) -> Value:
        return self._one("reshape", [x], shape=tuple(shape))

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        return self._one("transpose", [x], perm=tuple(perm))

    def slice(self, x: Value, axis: int, start: int, stop: int | None = None, step: int = 1) -> Value:
        return self._one("slice", [x], axis=axis, start=start, stop=stop, step=step)

    def concat(self, xs: Sequence[Value], axis: int) -> Value:
        if len(xs) == 1:
            return xs[0]
        return self._one("concat", list(xs), axis=axis)

    def expand(self, x: Value, shape: Sequence[DimLike]) -> Value:
        return self._one("expand", [x], shape=as_shape(shape))

    # -- KV cache and attention -----------------------------------------------------------------
    def rope(self, x: Value, positions: Value, inv_freq: np.ndarray, *, dim: int, layout: str = "neox", attn_factor: float = 1.0) -> Value:
        """Rotary position embedding of f32 ``x`` [T, H, D] by ``positions`` [T]: pairs of the first
        ``dim`` dims ('neox': (i, i + dim/2); 'interleaved': (2i, 2i + 1)) rotated by the angles
        ``position * inv_freq[i]``, cos and sin scaled by ``attn_factor``; dims past ``dim`` pass through."""
        inv = np.asarray(inv_freq, dtype=np.float32)
        return self._one("rope", [x, positions], inv_freq=ConstData(inv), dim=int(dim), layout=layout, attn_factor=float(attn_factor))

    def cache_write(self, pool: Value, values: Value, slots: Value) -> Value:
        """Write ``values[t]`` into ``pool`` at flat slot ``slots[t]`` (block * block_size + offset);
        a negative slot skips the row; float values are rounded to the pool's float type (nearest
        even). Returns the updated pool."""
        return self._one("cache_write", [pool, values, slots])

    def count_tokens(self, counts: Value, tokens: Value, seq_ids: Value, count_rows: Value) -> Value:
        """counts[count_rows[seq_ids[t]], tokens[t]] += 1 for each token (a row < 0 is not counted):
        the token history the sampling penalties read. Returns the updated counts."""
        return self._one("count_tokens", [counts, tokens, seq_ids, count_rows])

    def feed_tokens(self, last: Value, tokens: Value, seq_ids: Value, count_rows: Value) -> Value:
        """tokens[t], or where it is negative (not known when the step was queued: the token the
        step before sampled) ``last[count_rows[seq_ids[t]]]`` (0 for a row < 0)."""
        return self._one("feed_tokens", [last, tokens, seq_ids, count_rows])

    def keep_tokens(self, last: Value, sampled: Value, rows: Value) -> Value:
        """last[rows[r]] = sampled[r] for each row (a row < 0 is not kept): each sequence's latest
        token, which the next step may take from the device (``feed_tokens``). Returns the updated
        ``last``."""
        return self._one("keep_tokens", [last, sampled, rows])

    def sample(self, **operands: Value) -> tuple[Value, Value]:
        """Sample one token per row: operands by name (``poot.graph.ops.SAMPLE_OPERANDS``): logit
        bias, penalties from the history counts, temperature (0: greedy), allowed-token mask, top-k,
        top-p, min-p, and a counter-based Gumbel draw from (seed, step). Returns (tokens, the
        processed logits)."""
        from .ops import SAMPLE_OPERANDS

        missing = [n for n in SAMPLE_OPERANDS if n not in operands]
        if missing or len(operands) != len(SAMPLE_OPERANDS):
            raise GraphError(f"sample: operands {missing or sorted(set(operands) - set(SAMPLE_OPERANDS))} missing or unknown")
        n = self.node("sample", [operands[k] for k in SAMPLE_OPERANDS])
        return n.outputs[0], n.outputs[1]

    def logprobs(self, logits: Value, tokens: Value, n: int) -> tuple[Value, Value, Value]:
        """log_softmax of each row: the chosen token's, and the ``n`` largest (ids, values)."""
        node = self.node("logprobs", [logits, tokens], n=n)
        return node.outputs[0], node.outputs[1], node.outputs[2]

    def attention(
        self,
        q: Value,
        k: Value,
        v: Value,
        *,
        positions: Value,
        seq_ids: Value,
        ctx_lens: Value,
        block_tables: Value | None = None,
        k_shared: Value | None = None,
        causal: bool = True,
        window: int | None = None,
        softcap: float | None = None,
        scale: float | None = None,
    ) -> Value:
        """The fused attention op; see poot.graph.attention for operand layouts and masking."""
        spec = AttentionSpec(
            paged=block_tables is not None,
            causal=causal,
            window=window,
            softcap=softcap,
            scale=scale,
            k_shared=k_shared is not None,
        )
        operands = [q, k, v] + ([k_shared] if k_shared is not None else []) + [positions, seq_ids, ctx_lens]
        if block_tables is not None:
            operands.append(block_tables)
        return self._one("attention", operands, spec=spec)
