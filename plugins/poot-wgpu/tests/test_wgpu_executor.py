"""Whole models on wgpu:0 (lavapipe's Vulkan adapter in CI) through the WebGPU executor: codegen's
SPIR-V through naga, bind groups made once per captured step, one compute pass a replay. Synthetic
families equal the CPU oracle; a plan whose kernels naga cannot take is refused by kernel name."""

from __future__ import annotations

import pytest

from poot.errors import DeviceUnavailable, Refusal
from poot.eval.model import oracle_weights
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.plan import compile_plan
from poot.runtime import get_device
from poot.testing.paged import two_sequences_against_oracle


@pytest.fixture(scope="module")
def adapter():
    try:
        dev = get_device("wgpu:0")
    except DeviceUnavailable as e:
        pytest.skip(f"no WebGPU adapter here: {e}")
    if not dev.available():
        pytest.skip(f"wgpu:0 is unavailable: {dev.available()}")
    return dev


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3"])
def test_families_on_wgpu_match_the_oracle(adapter, name, tmp_path, rng):
    from poot.testing.synthetic import build_synthetic
    from poot_wgpu.executor import WgpuExecutor

    ck = open_checkpoint(build_synthetic(name, tmp_path / name, int(rng.integers(0, 2**31))))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4)))
    ex = WgpuExecutor(compile_plan(g, adapter))
    worst = two_sequences_against_oracle(ex, g, oracle_weights(ck.weights), rng)
    ex.close()
    print(f"{name} on wgpu:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4


def test_kernels_naga_cannot_take_are_refused_by_name(adapter, smollm2_path):
    """SmolLM2's packed-weight kernels come out of LLVM with 8- and 16-bit integer arithmetic, which
    naga does not take: loading it on wgpu:0 is a Refusal naming the kernel, not a crash."""
    import poot

    with pytest.raises(Refusal, match=r"wgpu:0 refuses kernel \w+: WebGPU did not take its SPIR-V"):
        poot.load(str(smollm2_path), "wgpu:0", max_seqs=1, max_context=64, progress=False)
