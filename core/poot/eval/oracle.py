"""The CPU oracle: every primitive op as plain numpy, and a graph interpreter over them.

Numerics: float ops compute in float32 (float64 in float64 mode) and round the result to the op's
declared dtype (f16 through numpy's float16, bf16 by round-to-nearest-even held in float32). In
float64 mode every float value is held in float64 and casts between float types do not round.
Integer division truncates toward zero (C semantics, as kernels do). Out-of-range indices are an
``EvalError`` naming the node, not a wrapped read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import PootError
from ..graph import dtypes as dt
from ..graph.dims import Dim, Shape
from ..graph.dtypes import DType
from ..graph.ir import Graph, Node
from .attention import attention_reference

__all__ = ["EvalError", "evaluate", "Oracle"]


class EvalError(PootError):
    """The oracle could not evaluate a graph on the given inputs (missing input, bad shape, bad index)."""


_erf = np.frompyfunc(math.erf, 1, 1)

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "recip": lambda x: 1 / x,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": lambda x: _erf(x).astype(x.dtype),
    "floor": np.floor,
    "logical_not": np.logical_not,
}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}

_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


class Oracle:
    """Evaluates graphs. ``float64=True`` holds every float in float64."""

    def __init__(self, float64: bool = False, quantizations: Mapping[str, Any] | None = None) -> None:
        self.float64 = float64
        self.compute = np.float64 if float64 else np.float32
        self._quants = quantizations

    # -- value representation ---------------------------------------------------------------------
    def holder(self, dtype: DType) -> np.dtype:
        if dtype.is_float and self.float64:
            return np.dtype(np.float64)
        return dtype.numpy

    def store(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        """Round ``x`` to ``dtype`` and hold it in that dtype's holder."""
        if dtype.is_float:
            if self.float64:
                return np.asarray(x, dtype=np.float64)
            if dtype == dt.bf16:
                return dt.round_to_bf16(np.asarray(x, dtype=np.float32))
            return np.asarray(x, dtype=dtype.numpy)
        return np.asarray(x).astype(dtype.numpy)

    def widen(self, x: np.ndarray) -> np.ndarray:
        """Floats as the compute type; everything else unchanged."""
        if x.dtype.kind == "f":
            return x.astype(self.compute, copy=False)
        return x

    def quant(self, name: str) -> Any:
        if self._quants is None:
            from ..quant import quantizations

            self._quants = quantizations()
        if name not in self._quants:
            raise EvalError(f"no dequantizer for packed type '{name}' (known: {', '.join(sorted(self._quants))})")
        return self._quants[name]

    def dequantize(self, raw: np.ndarray, dtype: DType, shape: tuple[int, ...], what: str) -> np.ndarray:
        q = self.quant(dtype.name)
        try:
            want = q.packed_shape(shape)
        except ValueError as e:
            raise EvalError(f"{what}: {e}") from None
        if tuple(raw.shape) != want or raw.dtype != np.uint8:
            raise EvalError(f"{what}: packed {dtype.name} data of logical shape {list(shape)} must be uint8{list(want)}, got {raw.dtype}{list(raw.shape)}")
        return self.widen(q.dequantize(raw))

    # -- graph interpretation ---------------------------------------------------------------------
    def run(self, graph: Graph, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        weights = weights or {}
        env: dict[tuple[int, int], np.ndarray] = {}
        bindings = self._bind(graph, inputs, weights)
        for node in graph.nodes:
            args = [env[(v.node.id, v.index)] for v in node.inputs]
            try:
                results = self.op(node, args, inputs, weights, bindings)
            except EvalError:
                raise
            except (IndexError, ValueError, KeyError) as e:
                raise EvalError(f"node %{node.id} ({node.op}): {e}") from None
            for v, r in zip(node.outputs, results):
                env[(node.id, v.index)] = r
        return {name: env[(v.node.id, v.index)] for name, v in graph.outputs.items()}

    def _bind(self, graph: Graph, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Solve symbolic dims from the shapes of the given inputs, then check every source fits."""
        bindings: dict[str, int] = {}
        sources = [(n, inputs if n.op == "input" else weights) for n in graph.nodes if n.op in ("input", "weight")]
        for n, table in sources:
            name = n.attrs["name"]
            if name not in table:
                raise EvalError(f"missing {n.op} '{name}' ({n.out.type})")
            arr = np.asarray(table[name])
            if n.out.dtype.is_packed:
                continue
            if arr.ndim != n.out.rank:
                raise EvalError(f"{n.op} '{name}' must have rank {n.out.rank} ({n.out.type}), got shape {arr.shape}")
            for d, size in zip(n.out.shape, arr.shape):
                if len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1:
                    s = d.terms[0][0][0]
                    if bindings.setdefault(s, size) != size:
                        raise EvalError(f"{n.op} '{name}': symbol {s} is {bindings[s]} elsewhere but {size} here")
        for n, table in sources:
            if n.out.dtype.is_packed:
                continue
            arr = np.asarray(table[n.attrs["name"]])
            try:
                want = tuple(d.evaluate(bindings) for d in n.out.shape)
            except KeyError as e:
                raise EvalError(f"{n.op} '{n.attrs['name']}': {e.args[0]}") from None
            if arr.shape != want:
                raise EvalError(f"{n.op} '{n.attrs['name']}' must have shape {list(want)}, got {list(arr.shape)}")
        return bindings

    def _shape(self, shape: Shape, bindings: Mapping[str, int]) -> tuple[int, ...]:
        try:
            return tuple(Dim.evaluate(d, bindings) for d in shape)
        except KeyError as e:
            raise EvalError(str(e.args[0])) from None

    def op(
        self, node: Node, args: list[np.ndarray], inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], bindings: Mapping[str, int]
    ) -> list[np.ndarray]:
        op, a = node.op, node.attrs
        out_t = node.outputs[0].type
        if op in ("input", "weight"):
            table = inputs if op == "input" else weights
            arr = np.asarray(table[a["name"]])
            if out_t.dtype.is_packed:
                return [self.dequantize(arr, out_t.dtype, self._shape(out_t.shape, bindings), f"{op} '{a['name']}'")]
            if out_t.dtype.is_float:
                return [self.store(arr, out_t.dtype)]
            if arr.dtype != out_t.dtype.numpy:
                raise EvalError(f"{op} '{a['name']}' must be {out_t.dtype}, got numpy {arr.dtype}")
            return [arr]
        if op == "constant":
            return [self.store(a["value"].array, out_t.dtype)]
        if op == "iota":
            shape = self._shape(out_t.shape, bindings)
            ax = a["axis"] % len(shape)
            r = np.arange(shape[ax]).reshape([-1 if i == ax else 1 for i in range(len(shape))])
            return [self.store(np.broadcast_to(r, shape), out_t.dtype)]
        if op in _UNARY:
            with np.errstate(all="ignore"):
                return [self.store(_UNARY[op](self.widen(args[0])), out_t.dtype)]
        if op in _BINARY:
            x, y = self.widen(args[0]), self.widen(args[1])
            with np.errstate(all="ignore"):
                if op == "div" and x.dtype.kind in "iu":
                    if np.any(y == 0):
                        raise EvalError(f"node %{node.id} (div): integer division by zero")
                    r = _int_div(x, y)
                else:
                    r = _BINARY[op](x, y)
            return [self.store(r, out_t.dtype)]
        if op == "where":
            return [self.store(np.where(args[0], self.widen(args[1]), self.widen(args[2])), out_t.dtype)]
        if op == "cast":
            x = args[0]
            if out_t.dtype.is_int and x.dtype.kind == "f":
                x = np.trunc(x)
            return [self.store(self.widen(x), out_t.dtype)]
        if op in _REDUCE:
            return [self.store(_REDUCE[op](self.widen(args[0]), axis=tuple(a["axes"]), keepdims=a["keepdims"]), out_t.dtype)]
        if op == "argmax":
            return [np.argmax(args[0], axis=a["axis"]).astype(np.int32)]
        if op == "topk":
            x = args[0]
            ax = a["axis"] % x.ndim
            order = np.argsort(-self.widen(x), axis=ax, kind="stable")
            idx = np.take(order, np.arange(a["k"]), axis=ax)
            return [np.take_along_axis(x, idx, axis=ax), idx.astype(np.int32)]
        if op == "matmul":
            x, w = self.widen(args[0]), self.widen(args[1])
            if a["transpose_b"]:
                w = np.swapaxes(w, -1, -2)
            return [self.store(np.matmul(x, w), out_t.dtype)]
        if op == "gather":
            table, idx = args
            ax = a["axis"] % table.ndim
            n = table.shape[ax]
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise EvalError(f"node %{node.id} (gather): index {int(idx.min() if idx.min() < 0 else idx.max())} outside 0..{n - 1}")
            return [self.store(np.take(table, idx, axis=ax), out_t.dtype)]
        if op == "reshape":
            return [args[0].reshape(self._shape(out_t.shape, bindings))]
        if op == "transpose":
            return [np.ascontiguousarray(np.transpose(args[0], a["perm"]))]
        if op == "slice":
            ax = a["axis"] % args[0].ndim
            sl = [slice(None)] * args[0].ndim
            sl[ax] = slice(a["start"], a["stop"], a["step"])
            return [args[0][tuple(sl)]]
        if op == "concat":
            return [np.concatenate(args, axis=a["axis"])]
        if op == "expand":
            return [np.ascontiguousarray(np.broadcast_to(args[0], self._shape(out_t.shape, bindings)))]
        if op == "cache_write":
            pool, vals, slots = args
            out = pool.copy()
            flat = out.reshape((-1,) + out.shape[2:])
            for t, s in enumerate(slots.tolist()):
                if s < 0:
                    continue
                if s >= flat.shape[0]:
                    raise EvalError(f"node %{node.id} (cache_write): slot {s} of token {t} past the pool's {flat.shape[0]} slots")
                flat[s] = vals[t]
            return [out]
        if op == "rope":
            return [self._rope(args[0], args[1], a)]
        if op == "attention":
            return [self._attention(node, args, out_t.dtype)]
        if op == "count_tokens":
            counts, tokens, seq_ids, rows = args
            out = counts.copy()
            for tok, s in zip(tokens.tolist(), seq_ids.tolist()):
                r = int(rows[s])
                if r >= 0 and 0 <= tok < out.shape[1]:
                    out[r, tok] += 1
            return [out]
        if op == "feed_tokens":
            last, tokens, seq_ids, rows = args
            fed = tokens.copy()
            for t in np.flatnonzero(tokens < 0):
                r = int(rows[seq_ids[t]])
                fed[t] = last[r] if r >= 0 else 0
            return [fed]
        if op == "keep_tokens":
            last, sampled, rows = args
            out = last.copy()
            for tok, r in zip(sampled.tolist(), rows.tolist()):
                if r >= 0:
                    out[r] = tok
            return [out]
        if op == "sample":
            from ..graph.ops import SAMPLE_OPERANDS
            from .sampling import sample_reference

            o = dict(zip(SAMPLE_OPERANDS, args))
            rows = o.pop("count_rows")
            pool = o.pop("counts")
            o["counts"] = np.where(rows[:, None] >= 0, pool[np.maximum(rows, 0)], 0).astype(np.int32)
            tokens = sample_reference(**o)
            return [tokens, self._processed_logits(o)]
        if op == "logprobs":
            from .sampling import logprobs_reference

            return list(logprobs_reference(args[0], args[1], a["n"]))
        raise EvalError(f"the oracle has no rule for op '{op}'")

    def _rope(self, x: np.ndarray, positions: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
        """Each step rounded to f32 as a kernel computes it: angle = position * inv_freq, cos and sin
        (times the attention factor), then x1 cos - x2 sin and x2 cos + x1 sin."""
        f = lambda v: self.store(v, dt.f32)  # noqa: E731
        dim, half = a["dim"], a["dim"] // 2
        x = self.widen(x)
        ang = f(self.widen(f(positions.astype(np.float64)))[:, None] * self.widen(f(a["inv_freq"].array))[None, :])
        cos, sin = f(np.cos(ang)), f(np.sin(ang))
        if a["attn_factor"] != 1.0:  # a kernel's f32 scalar
            af = self.widen(np.asarray(np.float32(a["attn_factor"])))
            cos, sin = f(cos * af), f(sin * af)
        cos, sin = cos[:, None, :], sin[:, None, :]
        out = x.copy()
        if a["layout"] == "neox":
            i1, i2 = np.arange(half), np.arange(half, dim)
        else:
            i1, i2 = np.arange(0, dim, 2), np.arange(1, dim, 2)
        x1, x2 = x[..., i1], x[..., i2]
        out[..., i1] = f(f(x1 * cos) - f(x2 * sin))
        out[..., i2] = f(f(x2 * cos) + f(x1 * sin))
        return f(out)

    @staticmethod
    def _processed_logits(o: dict[str, np.ndarray]) -> np.ndarray:
        """The sample op's second output: logits after bias, penalties, temperature and mask."""
        from .sampling import MASKED

        z = o["logits"].astype(np.float32).copy()
        rows, vocab = z.shape
        for r in range(rows):
            for bid, bv in zip(o["bias_ids"][r].tolist(), o["bias_vals"][r]):
                if 0 <= bid < vocab:
                    z[r, bid] = z[r, bid] + np.float32(bv)
            c = o["counts"][r]
            seen = c > 0
            rep = np.float32(o["repetition"][r])
            z[r, seen] = np.where(z[r, seen] > 0, z[r, seen] / rep, z[r, seen] * rep)
            z[r, seen] = z[r, seen] - np.float32(o["presence"][r]) - np.float32(o["frequency"][r]) * c[seen].astype(np.float32)
            if o["temperature"][r] > 0:
                z[r] = z[r] / np.float32(o["temperature"][r])
            bits = (o["mask"][r].view(np.uint32)[np.arange(vocab) >> 5] >> (np.arange(vocab) & 31).astype(np.uint32)) & 1
            z[r, bits == 0] = MASKED
        return z

    def _attention(self, node: Node, args: list[np.ndarray], dtype: DType) -> np.ndarray:
        from ..graph.attention import attention_operand_names

        spec = node.attrs["spec"]
        ops = dict(zip(attention_operand_names(spec), args))
        r = attention_reference(
            spec,
            ops["q"],
            ops["k"],
            ops["v"],
            ops["positions"],
            ops["seq_ids"],
            ops["ctx_lens"],
            block_tables=ops.get("block_tables"),
            k_shared=ops.get("k_shared"),
            compute=self.compute,
        )
        return self.store(r, dtype)


def evaluate(
    graph: Graph,
    inputs: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray] | None = None,
    *,
    float64: bool = False,
) -> dict[str, np.ndarray]:
    """Run ``graph`` on numpy ``inputs`` and ``weights`` (packed weights as their uint8 storage)."""
    return Oracle(float64=float64).run(graph, inputs, weights)
