"""The CUDA executor's shared arena: every captured step's intermediate values in one allocation,
replaced by a larger one when a step needs more, with the steps on the old one captured again and
the old one freed once they are done. Skipped where no NVIDIA GPU is present; scripts/gpu-check runs
it on one."""

from __future__ import annotations

import numpy as np
import pytest

from poot.errors import DeviceUnavailable, PootError
from poot.eval.model import PagedOracle
from poot.plan import compile_plan
from poot.runtime import get_device
from poot.testing.paged import PagedSequences, _step_against_oracle, synthetic_graph


@pytest.fixture(scope="module")
def cuda():
    try:
        return get_device("cuda:0")
    except DeviceUnavailable as e:
        pytest.skip(f"no CUDA device here: {e}")


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
            want, diff = _step_against_oracle(ex, oracle, batch, pools, w, step)
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
