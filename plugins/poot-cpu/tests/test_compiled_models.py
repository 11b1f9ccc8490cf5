"""Whole models compiled for the host and run by the CPU executor as captured steps (two threads):
logits equal the oracle's over a prefill step of two sequences of different lengths in one paged pool
(shuffled blocks) and decode steps that replay one captured step with new inputs. Every synthetic
family (dense, MoE, MLA) and both real checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from poot.eval.model import PagedOracle, oracle_weights
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.plan import Limits
from poot.plan.lower import plan_graph
from poot.testing.paged import PagedSequences
from poot.testing.synthetic import SYNTHETIC
from poot_cpu.device import host_device
from poot_cpu.executor import HostExecutor

# f32 on both sides; reduction orders differ (lane sums in kernels, pairwise in numpy), and the real
# models' logits are ~20 in magnitude after 30 layers: bounds are ~10x the worst seen. At matmul
# precision "high" (the default) Q4_0/Q4_1/Q5_0/Q8_0 products take x as two int8 terms (about 15
# bits a value: docs/NUMERICS.md), which moved real logits by up to 0.008 (SmolLM2) and pools by 3e-3
ATOL = {"synthetic": 1e-4, "real": 5e-4, "real-int8": 0.03}
# f16 KV pools: a key or value whose f32 projection differs in its last bits may round to the
# neighbouring half (a relative step of 2**-11) on one side only, which moves logits by ~1e-4
ATOL_F16_KV = 2e-3


def _limits(precision: str) -> Limits:
    """The host's matrix operations (VNNI: integer products at "high") and ``precision``."""
    return Limits(matrix=host_device().capabilities.matrix_ops, matmul_precision=precision)


def run_both(ck, rng, prompts, steps=2, block=16, cache_dtype="f32", tie=0.0, precision="high"):
    """Logits of the compiled model against the oracle's over a prefill and ``steps`` greedy decode
    steps: the largest |difference|, after checking the argmax agrees in rows whose top two logits
    are more than ``tie`` apart."""
    fam = family_for(ck.architecture)
    cfg = fam.parse_config(ck)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(cfg, ck.weights, StepShapes(block_size=block, cache_dtype=cache_dtype)))
    ex = HostExecutor(plan_graph(g, limits=_limits(precision)), threads=2)
    w = oracle_weights(ck.weights)
    oracle = PagedOracle(g, w, num_blocks=24)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    assert all(p.dtype == np.dtype({"f32": np.float32, "f16": np.float16}[cache_dtype]) for p in pools.values())
    pages = PagedSequences(24, block, rng)
    for _ in prompts:
        pages.add()
    chunks = [list(p) for p in prompts]
    worst = 0.0
    for step in range(steps + 1):
        batch = pages.step(chunks, all_logits=step == 0)
        got = ex.run({**batch.as_inputs(), **pools}, w)["logits"]
        want = oracle.step(batch)
        assert got.shape == want.shape and np.isfinite(got).all()
        top2 = np.sort(want, axis=-1)[:, -2:]
        assert (got.argmax(-1) == want.argmax(-1))[top2[:, 1] - top2[:, 0] > tie].all()
        worst = max(worst, float(np.abs(got - want).max()))
        last = [np.nonzero(batch.seq_ids[batch.logit_rows] == s)[0][-1] for s in range(len(prompts))]
        chunks = [[int(want[r].argmax())] for r in last]  # greedy continuation, one token per sequence
    # summation orders differ, and later layers inherit earlier differences (f16: a value may also round
    # to the neighbouring half); a pool written in the wrong type or place would be off by far more
    rtol, atol = {"f32": (1e-3, 1e-3), "f16": (2.0**-8, 1e-3)}[cache_dtype]
    atol *= 1 if precision == "highest" else 10
    for name, p in pools.items():  # the executor wrote the pools: the oracle's values, in the pools' type
        written = np.isfinite(oracle.pools[name])
        got, want = p[written].astype(np.float32), oracle.pools[name][written].astype(np.float32)
        assert written.any() and np.allclose(got, want, rtol=rtol, atol=atol), f"{name}: {np.abs(got - want).max()}"
    return worst


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_families_match_the_oracle(name, tmp_path, rng):
    from poot.testing.synthetic import build_synthetic

    ck = open_checkpoint(build_synthetic(name, tmp_path / name, int(rng.integers(0, 2**31))))
    worst = run_both(ck, rng, [rng.integers(0, 97, 11).tolist(), rng.integers(0, 97, 4).tolist()], block=4)
    print(f"{name}: max |dlogit| {worst:.2g}")
    assert worst < ATOL["synthetic"]


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3", "qwen2_moe", "deepseek_v2"])
def test_f16_kv_pools_match_the_oracle(name, tmp_path, rng):
    """KV pools of f16 (``kv_dtype="f16"``): the cache writes round each key and value to the nearest
    half as the oracle's pools do (the pools come out equal, bit for bit), attention widens them as
    it reads, and the logits equal the oracle's (MLA's shared key part, Gemma's sliding windows and
    soft-capping included)."""
    from poot.testing.synthetic import build_synthetic

    ck = open_checkpoint(build_synthetic(name, tmp_path / name, int(rng.integers(0, 2**31))))
    worst = run_both(ck, rng, [rng.integers(0, 97, 11).tolist(), rng.integers(0, 97, 4).tolist()], block=4, cache_dtype="f16", tie=ATOL_F16_KV)
    print(f"{name} f16 KV: max |dlogit| {worst:.2g}")
    assert worst < ATOL_F16_KV


@pytest.mark.parametrize("name", ["llama-tied", "phi3", "qwen2_moe", "deepseek_v3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_checkpoints_are_read_as_stored(name, dtype, tmp_path, rng):
    """bf16/f16 checkpoints: projection weights are bound as their 16-bit storage and widened by the
    product (no f32 copy of them exists anywhere), and the logits still equal the oracle's."""
    from poot.plan.memory import stored_nbytes
    from poot.testing.synthetic import build_synthetic

    ck = open_checkpoint(build_synthetic(name, tmp_path / name, int(rng.integers(0, 2**31)), dtype=dtype))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4)))
    mm = [n for n in g.nodes if n.op == "matmul" and n.inputs[1].node.op == "weight"]
    assert mm and all(n.inputs[1].dtype.name == {"bfloat16": "bf16", "float16": "f16"}[dtype] for n in mm)
    assert all(stored_nbytes(n.inputs[1]) == 2 * int(np.prod([d.value for d in n.inputs[1].shape])) for n in mm)
    worst = run_both(ck, rng, [rng.integers(0, 97, 11).tolist(), rng.integers(0, 97, 4).tolist()], block=4)
    print(f"{name} {dtype}: max |dlogit| {worst:.2g}")
    assert worst < ATOL["synthetic"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_smollm2_compiled_matches_the_oracle(smollm2_path, rng, precision):
    """ "highest": every product in f32 from the dequantized weights; "high": Q4_1 and Q8_0 products
    in integers against x quantized to two int8 terms."""
    from poot.text import Tokenizer

    ck = open_checkpoint(smollm2_path)
    tok = Tokenizer.from_gguf(ck.metadata)
    worst = run_both(ck, rng, [tok.encode("The capital of France is"), tok.encode("def add(a, b):\n    return")], precision=precision)
    print(f"SmolLM2 at {precision}: max |dlogit| {worst:.2g}")
    assert worst < ATOL["real" if precision == "highest" else "real-int8"]


@pytest.mark.slow
def test_gemma3_compiled_matches_the_oracle(gemma3_path, rng):
    from poot.models import family_for

    ck = open_checkpoint(gemma3_path)
    tok = family_for(ck.architecture).tokenizer(ck)
    worst = run_both(ck, rng, [tok.encode("The capital of France is"), tok.encode("Once upon a time")], steps=2)
    print(f"Gemma 3: max |dlogit| {worst:.2g}")
    assert worst < ATOL["real-int8"]


def test_q4_k_gguf_in_every_row_regime_matches_the_oracle(tmp_path, rng):
    """The Q4_K Llama GGUF that the CUDA model tests run (poot's quantizer, f32 norms), on the host's
    schedules in every row-count regime, against the oracle on gguf's dequantization: at "high" its
    Q4_K and Q6_K products take x as two int8 terms (synthetic logits of order 1: 6e-4 seen), at
    "highest" f32."""
    from poot.testing.paged import row_regimes_against_oracle, wide_q4_k_llama

    g, w = wide_q4_k_llama(tmp_path / "q4k", int(rng.integers(0, 2**31)))
    for precision, bound in (("high", 5e-3), ("highest", ATOL["synthetic"])):
        ex = HostExecutor(plan_graph(g, limits=_limits(precision)), threads=2)
        worst = row_regimes_against_oracle(ex, g, w, rng)
        print(f"q4_k llama on the host at {precision}: max |dlogit| {worst:.2g}")
        assert worst < bound, precision
