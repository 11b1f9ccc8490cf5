"""`poot run`: text from a real model compiled for the CPU device (greedy)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_poot_run_answers_with_smollm2(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "poot.cli", "run", "SmolLM2", "What is the capital of France?", "--max-tokens", "8"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "ready in" in r.stderr and "on cpu" in r.stderr


def test_generator_matches_the_oracle_greedy_tokens(smollm2_path):
    import numpy as np

    from poot.eval.model import PagedOracle, oracle_weights
    from poot.llm import SimpleGenerator
    from poot.testing.paged import PagedSequences

    gen = SimpleGenerator("SmolLM2", "cpu", max_context=64)
    ids = gen.prompt("Name a color.")
    text = "".join(gen.generate(ids, 6))
    # the same greedy tokens from the oracle, step by step
    from poot.graph.passes import DEFAULT_PASSES, PassManager
    from poot.load import open_model
    from poot.models import StepShapes

    ck = open_model("SmolLM2")
    g = PassManager(DEFAULT_PASSES).run(gen.family.trace(gen.family.parse_config(ck), ck.weights, StepShapes(block_size=16)))
    oracle = PagedOracle(g, oracle_weights(ck.weights), num_blocks=8)
    pages = PagedSequences(8, 16, np.random.default_rng(0))
    pages.add()
    chunk, out = ids, []
    for _ in range(6):
        tok = int(oracle.step(pages.step([chunk]))[0].argmax())
        if tok in gen.tokenizer.stop_ids:
            break
        out.append(tok)
        chunk = [tok]
    assert text == gen.tokenizer.decode(out, skip_special_tokens=True)
