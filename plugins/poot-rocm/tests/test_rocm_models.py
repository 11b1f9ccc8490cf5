"""Whole models on rocm:0 through the AQL executor, against the CPU oracle: synthetic families over
prefill and decode steps, the wide bf16 and Q4_K_M Llamas in every row-count regime, and SmolLM2's
and Gemma 3's greedy tokens equal to the CPU device's. They run on an AMD GPU
(``scripts/rocm-check``) and skip, with the device's reason, everywhere else."""

from __future__ import annotations

import pytest

from poot.plan import compile_plan
from poot.testing.fixtures import device_or_skip
from poot.testing.paged import row_regimes_against_oracle, synthetic_graph, two_sequences_against_oracle, wide_bf16_llama, wide_q4_k_llama_regimes


@pytest.fixture(scope="module")
def rocm():
    return device_or_skip("rocm:0")


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3", "deepseek_v2"])
def test_families_on_rocm_match_the_oracle(rocm, name, tmp_path, rng):
    from poot_rocm.executor import RocmExecutor

    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)))
    ex = RocmExecutor(compile_plan(g, rocm))
    worst = two_sequences_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"{name} on rocm:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-4


def test_bf16_model_in_every_row_regime_matches_the_oracle(rocm, tmp_path, rng):
    from poot_rocm.executor import RocmExecutor

    g, w = wide_bf16_llama(tmp_path / "wide", int(rng.integers(0, 2**31)))
    ex = RocmExecutor(compile_plan(g, rocm))
    worst = row_regimes_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"bf16 llama on rocm:0: max |dlogit| {worst:.2g}")
    assert worst < 1e-3


def test_q4_k_m_model_in_every_row_regime_matches_the_oracle(rocm, tmp_path, rng):
    from poot_rocm.executor import RocmExecutor

    _, errors = wide_q4_k_llama_regimes(rocm, RocmExecutor, tmp_path / "q4km", rng)
    print(f"q4_k_m llama on rocm:0: |dlogit| by rows {errors}")
    assert max(e for _, e in errors) < 2e-3


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_greedy_tokens_equal_the_cpu_device(rocm, model, smollm2_path, gemma3_path):
    import poot
    from poot.llm.params import SamplingParams

    path = smollm2_path if model == "smollm2" else gemma3_path
    prompt = None
    tokens = {}
    for device in ("cpu", "rocm:0"):
        m = poot.load(str(path), device, max_seqs=1, max_context=128, progress=False)
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
    assert tokens["rocm:0"] == tokens["cpu"]
