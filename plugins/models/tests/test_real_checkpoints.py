"""The real checkpoints on the CPU oracle against transformers loading the same GGUF (dequantized,
float32): three prompts of 32+ tokens run as one batch in one paged pool; the top-1 token is equal at
every position and the largest logit difference is reported and bounded."""

from __future__ import annotations

import numpy as np
import pytest

from poot.eval.model import PagedOracle, oracle_weights
from poot.load import open_checkpoint
from poot.models import family_for
from poot.testing.paged import PagedSequences
from poot.testing.references import hf_model

torch = pytest.importorskip("torch", reason="transformers (with torch) is the oracle for real checkpoints")
transformers = pytest.importorskip("transformers")

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome. The capital of Portugal is Lisbon, and the capital of Spain is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint(fibonacci(10))  # prints",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woman who kept bees. Every morning, before the sun rose over the hills, she",
]
# Both sides use the same dequantized weights in float32; only summation order differs. Measured:
# 9e-5 (SmolLM2), 4e-5 (Gemma 3). The bound is 10x that and far below any top-1/top-2 gap we rely on.
BOUND = 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_oracle_matches_transformers_on_real_gguf(which, request, rng):
    path = request.getfixturevalue(f"{which}_path")
    ck = open_checkpoint(path)
    fam = family_for(ck.architecture)
    cfg = fam.parse_config(ck)
    tok = fam.tokenizer(ck)
    prompts = [tok.encode(p) for p in PROMPTS]
    assert all(len(p) >= 32 for p in prompts), [len(p) for p in prompts]
    model = PagedOracle(fam.trace(cfg, ck.weights), oracle_weights(ck.weights), num_blocks=32)
    pages = PagedSequences(32, 16, rng)
    for _ in prompts:
        pages.add()
    batch = pages.step(prompts, all_logits=True)
    logits = model.step(batch)
    ref = hf_model(path)
    worst = 0.0
    for s, ids in enumerate(prompts):
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].numpy()
        mine = logits[batch.seq_ids == s]
        assert (mine.argmax(-1) == want.argmax(-1)).all(), f"{which} prompt {s}: top-1 differs at {np.nonzero(mine.argmax(-1) != want.argmax(-1))[0]}"
        worst = max(worst, float(np.abs(mine - want).max()))
    print(f"{which}: max |dlogit| = {worst:.3g} over {sum(map(len, prompts))} positions")
    assert worst < BOUND
