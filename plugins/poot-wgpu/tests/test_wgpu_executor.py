"""Whole models on wgpu:0 (lavapipe's Vulkan adapter in CI) through the WebGPU executor: codegen's
SPIR-V through naga, bind groups made once per captured step, one compute pass a replay. Synthetic
families equal the CPU oracle; SmolLM2 generates the CPU device's greedy tokens."""

from __future__ import annotations

import pytest

from poot.plan import compile_plan
from poot.testing.fixtures import device_or_skip, subgroups_or_skip
from poot.testing.paged import (
    long_context_against_oracle,
    profiled_step,
    row_regimes_against_oracle,
    synthetic_graph,
    two_sequences_against_oracle,
    wide_bf16_llama,
    wide_q4_k_llama_regimes,
)


@pytest.fixture(scope="module")
def adapter():
    return device_or_skip("wgpu:0")


# deepseek_v2: MLA and MoE routing, whose group mask is an infinite constant naga refuses as written
@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3", "deepseek_v2"])
def test_families_on_wgpu_match_the_oracle(adapter, name, tmp_path, rng):
    from poot_wgpu.executor import WgpuExecutor

    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)))
    ex = WgpuExecutor(compile_plan(g, adapter))
    worst = two_sequences_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"{name} on wgpu:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4


def test_f16_kv_pools_on_wgpu_match_the_oracle(adapter, tmp_path, rng):
    """KV pools of halves, written two to a 32-bit word and read as halves of words, through naga:
    logits within the f16-pool bound (docs/NUMERICS.md)."""
    from poot_wgpu.executor import WgpuExecutor

    g, w = synthetic_graph("gemma3", tmp_path / "gemma3", int(rng.integers(0, 2**31)), cache_dtype="f16")
    ex = WgpuExecutor(compile_plan(g, adapter))
    worst = two_sequences_against_oracle(ex, g, w, rng, tie=2e-3)
    ex.close()
    print(f"gemma3 with f16 pools on wgpu:0: max |dlogit| {worst:.2g}")
    assert worst < 2e-3


def test_a_step_is_profiled_with_timestamp_queries(adapter, tmp_path, rng):
    """Each launch timed in a compute pass of its own; WebGPU timestamps are nanoseconds, so the
    launches' sum is a fraction of the wall time profile() took for three runs."""
    from poot_wgpu.executor import WgpuExecutor

    g, w = synthetic_graph("qwen2", tmp_path / "q", int(rng.integers(0, 2**31)))
    ex = WgpuExecutor(compile_plan(g, adapter))
    if "timestamp-query" not in ex.dev.device.features:
        ex.close()
        pytest.skip("this adapter has no timestamp-query feature")
    times, step, wall = profiled_step(ex, g, w, rng)
    assert [n for n, _ in times] == step.names and len(times) == step.launches
    assert all(t >= 0 for _, t in times)
    assert wall / 1000 < sum(t for _, t in times) < wall
    ex.close()


def test_decode_over_a_long_context_splits_attention(adapter, tmp_path, rng):
    """Decode steps over 1,040 positions: the context split across workgroups, merged by a second launch."""
    from poot_wgpu.executor import WgpuExecutor as Executor

    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex = Executor(compile_plan(g, adapter))
    worst, names = long_context_against_oracle(ex, g, w, rng)
    ex.close()
    assert "attention_merge" in names, names
    assert worst < 1e-4


def test_bf16_model_on_the_warp_gemv_matches_the_oracle(adapter, tmp_path, rng):
    """bf16 weights read as stored (16-bit values as halves of 32-bit words) by the warp GEMV (its
    lanes summing by subgroup reductions on 32-lane subgroups, through workgroup memory elsewhere),
    and for more rows by the register-tiled GEMM (`gemm_simt`), in every row-count regime the planner
    tells apart."""
    from poot_wgpu.executor import WgpuExecutor as Executor

    g, w = wide_bf16_llama(tmp_path / "wide", int(rng.integers(0, 2**31)))
    plan = compile_plan(g, adapter)
    names = {l.kernel.name.split("_K")[0] for l in plan.launches}
    assert {"gemv_warp_bf16", "gemv_warp_glu_bf16", "gemm_simt_bf16"} <= names, names
    ex = Executor(plan)
    worst = row_regimes_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"bf16 llama (warp GEMV) on wgpu:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-3


def test_q4_k_m_model_on_the_subgroup_gemvs_matches_the_oracle(tmp_path, rng):
    """The Q4_K Llama GGUF with a Q6_K head and last down projection (as Q4_K_M files mix them) in
    every row-count regime, its products of up to four rows through GEMVs of a subgroup a feature
    (naga translating them), more rows through the register-tiled GEMM; against the oracle on
    gguf's dequantization."""
    from poot_wgpu.executor import WgpuExecutor as Executor

    dev = subgroups_or_skip("wgpu:0")
    caps = dev.capabilities
    names, errors = wide_q4_k_llama_regimes(dev, Executor, tmp_path / "q4km", rng)
    assert {"gemv_warp_packed_q4_k", "gemv_warp_packed_q6_k" if "i8" not in caps.dtypes else "gemv_warp_q6_k", "gemm_simt_q4_k"} <= names, names
    print(f"q4_k_m llama (subgroup GEMVs) on wgpu:0: |dlogit| by rows {errors}")
    assert max(e for _, e in errors) < 2e-3


@pytest.mark.slow
def test_smollm2_greedy_tokens_equal_the_cpu_device(adapter, smollm2_path):
    """SmolLM2's packed-weight kernels (Q4_1 GEMV with LLVM's 8/16-bit index arithmetic widened for
    naga) on wgpu:0: 16 greedy tokens, the CPU device's."""
    import poot
    from poot.llm.params import SamplingParams

    tokens = {}
    for device in ("cpu", "wgpu:0"):
        m = poot.load(str(smollm2_path), device, max_seqs=1, max_context=128, progress=False)
        [c] = m.complete([m.tokenizer.encode("The capital of France is")], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        tokens[device] = list(c.tokens)
        m.close()
    assert len(tokens["cpu"]) == 16
    assert tokens["wgpu:0"] == tokens["cpu"]
