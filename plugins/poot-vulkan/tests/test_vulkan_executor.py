"""Whole models on vulkan:0 (lavapipe in CI) through the Vulkan executor: GPU schedules compiled to
SPIR-V pipelines, each step one recorded command buffer. Logits equal the CPU oracle's for synthetic
families over prefill and decode steps; SmolLM2 generates the CPU device's greedy tokens."""

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
def vulkan():
    return device_or_skip("vulkan:0")


# dense with GQA and llama3 RoPE; q/k norms; MLA with MoE (per-expert products, shared key part)
@pytest.mark.parametrize("name", ["llama", "qwen3", "deepseek_v2"])
def test_families_on_vulkan_match_the_oracle(vulkan, name, tmp_path, rng):
    from poot_vulkan.executor import VulkanExecutor

    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)))
    ex = VulkanExecutor(compile_plan(g, vulkan))
    worst = two_sequences_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"{name} on vulkan:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4


@pytest.mark.parametrize("name", ["llama", "deepseek_v2"])
def test_f16_kv_pools_on_vulkan_match_the_oracle(vulkan, name, tmp_path, rng):
    """KV pools of halves (``kv_dtype="f16"``): written two halves to a 32-bit word (the SPIR-V target
    stores no 16-bit values), read as halves of words; logits within the f16-pool bound (docs/NUMERICS.md)."""
    from poot_vulkan.executor import VulkanExecutor

    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)), cache_dtype="f16")
    ex = VulkanExecutor(compile_plan(g, vulkan))
    worst = two_sequences_against_oracle(ex, g, w, rng, tie=2e-3)
    ex.close()
    print(f"{name} with f16 pools on vulkan:0: max |dlogit| {worst:.2g}")
    assert worst < 2e-3


def test_device_local_buffers_written_through_staging_match_the_oracle(vulkan, tmp_path, rng):
    """The path a discrete GPU takes (weights, pools, arena and scalars in device-local memory written
    by copy commands through a staging buffer, outputs copied back by the step itself), forced on
    lavapipe whose device-local memory could be mapped."""
    from poot_vulkan.executor import VulkanExecutor
    from poot_vulkan.runtime import DeviceBuffer

    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex = VulkanExecutor(compile_plan(g, vulkan), staged=True)
    worst = two_sequences_against_oracle(ex, g, w, rng)
    assert ex._weights and all(isinstance(b, DeviceBuffer) for b in ex._weights.values())
    assert all(isinstance(b, DeviceBuffer) for b, _ in ex._pools.values())
    ex.close()
    assert worst < 1e-4


def test_decode_over_a_long_context_splits_attention(vulkan, tmp_path, rng):
    """Decode steps over 1,040 positions: the context split across workgroups (partial sums in the
    plan's scratch memory, merged by a second launch) gives the oracle's logits."""
    from poot_vulkan.executor import VulkanExecutor

    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex = VulkanExecutor(compile_plan(g, vulkan))
    worst, names = long_context_against_oracle(ex, g, w, rng)
    ex.close()
    assert "attention_merge" in names, names
    assert worst < 1e-4


def test_bf16_model_on_the_warp_gemv_matches_the_oracle(vulkan, tmp_path, rng):
    """bf16 weights read as stored (16-bit values as halves of 32-bit words) by the warp GEMV (its
    lanes summing by subgroup reductions on 32-lane subgroups, through workgroup memory elsewhere),
    and for more rows by the register-tiled GEMM (`gemm_simt`), in every row-count regime the planner
    tells apart."""
    from poot_vulkan.executor import VulkanExecutor as Executor

    g, w = wide_bf16_llama(tmp_path / "wide", int(rng.integers(0, 2**31)))
    plan = compile_plan(g, vulkan)
    names = {l.kernel.name.split("_K")[0] for l in plan.launches}
    assert {"gemv_warp_bf16", "gemv_warp_glu_bf16", "gemm_simt_bf16"} <= names, names
    ex = Executor(plan)
    worst = row_regimes_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"bf16 llama (warp GEMV) on vulkan:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-3


def test_q4_k_m_model_on_the_subgroup_gemvs_matches_the_oracle(tmp_path, rng):
    """The Q4_K Llama GGUF with a Q6_K head and last down projection (as Q4_K_M files mix them),
    in every row-count regime: its products of up to four rows through GEMVs of a subgroup a
    feature (Q4_K and the head through the types' dequantization bodies, the K = 512 down
    projection on x as two int8 terms where the device runs 8-bit arithmetic), more rows through
    the register-tiled GEMM; against the oracle on gguf's dequantization."""
    from poot_vulkan.executor import VulkanExecutor as Executor

    dev = subgroups_or_skip("vulkan:0")
    caps = dev.capabilities
    names, errors = wide_q4_k_llama_regimes(dev, Executor, tmp_path / "q4km", rng)
    want = {"gemv_warp_packed_q4_k", "gemv_warp_packed_q6_k", "gemm_simt_q4_k"} | ({"gemv_warp_q6_k"} if "i8" in caps.dtypes else set())
    assert want <= names, names
    print(f"q4_k_m llama (subgroup GEMVs) on vulkan:0: |dlogit| by rows {errors}")
    assert max(e for _, e in errors) < 2e-3


def test_a_step_is_profiled_with_timestamp_queries(vulkan, tmp_path, rng):
    from poot_vulkan.executor import VulkanExecutor

    g, w = synthetic_graph("qwen2", tmp_path / "q", int(rng.integers(0, 2**31)))
    ex = VulkanExecutor(compile_plan(g, vulkan))
    times, step, wall = profiled_step(ex, g, w, rng)
    assert [n for n, _ in times] == step.names and len(times) == step.launches
    assert all(t >= 0 for _, t in times) and 0 < sum(t for _, t in times) < wall
    ex.close()


def test_smollm2_greedy_tokens_equal_the_cpu_device(vulkan, smollm2_path):
    import poot
    from poot.llm.params import SamplingParams

    prompt = None
    tokens = {}
    for device in ("cpu", "vulkan:0"):
        m = poot.load(str(smollm2_path), device, max_seqs=1, max_context=128, progress=False)
        prompt = prompt or m.tokenizer.encode("The capital of France is")
        eng = m.engine
        eng.add(prompt, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        out: list[int] = []
        done = False
        while not done:
            for ev in eng.step():
                if ev.token is not None:
                    out.append(ev.token)
                done = done or ev.finished is not None
        tokens[device] = out
        m.close()
    assert len(tokens["cpu"]) == 16
    assert tokens["vulkan:0"] == tokens["cpu"]
