"""Graph passes preserve results (on random graphs and on a whole attention block), do what they
claim (fewer nodes), and the verifier catches broken graphs, naming the pass that broke them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poot.errors import GraphError, ShapeError, VerifyError
from poot.eval import evaluate
from poot.graph import (
    GraphBuilder,
    PassManager,
    RopeConfig,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    infer_types,
    sym,
    verify,
)
from poot.graph.ir import Node, Value
from poot.graph.passes import DEFAULT_PASSES

T = sym("tokens")
PASSES = {
    "dce": eliminate_dead_code,
    "cse": eliminate_common_subexpressions,
    "fold": fold_constants,
    "infer": infer_types,
}

# a small random-graph language: each step applies an op to earlier values (some constant, some repeated)
STEP = st.tuples(
    st.sampled_from(["add", "mul", "sub", "maximum", "exp", "tanh", "neg", "const", "sum", "repeat", "slice", "concat", "where"]),
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.floats(-2, 2, allow_nan=False, width=32),
)


def random_graph(steps):
    b = GraphBuilder()
    vals = [b.input("x", "f32", [T, 4]), b.input("y", "f32", [T, 4]), b.const(np.linspace(-1, 1, 4, dtype=np.float32))]
    made = []
    for op, i, j, c in steps:
        a, z = vals[i % len(vals)], vals[j % len(vals)]
        try:
            v = _step(b, op, a, z, c, i, made)
        except ShapeError:  # operands that do not fit: the generator just moves on
            continue
        vals.append(v)
        if v.node.op not in ("input", "weight"):
            made.append(v.node)
    outs = {"o0": vals[-1], "o1": vals[len(vals) // 2]}
    return b.build(outs)


def _step(b, op, a, z, c, i, made):
    if op == "const":
        v = b.add(b.const(c), b.const(np.float32(c) * 2))
    elif op in ("exp", "tanh", "neg"):
        v = b.unary(op, b.tanh(a) if op == "exp" else a)
    elif op == "sum":
        v = b.add(a, b.sum(a, -1, keepdims=True))
    elif op == "repeat" and made:
        prev = made[i % len(made)]
        v = b.node(prev.op, prev.inputs, **prev.attrs).out  # a duplicate for CSE
    elif op == "slice":
        v = b.concat([b.slice(a, -1, 0, 2), b.slice(z, -1, 2, 4)], axis=-1) if a.shape == z.shape else a
    elif op == "concat":
        v = b.slice(b.concat([a, z], axis=-1), -1, 1, 5) if a.rank == z.rank and a.shape[:-1] == z.shape[:-1] else a
    elif op == "where":
        v = b.where(b.binary("gt", a, z), a, z) if a.shape == z.shape else a
    else:
        v = b.binary(op if op != "repeat" else "add", a, z)
    return v


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=25), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_passes_preserve_results_on_random_graphs(steps, n, seed):
    g = random_graph(steps)
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((n, 4)).astype(np.float32), "y": rng.standard_normal((n, 4)).astype(np.float32)}
    want = evaluate(g, inputs)
    for name, p in PASSES.items():
        h = p(g)
        verify(h)
        got = evaluate(h, inputs)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=f"pass {name} changed output {k}")
    h = PassManager(DEFAULT_PASSES).run(g)
    assert len(h) <= len(g)
    for k in want:
        np.testing.assert_allclose(evaluate(h, inputs)[k], want[k], rtol=1e-6, atol=1e-6)


def test_each_pass_does_its_job(rng):
    b = GraphBuilder()
    x = b.input("x", "f32", [T, 8])
    unused = b.input("unused", "f32", [3])  # noqa: F841
    dead = b.exp(b.mul(x, 3.0))  # nothing reads it  # noqa: F841
    c = b.mul(b.add(b.const(2.0), b.const(3.0)), b.const(0.5))  # folds to 2.5
    ramp = b.cast(b.iota([8], 0), "f32")  # static iota folds
    a1, a2 = b.add(x, c), b.add(x, c)  # the same expression twice
    y = b.mul(b.add(a1, a2), ramp)
    g = b.build({"y": y})
    xv = rng.standard_normal((3, 8)).astype(np.float32)
    want = evaluate(g, {"x": xv, "unused": np.ones(3, np.float32)})["y"]

    d = eliminate_dead_code(g)
    assert "exp" not in d.op_counts() and "unused" in d.inputs()  # inputs stay: they are the interface
    s = eliminate_common_subexpressions(d)
    assert s.op_counts()["add"] == d.op_counts()["add"] - 1
    f = fold_constants(s)
    counts = f.op_counts()
    assert "iota" not in counts and "cast" not in counts
    consts = [n.attrs["value"].array for n in f.nodes if n.op == "constant"]
    assert any(np.array_equal(cv, np.float32(2.5)) for cv in consts)
    assert any(np.array_equal(cv, np.arange(8, dtype=np.float32)) for cv in consts)
    np.testing.assert_allclose(evaluate(f, {"x": xv, "unused": np.ones(3, np.float32)})["y"], want, rtol=1e-6)


def test_passes_preserve_a_whole_attention_block(rng):
    from poot.graph.compose import AttentionConfig, AttentionWeights, KvState, attention_block

    b = GraphBuilder()
    D, H, Dh = 16, 2, 8
    w = AttentionWeights(*(b.weight(k, "f32", [H * Dh, D] if k != "o" else [D, H * Dh]) for k in "qkvo"))
    kv = KvState(
        b.input("kp", "f32", [4, 4, H, Dh]),
        b.input("vp", "f32", [4, 4, H, Dh]),
        b.input("slots", "i32", [T]),
        b.input("pos", "i32", [T]),
        b.input("seq", "i32", [T]),
        b.input("ctx", "i32", [1]),
        b.input("bt", "i32", [1, 4]),
    )
    out, _, _ = attention_block(b, b.input("x", "f32", [T, D]), w, AttentionConfig(H, H, Dh, RopeConfig(Dh)), kv)
    g = b.build({"out": out})
    n = 3
    inputs = dict(
        x=rng.standard_normal((n, D)).astype(np.float32),
        kp=rng.standard_normal((4, 4, H, Dh)).astype(np.float32),
        vp=rng.standard_normal((4, 4, H, Dh)).astype(np.float32),
        slots=np.array([9, 10, 11], np.int32),
        pos=np.arange(n, dtype=np.int32),
        seq=np.zeros(n, np.int32),
        ctx=np.array([n], np.int32),
        bt=np.array([[2, 0, 1, 3]], np.int32),
    )
    weights = {k: rng.standard_normal((H * Dh, D) if k != "o" else (D, H * Dh)).astype(np.float32) for k in "qkvo"}
    pm = PassManager(DEFAULT_PASSES)
    h = pm.run(g)
    assert [r.name for r in pm.records] == [n for n, _ in DEFAULT_PASSES]
    assert len(h) <= len(g) and h.op_counts()["rope"] == 2  # q and k rotated by one op each, through every pass
    np.testing.assert_allclose(evaluate(h, inputs, weights)["out"], evaluate(g, inputs, weights)["out"], rtol=1e-6, atol=1e-6)


def _graph():
    b = GraphBuilder()
    x = b.input("x", "f32", [T, 4])
    return b, b.build({"y": b.exp(b.add(x, 1.0))})


def test_verifier_catches_use_before_definition():
    _, g = _graph()
    g.nodes[1], g.nodes[2] = g.nodes[2], g.nodes[1]
    g.nodes[1].id, g.nodes[2].id = 1, 2
    with pytest.raises(VerifyError, match="not defined before"):
        verify(g)


def test_verifier_catches_wrong_stored_type():
    from poot.graph import TensorType, dtypes

    _, g = _graph()
    n = g.nodes[-1]
    n.outputs = (Value(n, 0, TensorType(dtypes.f16, n.out.shape)),)
    g.outputs["y"] = n.outputs[0]
    with pytest.raises(VerifyError, match="holds types"):
        verify(g)


def test_verifier_catches_duplicate_sources_and_foreign_outputs():
    b, g = _graph()
    dup = Node(len(g.nodes), "input", (), dict(g.nodes[0].attrs))
    dup.outputs = (Value(dup, 0, g.nodes[0].out.type),)
    g.nodes.append(dup)
    with pytest.raises(VerifyError, match="defined twice"):
        verify(g)
    _, g2 = _graph()
    g2.outputs["z"] = g.nodes[0].out
    with pytest.raises(VerifyError, match="not a value of this graph"):
        verify(g2)


def test_pass_manager_names_the_pass_that_broke_the_graph():
    _, g = _graph()

    def broken(graph):
        graph.nodes.reverse()
        return graph

    with pytest.raises(VerifyError, match="after pass 'broken'"):
        PassManager([("dce", eliminate_dead_code), ("broken", broken)]).run(g)


def test_builder_rejects_duplicate_names_and_foreign_operands():
    b = GraphBuilder()
    b.input("x", "f32", [2])
    with pytest.raises(GraphError, match="already defined"):
        b.weight("x", "f32", [2])
    with pytest.raises(GraphError, match="not a graph value"):
        b.node("exp", [np.ones(2)])
