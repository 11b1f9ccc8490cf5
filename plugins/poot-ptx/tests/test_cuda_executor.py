"""The CUDA executor's bookkeeping: the shared arena (every captured step's intermediate values in
one allocation, replaced by a larger one when a step needs more, the steps on the old one captured
again and the old one freed once they are done), and queued replays of one step that each keep their
own outputs. Skipped where no NVIDIA GPU is present; scripts/gpu-check runs it on one."""

from __future__ import annotations

import numpy as np
import pytest

from poot.errors import PootError
from poot.eval.model import PagedOracle
from poot.plan import compile_plan
from poot.testing.fixtures import device_or_skip
from poot.testing.paged import PagedSequences, step_against_oracle, synthetic_graph, wide_q4_k_llama_file


@pytest.fixture(scope="module")
def cuda():
    return device_or_skip("cuda:0")


def test_steps_share_one_arena_and_a_larger_one_replaces_it(cuda, tmp_path, rng, monkeypatch):
    """Two sequences: a one-token step each, a long prefill chunk (a larger arena), then one-token
    steps again (the first shape captured again on the new arena). Every step's logits equal the
    oracle's; the steps alive share the executor's arena; the old arena and the step captured on it
    are freed two launches after the growth; an arena-held output of a step that another step ran
    after is refused, not read from the other step's values."""
    from poot_ptx import executor
    from poot_ptx.executor import CudaExecutor

    monkeypatch.setattr(executor, "ARENA_MIN", 0)  # the first arena as small as the first step: this model's steps are small
    monkeypatch.setattr(executor, "READBACK_BYTES", 0)  # the logits read from the arena, not written back by the step's graph
    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex = CudaExecutor(compile_plan(g, cuda))
    oracle = PagedOracle(g, w, num_blocks=48)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    pages = PagedSequences(48, 4, rng)
    pages.add(), pages.add()
    try:

        def run(chunks: list[list[int]], step: int) -> list[list[int]]:
            """One step against the oracle; each sequence's greedy next token."""
            nonlocal worst
            batch = pages.step(chunks, width=32)
            want, diff = step_against_oracle(ex, oracle, batch, pools, w, step)
            worst = max(worst, diff)
            rows = batch.seq_ids[batch.logit_rows]
            return [[int(want[np.nonzero(rows == s)[0][-1]].argmax())] for s in range(2)]

        worst = 0.0
        run([rng.integers(0, 97, 1).tolist(), rng.integers(0, 97, 1).tolist()], 0)
        small = next(iter(ex._steps.values()))
        first_arena, first_size = ex._arena, ex._arena_size
        assert small.arena == first_arena and first_size >= small.arena_bytes
        # a prefill chunk of 120 tokens: more values than the first arena holds
        nxt = run([rng.integers(0, 97, 70).tolist(), rng.integers(0, 97, 50).tolist()], 1)
        assert ex._arena != first_arena and ex._arena_size >= max(first_size * 3 // 2, max(s.arena_bytes for s in ex._steps.values()))
        assert small in ex._retired and first_arena in ex._arena_users  # the small step may still be read: its arena kept
        big = next(s for s in ex._steps.values() if s is not small)
        with pytest.raises(PootError, match="replaced"):
            ex.launch(small, {})
        for step in range(2, 5):  # one token each, the first shape again: captured on the new arena
            nxt = run(nxt, step)
        assert worst < 1e-4, worst
        assert not ex._retired and list(ex._arena_users) == [ex._arena], (ex._retired, ex._arena_users)
        assert {s.arena for s in ex._steps.values()} == {ex._arena} and len(ex._steps) == 2
        with pytest.raises(PootError, match="released"):
            ex.read(small, "logits")
        with pytest.raises(PootError, match="another step has run since"):
            ex.read(big, "logits")
    finally:
        ex.close()
    assert not ex._arena_users and not ex._retired


def test_a_queued_step_keeps_its_tokens_when_the_gpu_is_ahead_of_the_host(cuda, tmp_path):
    """A model so small (two layers, 256 wide) that its step's graph is done before the engine queues
    the next: the engine queues step N+1, then reads step N's tokens, which must be N's own and not
    those the next replay of the same captured step writes back. Three greedy sequences give the
    same tokens with steps queued ahead as one step at a time, and the case where they could be lost
    (a step launched again after its last replay was done, before that one was read) is checked to
    have happened."""
    import poot
    from poot.llm.params import SamplingParams

    m = poot.load(str(wide_q4_k_llama_file(tmp_path, 11)), "cuda:0", max_seqs=4, max_context=128, progress=False)
    ex = next(iter(m._executors.values()))
    d, launch, done_before = ex.d, ex.launch, []

    def watched(step, inputs, *a, **kw):  # type: ignore[no-untyped-def]
        if step.launched >= 0:
            done_before.append(d.cuEventQuery(step.slots[step.last].event)[0] == d.CUresult.CUDA_SUCCESS)
        return launch(step, inputs, *a, **kw)

    ex.launch = watched
    eng = m.engine

    def run(lookahead: bool) -> list[list[int]]:
        eng.lookahead = lookahead
        ids = [eng.add([5, 6, 7, 8, 9][: 2 + i], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)) for i in range(3)]
        out: dict[int, list[int]] = {}
        while eng.has_work():
            for ev in eng.step():
                if ev.token is not None:
                    out.setdefault(ev.seq_id, []).append(ev.token)
        return [out[i] for i in ids]

    try:
        one = run(False)
        done_before.clear()
        queued = run(True)
    finally:
        m.close()
    assert all(len(t) == 40 for t in one), [len(t) for t in one]
    assert queued == one
    assert sum(done_before) >= 5, done_before  # the GPU was ahead: the step's last replay done before the next was queued
