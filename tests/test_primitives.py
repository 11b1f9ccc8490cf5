"""Every primitive op in the oracle against a numpy formula written here, on fresh random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from poot.errors import ShapeError
from poot.eval import EvalError, evaluate
from poot.graph import GraphBuilder, sym

T = sym("tokens")

UNARY_REF = {
    "neg": lambda x: -x,
    "abs": np.abs,
    "exp": np.exp,
    "log": lambda x: np.log(x),
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "recip": lambda x: 1.0 / x,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: np.exp(-np.logaddexp(0, -x)),
    "erf": lambda x: np.vectorize(math.erf)(x.astype(np.float64)),
    "floor": np.floor,
}
POSITIVE = {"log", "sqrt", "rsqrt"}


def run1(build, inputs, weights=None, float64=False):
    b = GraphBuilder()
    out = build(b)
    g = b.build(out if isinstance(out, dict) else {"y": out})
    res = evaluate(g, inputs, weights or {}, float64=float64)
    return res if isinstance(out, dict) else res["y"]


@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary(op, rng):
    n = int(rng.integers(3, 9))
    x = rng.standard_normal((n, 5)).astype(np.float32)
    if op in POSITIVE:
        x = np.abs(x) + 0.1
    if op == "recip":
        x = np.where(np.abs(x) < 0.1, 0.5, x).astype(np.float32)
    y = run1(lambda b: b.unary(op, b.input("x", "f32", [T, 5])), {"x": x})
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, UNARY_REF[op](x.astype(np.float64)), rtol=2e-6, atol=2e-6)
    y64 = run1(lambda b: b.unary(op, b.input("x", "f32", [T, 5])), {"x": x}, float64=True)
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, UNARY_REF[op](x.astype(np.float64)), rtol=1e-12, atol=1e-12)


BINARY_REF = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": lambda a, b: np.abs(a) ** b,
}


@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_broadcasting(op, rng):
    n = int(rng.integers(2, 7))
    a = rng.standard_normal((n, 1, 4)).astype(np.float32)
    c = rng.standard_normal((3, 1)).astype(np.float32)
    if op == "pow":
        a = np.abs(a)
    if op == "div":
        c = np.where(np.abs(c) < 0.1, 0.7, c).astype(np.float32)
    y = run1(lambda b: b.binary(op, b.input("a", "f32", [T, 1, 4]), b.input("c", "f32", [3, 1])), {"a": a, "c": c})
    assert y.shape == (n, 3, 4)
    np.testing.assert_allclose(y, BINARY_REF[op](a.astype(np.float64), c.astype(np.float64)), rtol=3e-6, atol=1e-6)


@pytest.mark.parametrize(
    "op,ref", [("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)]
)
def test_compare(op, ref, rng):
    a = rng.integers(-3, 3, size=(6, 4)).astype(np.int32)
    c = rng.integers(-3, 3, size=(4,)).astype(np.int32)
    y = run1(lambda b: b.binary(op, b.input("a", "i32", [6, 4]), b.input("c", "i32", [4])), {"a": a, "c": c})
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, ref(a, c))


def test_logical_and_where(rng):
    a, c = rng.random((5, 3)) > 0.5, rng.random((5, 3)) > 0.5
    x, z = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3,)).astype(np.float32)

    def build(b):
        ba, bc = b.input("a", "bool", [5, 3]), b.input("c", "bool", [5, 3])
        return {
            "and": b.binary("logical_and", ba, bc),
            "or": b.binary("logical_or", ba, bc),
            "not": b.unary("logical_not", ba),
            "where": b.where(ba, b.input("x", "f32", [5, 3]), b.input("z", "f32", [3])),
        }

    r = run1(build, {"a": a, "c": c, "x": x, "z": z})
    np.testing.assert_array_equal(r["and"], a & c)
    np.testing.assert_array_equal(r["or"], a | c)
    np.testing.assert_array_equal(r["not"], ~a)
    np.testing.assert_array_equal(r["where"], np.where(a, x, z))


def test_integer_division_truncates(rng):
    a = rng.integers(-50, 50, size=(40,)).astype(np.int32)
    c = rng.choice([-7, -3, 2, 5], size=(40,)).astype(np.int32)
    y = run1(lambda b: b.div(b.input("a", "i32", [40]), b.input("c", "i32", [40])), {"a": a, "c": c})
    np.testing.assert_array_equal(y, [int(p / q) for p, q in zip(a.tolist(), c.tolist())])


def test_integer_division_by_zero_is_an_error():
    with pytest.raises(EvalError, match="division by zero"):
        run1(lambda b: b.div(b.input("a", "i32", [2]), b.input("c", "i32", [2])), {"a": np.array([1, 2], np.int32), "c": np.array([1, 0], np.int32)})


@pytest.mark.parametrize("to", ["f16", "bf16", "i32", "f32"])
def test_cast(to, rng):
    x = (rng.standard_normal((7, 3)) * 50).astype(np.float32)
    y = run1(lambda b: b.cast(b.cast(b.input("x", "f32", [7, 3]), to), "f32"), {"x": x})
    if to == "f16":
        ref = x.astype(np.float16).astype(np.float32)
    elif to == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        ref = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    elif to == "i32":
        ref = np.trunc(x)
    else:
        ref = x
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("op,ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean)])
@pytest.mark.parametrize("axes,keep", [((-1,), False), ((0, 2), True), ((1,), True)])
def test_reductions(op, ref, axes, keep, rng):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    y = run1(lambda b: b.reduce(op, b.input("x", "f32", [4, 5, 6]), axes, keep), {"x": x})
    np.testing.assert_allclose(y, ref(x.astype(np.float64), axis=axes, keepdims=keep), rtol=1e-5, atol=1e-5)


def test_argmax_and_topk(rng):
    x = rng.standard_normal((6, 50)).astype(np.float32)
    x[0, 3] = x[0, 9] = x[0].max() + 1  # a tie: the lower index wins
    r = run1(lambda b: dict(zip(("v", "i"), b.topk(b.input("x", "f32", [6, 50]), 5))) | {"a": b.argmax(b.input("x2", "f32", [6, 50]))}, {"x": x, "x2": x})
    order = [sorted(range(50), key=lambda j: (-x[t, j], j))[:5] for t in range(6)]
    np.testing.assert_array_equal(r["i"], order)
    np.testing.assert_array_equal(r["v"], np.take_along_axis(x, np.array(order), 1))
    np.testing.assert_array_equal(r["a"], [o[0] for o in order])
    assert r["i"].dtype == np.int32 and r["a"].dtype == np.int32


@pytest.mark.parametrize("tb", [False, True])
def test_matmul_batched(tb, rng):
    a = rng.standard_normal((3, 1, 5, 8)).astype(np.float32)
    w = rng.standard_normal((2, 6, 8) if tb else (2, 8, 6)).astype(np.float32)
    y = run1(lambda b: b.matmul(b.input("a", "f32", [3, 1, 5, 8]), b.weight("w", "f32", list(w.shape)), transpose_b=tb), {"a": a}, {"w": w})
    assert y.shape == (3, 2, 5, 6)
    wt = w.transpose(0, 2, 1) if tb else w
    ref = np.einsum("xmk,ekn->xemn", a[:, 0].astype(np.float64), wt.astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_matmul_with_packed_weight(quant, rng):
    from poot.quant import quantization

    q = quantization(quant)
    w = rng.standard_normal((12, 64)).astype(np.float32)
    raw = q.quantize(w)
    assert raw.shape == (12, q.row_bytes(64))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    y = run1(lambda b: b.linear(b.input("x", "f32", [T, 64]), b.weight("w", quant, [12, 64])), {"x": x}, {"w": raw})
    np.testing.assert_allclose(y, x.astype(np.float64) @ q.dequantize(raw).astype(np.float64).T, rtol=1e-4, atol=1e-4)
    # quantization error is bounded, so the product is close to the unquantized one too
    assert np.abs(y - x @ w.T).max() < (0.5 if quant == "q4_0" else 0.1) * np.abs(x @ w.T).max()


def test_gather_rows_and_packed_embedding(rng):
    from poot.quant import quantization

    table = rng.standard_normal((10, 32)).astype(np.float32)
    idx = rng.integers(0, 10, size=(7,)).astype(np.int32)
    raw = quantization("q8_0").quantize(table)

    def build(b):
        ids = b.input("ids", "i32", [T])
        return {"plain": b.gather(b.weight("t", "f32", [10, 32]), ids), "packed": b.gather(b.weight("tq", "q8_0", [10, 32]), ids)}

    r = run1(build, {"ids": idx}, {"t": table, "tq": raw})
    np.testing.assert_array_equal(r["plain"], table[idx])
    np.testing.assert_array_equal(r["packed"], quantization("q8_0").dequantize(raw)[idx])


def test_gather_out_of_range_is_an_error():
    with pytest.raises(EvalError, match="index 10 outside 0..9"):
        run1(
            lambda b: b.gather(b.weight("t", "f32", [10, 2]), b.input("ids", "i32", [T])),
            {"ids": np.array([1, 10], np.int32)},
            {"t": np.ones((10, 2), np.float32)},
        )


def test_data_movement(rng):
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    z = rng.standard_normal((4, 6, 3)).astype(np.float32)

    def build(b):
        bx = b.input("x", "f32", [T, 6, 8])
        return {
            "reshape": b.reshape(bx, [T, -1]),
            "transpose": b.transpose(bx, [2, 0, 1]),
            "slice": b.slice(bx, 2, 1, 7, 2),
            "concat": b.concat([bx, b.input("z", "f32", [T, 6, 3])], axis=-1),
            "expand": b.expand(b.slice(bx, 1, 0, 1), [T, 6, 8]),
            "iota": b.iota([T, 3], axis=0),
        }

    r = run1(build, {"x": x, "z": z})
    np.testing.assert_array_equal(r["reshape"], x.reshape(4, 48))
    np.testing.assert_array_equal(r["transpose"], x.transpose(2, 0, 1))
    np.testing.assert_array_equal(r["slice"], x[:, :, 1:7:2])
    np.testing.assert_array_equal(r["concat"], np.concatenate([x, z], -1))
    np.testing.assert_array_equal(r["expand"], np.broadcast_to(x[:, :1], x.shape))
    np.testing.assert_array_equal(r["iota"], np.repeat(np.arange(4)[:, None], 3, 1))


def test_cache_write_through_slot_map(rng):
    pool = rng.standard_normal((5, 4, 2, 3)).astype(np.float32)
    vals = rng.standard_normal((6, 2, 3)).astype(np.float32)
    slots = rng.permutation(20)[:6].astype(np.int32)
    slots[2] = -1  # skipped row
    y = run1(
        lambda b: b.cache_write(b.input("p", "f32", [5, 4, 2, 3]), b.input("v", "f32", [T, 2, 3]), b.input("s", "i32", [T])), {"p": pool, "v": vals, "s": slots}
    )
    ref = pool.copy().reshape(20, 2, 3)
    for t, s in enumerate(slots):
        if s >= 0:
            ref[s] = vals[t]
    np.testing.assert_array_equal(y, ref.reshape(pool.shape))


def test_symbol_bindings_must_agree():
    b = GraphBuilder()
    y = b.add(b.input("a", "f32", [T, 2]), b.input("c", "f32", [T, 2]))
    g = b.build({"y": y})
    with pytest.raises(EvalError, match="symbol tokens"):
        evaluate(g, {"a": np.ones((3, 2), np.float32), "c": np.ones((4, 2), np.float32)})
    with pytest.raises(EvalError, match="missing input 'c'"):
        evaluate(g, {"a": np.ones((3, 2), np.float32)})


@pytest.mark.parametrize(
    "build,msg",
    [
        (lambda b: b.add(b.input("a", "f32", [3]), b.input("c", "f16", [3])), "dtypes differ"),
        (lambda b: b.add(b.input("a", "f32", [3]), b.input("c", "f32", [4])), "cannot broadcast"),
        (lambda b: b.add(b.input("a", "f32", [T]), b.input("c", "f32", [sym("ctx")])), "cannot broadcast"),
        (lambda b: b.matmul(b.input("a", "f32", [2, 3]), b.input("c", "f32", [4, 5])), "contraction sizes differ"),
        (lambda b: b.matmul(b.input("a", "f32", [2, 32]), b.weight("w", "q4_0", [4, 32])), "transpose_b"),
        (lambda b: b.reshape(b.input("a", "f32", [T, 6]), [T, 4]), "cannot become"),
        (lambda b: b.reshape(b.input("a", "f32", [T, 6]), [-1, 4]), "cannot infer -1"),
        (lambda b: b.transpose(b.input("a", "f32", [2, 3]), [0, 0]), "not a permutation"),
        (lambda b: b.slice(b.input("a", "f32", [2, 3]), 1, 0, 5), "past axis"),
        (lambda b: b.reduce("sum", b.input("a", "f32", [2, 3]), 2), "out of range"),
        (lambda b: b.topk(b.input("a", "f32", [2, 3]), 4), "out of range"),
        (lambda b: b.gather(b.input("a", "f32", [2, 3]), b.input("i", "f32", [2])), "indices must be integers"),
        (lambda b: b.unary("exp", b.input("a", "i32", [2])), "float operand"),
        (lambda b: b.where(b.input("c", "f32", [2]), b.input("a", "f32", [2]), 0.0), "condition must be bool"),
        (lambda b: b.cast(b.weight("w", "q8_0", [2, 32]), "f32"), "packed"),
    ],
)
def test_type_errors_name_the_op(build, msg):
    with pytest.raises(ShapeError, match=msg):
        build(GraphBuilder())


def test_symbolic_reshape_round_trip():
    b = GraphBuilder()
    x = b.input("x", "f32", [T, 8, 64])
    flat = b.reshape(x, [T, -1])
    assert str(flat.shape[1]) == "512"
    back = b.reshape(flat, [-1, 8, 64])
    assert back.shape[0] == T
    heads = b.reshape(b.input("y", "f32", [T * 4]), [T, 4])
    assert heads.shape[0] == T and heads.shape[1] == 4
    assert (T * 4).exact_div(4) == T and (T * 4 + 2).exact_div(4) is None
