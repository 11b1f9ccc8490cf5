"""What a model family's tests check, shared by the family plugins: a synthetic checkpoint built by
transformers' own model class, and a real checkpoint, each against transformers' forward of the same
weights, through the oracle over a paged KV pool; and which synthetic cases a family serves.

transformers (with torch) is the oracle: the callers skip where it is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..eval.model import PagedOracle, oracle_weights
from ..load import open_checkpoint
from ..models import StepShapes, family_for
from .paged import PagedSequences
from .references import hf_model
from .synthetic import SYNTHETIC, build_synthetic

__all__ = [
    "assert_registered",
    "assert_hf_names_map",
    "synthetic_cases",
    "check_synthetic",
    "check_real_checkpoint",
    "REAL_PROMPTS",
    "SYNTHETIC_ATOL",
    "REAL_BOUND",
]

# f32 on both sides with the same weights: only summation order differs (measured ~5e-6 on logits
# of magnitude ~4); 1e-4 leaves room for it and still catches any real difference
SYNTHETIC_ATOL = 1e-4
REAL_PROMPTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome. The capital of Portugal is Lisbon, and the capital of Spain is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint(fibonacci(10))  # prints",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woman who kept bees. Every morning, before the sun rose over the hills, she",
]
# Both sides use the same dequantized weights in float32; only summation order differs. Measured:
# 9e-5 (SmolLM2), 4e-5 (Gemma 3). The bound is 10x that and far below any top-1/top-2 gap we rely on.
REAL_BOUND = 1e-3


def assert_registered(family: Any, plugin: str, distribution: str) -> None:
    """``family``'s plugin loaded from its own distribution, and every architecture it names found
    back to a family of its class."""
    from ..plugins import host

    info = {i.name: i for i in host().infos}[plugin]
    assert info.status == "loaded" and info.distribution == distribution, info
    assert all(isinstance(family_for(a), type(family)) for a in family.gguf_architectures + family.hf_architectures)


def assert_hf_names_map(family: Any, table: Mapping[str, Any]) -> None:
    """Each Hugging Face tensor name of ``table`` maps to its role (a ``poot.load.roles.Role``) with
    ``family``'s ``hf_tensor_names``, and none is left unknown."""
    from ..load.roles import WeightMap

    class _Named:  # roles look at names only
        def __init__(self, name: str) -> None:
            self.name = name

    wm = WeightMap.from_hf({n: _Named(n) for n in table}, "test", family.hf_tensor_names)  # type: ignore[misc]
    assert not wm.unknown, wm.unknown
    for name, role in table.items():
        assert wm.tensors[role].name == name


def synthetic_cases(hf_architectures: tuple[str, ...]) -> list[str]:
    """The synthetic cases (``SYNTHETIC``) whose transformers class is one of ``hf_architectures``."""
    return sorted(name for name, (_, cls, _) in SYNTHETIC.items() if cls in hf_architectures)


def check_synthetic(name: str, directory: Path, rng: np.random.Generator) -> float:
    """Synthetic case ``name`` (fresh random weights) against transformers: a batch of two sequences of
    different lengths sharing one paged KV pool through shuffled slots, over a prefill step, a
    decode step and a mixed step (one sequence's chunk next to the other's decode token); the
    oracle's logits within ``SYNTHETIC_ATOL`` at every position and the same top-1. Returns the
    largest difference."""
    import torch
    import transformers

    tmp_path = directory
    seed = int(rng.integers(0, 2**31))
    path = build_synthetic(name, tmp_path / name, seed)
    ck = open_checkpoint(path)
    assert not ck.weights.unknown, ck.weights.unknown
    fam = family_for(ck.architecture)
    cfg = fam.parse_config(ck)
    vocab = cfg.vocab_size
    model = PagedOracle(fam.trace(cfg, ck.weights, StepShapes(block_size=4)), oracle_weights(ck.weights), num_blocks=24)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()

    la, lb = int(rng.integers(9, 17)), int(rng.integers(3, 8))
    a = [int(t) for t in rng.integers(0, vocab, la + 4)]
    b = [int(t) for t in rng.integers(0, vocab, lb + 2)]
    pages = PagedSequences(24, 4, rng)  # small blocks: sequences span several shuffled blocks
    pages.add(), pages.add()
    got: dict[int, list[np.ndarray]] = {0: [], 1: []}

    def run(chunks):
        batch = pages.step(chunks, all_logits=True)
        logits = model.step(batch)
        for s in (0, 1):
            got[s].extend(logits[batch.seq_ids == s])

    run([a[:la], b[:lb]])  # prefill both
    run([a[la : la + 1], b[lb : lb + 1]])  # decode one token each
    run([a[la + 1 :], b[lb + 1 :]])  # a 3-token chunk next to a decode token
    worst = 0.0
    for s, toks in ((0, a), (1, b)):
        with torch.no_grad():
            want = ref(torch.tensor([toks])).logits[0].numpy()
        mine = np.stack(got[s])
        assert mine.shape == want.shape
        np.testing.assert_allclose(mine, want, atol=SYNTHETIC_ATOL, rtol=0, err_msg=f"{name} sequence {s}")
        assert (mine.argmax(-1) == want.argmax(-1)).all()
        worst = max(worst, float(np.abs(mine - want).max()))
    print(f"{name}: max |dlogit| {worst:.2g} over {len(a) + len(b)} positions")
    return worst


def check_real_checkpoint(path: Any, which: str, rng: np.random.Generator) -> float:
    """A real checkpoint on the oracle against transformers loading the same GGUF (dequantized,
    float32): ``REAL_PROMPTS`` (32+ tokens each) as one batch in one paged pool; the top-1 token equal
    at every position and the largest logit difference within ``REAL_BOUND``. Returns it."""
    import torch

    ck = open_checkpoint(path)
    fam = family_for(ck.architecture)
    cfg = fam.parse_config(ck)
    tok = fam.tokenizer(ck)
    prompts = [tok.encode(p) for p in REAL_PROMPTS]
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
    assert worst < REAL_BOUND
    return worst
