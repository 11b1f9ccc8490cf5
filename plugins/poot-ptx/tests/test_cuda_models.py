"""Whole models on a CUDA device, through GPU schedules and CUDA-graph steps: logits equal the CPU
oracle's over a prefill of two sequences in one paged pool and decode steps (every synthetic family,
MoE and MLA included). Skipped where no NVIDIA GPU is present; scripts/gpu-check runs it on one."""

from __future__ import annotations

import pytest

from poot.errors import DeviceUnavailable
from poot.plan import compile_plan
from poot.runtime import get_device
from poot.testing.paged import (
    long_context_against_oracle,
    row_regimes_against_oracle,
    synthetic_graph,
    two_sequences_against_oracle,
    wide_bf16_llama,
    wide_q4_k_llama_regimes,
)
from poot.testing.synthetic import SYNTHETIC


@pytest.fixture(scope="module")
def cuda():
    try:
        return get_device("cuda:0")
    except DeviceUnavailable as e:
        pytest.skip(f"no CUDA device here: {e}")


def _tiled(dev) -> str:  # the tiled tensor-core GEMM the planner takes there: Hopper's warpgroup one, else mma.sync's
    return "gemm_wgmma_bf16" if "wgmma" in dev.capabilities.matrix_ops else "gemm_mma_bf16"


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_families_on_cuda_match_the_oracle(cuda, name, tmp_path, rng):
    from poot_ptx.executor import CudaExecutor

    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)))
    ex = CudaExecutor(compile_plan(g, cuda))
    worst = two_sequences_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"{name} on cuda:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4


def test_decode_over_a_long_context_splits_attention(cuda, tmp_path, rng):
    """Decode steps over 1,040 positions: the context split across workgroups, merged by a second launch."""
    from poot_ptx.executor import CudaExecutor as Executor

    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex = Executor(compile_plan(g, cuda))
    worst, names = long_context_against_oracle(ex, g, w, rng)
    ex.close()
    assert "attention_merge" in names, names
    assert worst < 1e-4


def test_f16_kv_pools_on_the_fast_attention_match_the_oracle(cuda, tmp_path, rng):
    """A bf16 Llama (heads of 64) with f16 KV pools: its 1,040-token prompt through the tensor-core
    attention and its decode steps through the warp attention split over the context, both reading
    halves, against the oracle on f16 pools (a key or value may round to the neighbouring half on
    one side only: the CPU device's f16 bound)."""
    from poot_ptx.executor import CudaExecutor

    g, w = wide_bf16_llama(tmp_path / "wide16", int(rng.integers(0, 2**31)), cache_dtype="f16")
    plan = compile_plan(g, cuda)
    planned = {l.kernel.name for l in plan.launches if l.node.op == "attention"}
    assert any(n.startswith("attention_mma") and n.endswith("_PTf16") for n in planned), planned
    ex = CudaExecutor(plan)
    worst, names = long_context_against_oracle(ex, g, w, rng, tie=2e-3)
    ex.close()
    assert "attention_merge" in names and any(n.startswith("attention_decode") and n.endswith("_PTf16") for n in names), names
    print(f"bf16 llama with f16 KV pools on cuda:0: max |dlogit| {worst:.2g}")
    assert worst < 5e-3


@pytest.mark.parametrize("precision,bound", [("high", 1e-3), ("medium", 0.1)])
def test_bf16_model_on_the_fast_schedules_matches_the_oracle(cuda, tmp_path, rng, precision, bound):
    """A bf16 Llama wide enough (K of 256 and 512) for the warp GEMVs and the tensor-core GEMMs, in
    every row-count regime: 1, 2-4, 5-16, 17-64 and more than 64 rows a step; its heads of 64 take
    the tensor-core prefill attention and the warp-per-position decode attention. Matmul precision
    "medium" rounds the tensor cores' operands to bf16 (2^-9): a bound that much looser, and the
    argmax may differ where the oracle's top two logits are within twice the bound."""
    from poot_ptx.executor import CudaExecutor

    g, w = wide_bf16_llama(tmp_path / "wide", int(rng.integers(0, 2**31)))
    plan = compile_plan(g, cuda, precision)
    names = {l.kernel.name.split("_K")[0] for l in plan.launches}
    assert {"gemv_warp_bf16", "gemm_warp_bf16", _tiled(cuda), "split_bf16x2" if precision == "high" else "split_bf16x1"} <= names, names
    assert {"attention_mma", "attention_decode"} <= {nm.split("_D")[0] for nm in names}, names
    ex = CudaExecutor(plan)
    worst = row_regimes_against_oracle(ex, g, w, rng, tie=0.0 if precision == "high" else 2 * bound)
    ex.close()
    print(f"bf16 llama (fast schedules, matmul precision {precision}) on cuda:0: max |dlogit| {worst:.2g}")
    assert worst < bound


@pytest.mark.parametrize("precision,bound", [("high", 0.1), ("highest", 2e-3)])
def test_q4_k_model_on_the_fast_schedules_matches_the_oracle(cuda, tmp_path, rng, precision, bound, monkeypatch):
    """A Q4_K Llama GGUF (poot's quantizer, f32 norms; its head and last down projection Q6_K, as in
    Q4_K_M files) in every row-count regime: its products of up to four rows through the Q4_K and
    Q6_K warp GEMVs (x meeting the quants as two int8 terms, about 15 bits; the head's K of 256 a
    warp a feature through its dequantization body; on Hopper its one-row steps fold the RMSNorms
    between two Q4_K products into them, ``norm_fold``). Beyond four rows at "high" (the integer
    tensor cores off: ``test_q4_k_model_on_the_integer_tensor_cores_matches_the_oracle``), on tensor cores,
    the weights dequantized to bf16 in registers (Q4_K and the Q6_K down projection, K 512, up
    to 64 rows; Q4_K from 33 on Hopper in workgroup memory for the warpgroup GEMM) or into scratch memory
    (the Q6_K head, K 256, and every weight beyond 64 rows), x as two
    bf16 terms: the weights rounded to bf16, a bound as loose as matmul precision "medium"'s (the
    argmax may differ where the oracle's top two logits are within twice it), for decode steps too,
    which read keys and values the prefill wrote; at "highest" the register-tiled f32 GEMM, which
    dequantizes exactly, so the GEMVs are held to the tight bound. Against the oracle on gguf's
    dequantization."""
    from poot_ptx import schedules
    from poot_ptx.executor import CudaExecutor

    monkeypatch.setattr(schedules, "IMMA_ROWS", 4)

    names, errors = wide_q4_k_llama_regimes(cuda, CudaExecutor, tmp_path / "q4k", rng, precision, tie=2 * bound)
    gemvs = {"gemv_warp_q4_k", "gemv_warp_glu_q4_k", "gemv_warp_3x_q4_k", "gemv_warp_q6_k", "gemv_warp_packed_q6_k"}
    more = (
        {"gemm_warp_q4_k", "gemm_warp_q6_k", "dequantize_bf16_q4_k", _tiled(cuda), "dequantize_bf16_q6_k", "gemm_warp_bf16"}
        if precision == "high"
        else {"gemm_simt_q4_k"}
    )
    if precision == "high" and "wgmma" in cuda.capabilities.matrix_ops:
        more.add("gemm_wgmma_q4_k")  # 33-64 rows
    if "wgmma" in cuda.capabilities.matrix_ops:  # one row on Hopper: the RMSNorms between one-row products folded into them
        more |= {"matmul+add_rms_norm", "3 matmuls+rms", "gated_mlp+quantize_x+rms"}
    assert gemvs | more <= names, names
    worst = max(e for _, e in errors)
    print(f"q4_k llama (matmul precision {precision}) on cuda:0: max |dlogit| {worst:.2g}, by rows {errors}")
    assert worst < bound


@pytest.mark.parametrize("q6", [False, True])
def test_q4_k_model_on_the_integer_tensor_cores_matches_the_oracle(cuda, tmp_path, rng, monkeypatch, q6):
    """The same model as the planner has it: Q4_K products of 5 to 64 rows on the integer tensor
    cores (``gemm_imma_q4_k_xs``, K split where the output's tiles are few), x quantized to two
    int8 terms by the launch that computes it (the RMSNorms, the decode attention; the down
    projection's by the gated product, ``glu_q8``); with ``q6`` the Q6_K down projection (K 512) too
    (``gemm_imma_q6_k_xs``; without, Q6_K taken out of ``IMMA_XS``); within the same bound, every step's argmax
    the oracle's (but near-ties)."""
    from poot_ptx import schedules
    from poot_ptx.executor import CudaExecutor

    if not q6:
        monkeypatch.delitem(schedules.IMMA_XS, "q6_k")
    names, errors = wide_q4_k_llama_regimes(cuda, CudaExecutor, tmp_path / "q4k", rng, "high", tie=0.2)
    assert {"gemm_imma_q4_k_xs", "glu_q8", "glu_split", "sum_parts", "rms_norm+quantize_x", "add_rms_norm+quantize_x"} <= names, names
    assert ("gemm_imma_q6_k_xs" in names) == q6, names
    worst = max(e for _, e in errors)
    print(f"q4_k llama on the integer tensor cores (5-64 rows) on cuda:0: max |dlogit| {worst:.2g}, by rows {errors}")
    assert worst < 0.1
