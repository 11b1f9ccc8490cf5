"""Whole models on a CUDA device, through GPU schedules and CUDA-graph steps: logits equal the CPU
oracle's over a prefill of two sequences in one paged pool and decode steps (every synthetic family,
MoE and MLA included). Skipped where no NVIDIA GPU is present; scripts/gpu-check runs it on one."""

from __future__ import annotations

import numpy as np
import pytest

from poot.errors import DeviceUnavailable
from poot.eval.model import PagedOracle, oracle_weights
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.plan import compile_plan
from poot.runtime import get_device
from poot.testing.paged import PagedSequences, two_sequences_against_oracle
from poot.testing.synthetic import SYNTHETIC


@pytest.fixture(scope="module")
def cuda():
    try:
        return get_device("cuda:0")
    except DeviceUnavailable as e:
        pytest.skip(f"no CUDA device here: {e}")


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_families_on_cuda_match_the_oracle(cuda, name, tmp_path, rng):
    from poot.testing.synthetic import build_synthetic
    from poot_ptx.executor import CudaExecutor

    ck = open_checkpoint(build_synthetic(name, tmp_path / name, int(rng.integers(0, 2**31))))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4)))
    ex = CudaExecutor(compile_plan(g, cuda))
    worst = two_sequences_against_oracle(ex, g, oracle_weights(ck.weights), rng)
    ex.close()
    print(f"{name} on cuda:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4


def test_bf16_model_on_the_fast_schedules_matches_the_oracle(cuda, tmp_path, rng):
    """A bf16 Llama wide enough (K of 256 and 512) for the warp GEMVs and the tensor-core GEMMs, in
    every row-count regime: 1, 2-4, 5-16, 17-64 and more than 64 rows a step."""
    from poot.testing.synthetic import build_synthetic
    from poot_ptx.executor import CudaExecutor

    ck = open_checkpoint(build_synthetic("llama", tmp_path / "wide", int(rng.integers(0, 2**31)), dtype="bfloat16",
                                         hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4)))
    plan = compile_plan(g, cuda)
    names = {l.kernel.name.split("_K")[0] for l in plan.launches}
    assert {"gemv_warp_bf16", "gemm_warp_bf16", "gemm_mma_bf16"} <= names, names
    ex = CudaExecutor(plan)
    w = oracle_weights(ck.weights)
    oracle = PagedOracle(g, w, num_blocks=64)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    pages = PagedSequences(64, 4, rng)
    for _ in range(3):
        pages.add()
    prompts = [rng.integers(0, 97, n).tolist() for n in (70, 11, 4)]
    worst = 0.0
    # 85 rows (tiled tensor-core GEMM), 3 decode rows (GEMV of 4 rows), 20 rows and 9 rows (the two
    # weight-streaming tensor-core GEMMs), one row (GEMV)
    last: list[int | None] = [None, None, None]
    for step in range(5):
        if step == 0:
            chunks = prompts
        elif step == 1:
            chunks = [[t] for t in last]
        elif step == 2:
            chunks = [rng.integers(0, 97, 20).tolist(), [], []]
        elif step == 3:
            chunks = [[], rng.integers(0, 97, 9).tolist(), []]
        else:
            chunks = [[last[0]], [], []]
        batch = pages.step(chunks, all_logits=step == 0, width=32)
        got = ex.run({**batch.as_inputs(), **pools}, w)["logits"]
        want = oracle.step(batch)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        worst = max(worst, float(np.abs(got - want).max()))
        rows = batch.seq_ids[batch.logit_rows]
        last = [int(want[np.nonzero(rows == s)[0][-1]].argmax()) if (rows == s).any() else last[s] for s in range(3)]
    ex.close()
    print(f"bf16 llama (fast schedules) on cuda:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-3
