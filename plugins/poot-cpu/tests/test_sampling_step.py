"""Sampling as the suffix of a compiled step: token counts, bias, mask, penalties, temperature,
top-k/p, min-p and seeded draws on the CPU device give the oracle's tokens, and log-probabilities
match, over a prefill and decode steps of a mixed batch."""

from __future__ import annotations

import numpy as np
import pytest

from poot.eval import Oracle
from poot.eval.model import oracle_weights
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.plan import plan_graph
from poot.testing.paged import PagedSequences
from poot.testing.synthetic import build_synthetic
from poot_cpu.executor import HostExecutor


def _params(rng, batch, rows, vocab, seq_of_row, step):
    words = -(-vocab // 32)
    mask = np.full((rows, words), -1, np.int32)
    mask[0] = rng.integers(-(2**31), 2**31 - 1, words, dtype=np.int64).astype(np.int32) | 1  # a guided row; token 0 stays allowed
    bias_ids = np.full((rows, 2), -1, np.int32)
    bias_ids[-1] = [3, 5]
    return {
        "count_rows": np.arange(batch, dtype=np.int32)[::-1].copy(),
        "row_count_rows": (batch - 1 - seq_of_row).astype(np.int32),
        "temperature": np.array([0.0, 0.8, 1.2, 0.7][:rows], np.float32),
        "top_k": np.array([0, 5, 0, 40][:rows], np.int32),
        "top_p": np.array([1.0, 1.0, 0.9, 0.95][:rows], np.float32),
        "min_p": np.array([0.0, 0.0, 0.05, 0.0][:rows], np.float32),
        "repetition": np.array([1.3, 1.0, 1.1, 1.0][:rows], np.float32),
        "presence": np.array([0.0, 0.5, 0.0, 0.2][:rows], np.float32),
        "frequency": np.array([0.0, 0.1, 0.0, 0.3][:rows], np.float32),
        "seeds": np.array([1, 2, 3, 4][:rows], np.int32),
        "steps": np.full(rows, step, np.int32),
        "mask": mask,
        "bias_ids": bias_ids,
        "bias_vals": np.full((rows, 2), 2.5, np.float32),
    }


def test_sampled_step_matches_the_oracle(tmp_path, rng):
    ck = open_checkpoint(build_synthetic("qwen3", tmp_path / "q", int(rng.integers(0, 2**31))))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4, sample=True, logprobs=3)))
    w = oracle_weights(ck.weights)
    vocab = g.outputs["logits"].shape[1].value
    ex = HostExecutor(plan_graph(g), threads=2)
    blocks, batch = 24, 4
    pools = {n: np.zeros((blocks,) + tuple(d.value for d in v.shape[1:]), np.float32) for n, v in g.inputs().items() if "_cache." in n}
    pools["token_counts"] = np.zeros((batch, vocab), np.int32)
    pools["last_tokens"] = np.zeros(batch, np.int32)
    ref_pools = {n: a.copy() for n, a in pools.items()}
    pages = PagedSequences(blocks, 4, rng)
    for _ in range(batch):
        pages.add()
    chunks = [rng.integers(0, vocab, n).tolist() for n in (5, 2, 7, 3)]
    oracle = Oracle()
    for step in range(4):
        b = pages.step(chunks, width=8)
        seq_of_row = b.seq_ids[b.logit_rows]
        inputs = {**b.as_inputs(), **_params(rng, batch, len(b.logit_rows), vocab, seq_of_row, step)}
        want = oracle.run(g, {**inputs, **ref_pools}, w)
        for n in ref_pools:
            ref_pools[n] = want[n]
        got = ex.run({**inputs, **pools}, w)
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        np.testing.assert_array_equal(pools["token_counts"], want["token_counts"])
        np.testing.assert_array_equal(pools["last_tokens"], want["last_tokens"])
        np.testing.assert_array_equal(got["top_ids"], want["top_ids"])
        np.testing.assert_allclose(got["logprob"], want["logprob"], atol=1e-4)
        np.testing.assert_allclose(got["top_logprobs"], want["top_logprobs"], atol=1e-4)
        words = inputs["mask"].view(np.uint32)
        assert (words[0, got["tokens"][0] >> 5] >> (got["tokens"][0] & 31)) & 1  # the guided row kept to its mask
        # every second step queued without its tokens (-1): the device takes each sequence's from last_tokens
        chunks = [[-1] if step % 2 == 0 else [int(t)] for t in got["tokens"]]
        kept = got["tokens"].copy()
    assert pools["token_counts"].sum() == 5 + 2 + 7 + 3 + 3 * 4
    assert sorted(pools["last_tokens"].tolist()) == sorted(kept.tolist())
    ex.close()


def test_a_step_without_log_probabilities_leaves_their_launch_out(tmp_path, rng):
    """``WANT_LOGPROBS`` = 0 captures the step without the log-probability launch: same tokens and
    pools, fewer launches, and reading a log-probability output is a clear error."""
    from poot.errors import PootError
    from poot.plan.plan import WANT_LOGPROBS
    from poot.runtime.executor import step_env

    ck = open_checkpoint(build_synthetic("llama", tmp_path / "l", int(rng.integers(0, 2**31))))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4, sample=True, logprobs=3)))
    w = oracle_weights(ck.weights)
    vocab = g.outputs["logits"].shape[1].value
    blocks, batch = 24, 2
    runs = {}
    for want in (1, 0):
        ex = HostExecutor(plan_graph(g), threads=2)
        pools = {n: np.zeros((blocks,) + tuple(d.value for d in v.shape[1:]), np.float32) for n, v in g.inputs().items() if "_cache." in n}
        pools["token_counts"] = np.zeros((batch, vocab), np.int32)
        pools["last_tokens"] = np.zeros(batch, np.int32)
        ex.bind(w, pools)
        pages = PagedSequences(blocks, 4, np.random.default_rng(7))
        pages.add(), pages.add()
        b = pages.step([[1, 2, 3], [4, 5]], width=8)
        inputs = {**b.as_inputs(), **_params(np.random.default_rng(8), batch, len(b.logit_rows), vocab, b.seq_ids[b.logit_rows], 0)}
        inputs = {k: v for k, v in inputs.items() if k not in pools}
        step = ex.capture({**step_env(ex.plan, {**inputs, **pools}), WANT_LOGPROBS: want})
        ex.replay(step, inputs)
        runs[want] = (ex.read(step, "tokens").copy(), pools["token_counts"].copy(), len(step.names))
        if not want:
            with pytest.raises(PootError, match="top_logprobs.*not computed"):
                ex.read(step, "top_logprobs")
        else:
            assert np.isfinite(ex.read(step, "top_logprobs")).all()
        ex.close()
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2] - 1
