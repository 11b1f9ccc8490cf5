"""The host executor's contract: bind, capture, replay, read. A captured step replays with new inputs
and no Python work per kernel, allocates nothing while it runs, uses exactly the arena the planner
sized, gives the same bits on one thread or two, and refuses bad bindings by name."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from poot.errors import PootError
from poot.eval.model import PagedOracle, oracle_weights
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.plan.lower import plan_graph
from poot.plan.memory import plan_storage
from poot.runtime.executor import step_env
from poot.testing.paged import PagedSequences
from poot.testing.synthetic import build_synthetic
from poot_cpu.executor import HostExecutor

BLOCKS, BS, WIDTH = 24, 4, 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    ck = open_checkpoint(build_synthetic("qwen3", tmp_path_factory.mktemp("m") / "qwen3", 7))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=BS)))
    return g, oracle_weights(ck.weights)


def _decode_run(g, w, rng, threads, steps=4):
    """Prefill two sequences, then decode: every decode step replays one captured step."""
    ex = HostExecutor(plan_graph(g), threads=threads)
    oracle = PagedOracle(g, w, num_blocks=BLOCKS)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    ex.bind(w, pools)
    pages = PagedSequences(BLOCKS, BS, np.random.default_rng(0))
    pages.add(), pages.add()
    chunks = [rng.integers(0, 97, 6).tolist(), rng.integers(0, 97, 3).tolist()]
    outs, captured = [], []
    for _ in range(steps):
        batch = pages.step(chunks, width=WIDTH)
        inputs = batch.as_inputs()
        step = ex.capture(step_env(ex.plan, {**inputs, **pools}))
        captured.append(step)
        ex.replay(step, inputs)
        got = ex.read(step, "logits")
        want = oracle.step(batch)
        np.testing.assert_allclose(got, want, atol=1e-4)
        outs.append(got)
        chunks = [[int(r.argmax())] for r in want]
    ex.close()
    return outs, captured


def test_decode_steps_replay_one_capture_and_match_the_oracle(model, rng):
    g, w = model
    _, captured = _decode_run(g, w, rng, threads=2)
    assert captured[1] is captured[2] is captured[3], "decode steps of one shape must reuse their captured step"
    assert captured[0] is not captured[1]


def test_one_thread_and_two_give_the_same_bits(model):
    g, w = model
    one, _ = _decode_run(g, w, np.random.default_rng(5), threads=1)
    two, _ = _decode_run(g, w, np.random.default_rng(5), threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_arena_is_the_planned_peak_and_replay_allocates_nothing(model, rng, monkeypatch):
    g, w = model
    plan = plan_graph(g)
    ex = HostExecutor(plan, threads=2)
    oracle = PagedOracle(g, w, num_blocks=BLOCKS)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    ex.bind(w, pools)
    pages = PagedSequences(BLOCKS, BS, rng)
    pages.add()
    batch = pages.step([rng.integers(0, 97, 9).tolist()], width=WIDTH)
    inputs = batch.as_inputs()
    env = step_env(plan, {**inputs, **pools})
    sp = plan_storage(plan, env)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    step = ex.capture(env)
    captured_bytes = tracemalloc.get_traced_memory()[0] - before
    # the executor's activation storage is one arena of exactly the planned size ...
    assert step.arena_bytes == sp.arena_bytes >= sp.live_bytes > 0
    for root, off in sp.arena_offsets.items():
        assert 0 <= off and off + sp.nbytes(root, g.nodes[root[0]].outputs[root[1]].dtype) <= sp.arena_bytes
    # ... and capture allocates it plus the step's inputs and launch tables, nothing of activation size besides
    inputs_bytes = sum(a.nbytes for a in step.inputs.values())
    tables = step.records.nbytes + sum(a.nbytes for a in step.keep)
    assert sp.arena_bytes <= captured_bytes <= sp.arena_bytes + inputs_bytes + tables + 256 * 1024
    # replay runs no Python per kernel (kernels' Python entry points are never called) and allocates nothing
    from poot.codegen.host_jit import HostKernel

    monkeypatch.setattr(HostKernel, "run", lambda *a, **k: pytest.fail("a kernel was launched from Python"))
    ex.replay(step, inputs)  # warm: first-touch of pages
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(3):
        ex.replay(step, inputs)
    grew = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grew < 4096, f"replay allocated {grew} bytes"
    np.testing.assert_allclose(ex.read(step, "logits"), oracle.step(batch), atol=1e-4)
    ex.close()


def test_bad_bindings_are_refused_by_name(model):
    g, w = model
    ex = HostExecutor(plan_graph(g), threads=1)
    name = next(n for n in w if w[n].ndim == 2)
    with pytest.raises(PootError, match=name):
        ex.bind({**w, name: w[name][:, :-1].copy()})
    with pytest.raises(PootError, match=name):
        ex.bind({**w, name: w[name].astype(np.float64)})
    missing = dict(w)
    del missing[name]
    with pytest.raises(PootError, match=f"weight '{name}' is not bound"):
        ex.bind(missing)
    ex.bind(w)
    pages = PagedSequences(BLOCKS, BS, np.random.default_rng(0))
    pages.add()
    inputs = pages.step([[1, 2]], width=WIDTH).as_inputs()
    pools = {n: np.zeros((BLOCKS,) + tuple(d.value for d in v.shape[1:]), np.float32) for n, v in g.inputs().items() if "_cache." in n}
    with pytest.raises(PootError, match="not bound"):
        ex.capture(step_env(ex.plan, {**inputs, **pools}))
    ex.bind(w, pools)
    step = ex.capture(step_env(ex.plan, {**inputs, **pools}))
    with pytest.raises(PootError, match="tokens"):
        ex.replay(step, {**inputs, "tokens": np.zeros(5, np.int32)})
    ex.close()
