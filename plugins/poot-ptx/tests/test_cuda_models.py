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
from poot.testing.paged import PagedSequences
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
    w = oracle_weights(ck.weights)
    oracle = PagedOracle(g, w, num_blocks=24)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    pages = PagedSequences(24, 4, rng)
    pages.add(), pages.add()
    chunks = [rng.integers(0, 97, 11).tolist(), rng.integers(0, 97, 4).tolist()]
    worst = 0.0
    for step in range(3):
        batch = pages.step(chunks, all_logits=step == 0, width=8)
        got = ex.run({**batch.as_inputs(), **pools}, w)["logits"]
        want = oracle.step(batch)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        worst = max(worst, float(np.abs(got - want).max()))
        chunks = [[int(want[np.nonzero(batch.seq_ids[batch.logit_rows] == s)[0][-1]].argmax())] for s in range(2)]
    ex.close()
    print(f"{name} on cuda:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4
