"""Every family on a synthetic checkpoint built by transformers' own model class: the oracle's logits
match transformers' forward of the same weights at every position, for a batch of two sequences of
different lengths sharing one paged KV pool through shuffled slots, over a prefill step, a decode
step and a mixed step (one sequence's chunk next to the other's decode token)."""

from __future__ import annotations

import numpy as np
import pytest

from poot.eval.model import PagedOracle, oracle_weights
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.testing.paged import PagedSequences
from poot.testing.synthetic import SYNTHETIC, build_synthetic

torch = pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
transformers = pytest.importorskip("transformers")

# f32 on both sides with the same weights: only summation order differs (measured ~5e-6 on logits
# of magnitude ~4); 1e-4 leaves room for it and still catches any real difference
ATOL = 1e-4


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_family_matches_transformers_in_a_paged_batch(name, tmp_path, rng):
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
        np.testing.assert_allclose(mine, want, atol=ATOL, rtol=0, err_msg=f"{name} sequence {s}")
        assert (mine.argmax(-1) == want.argmax(-1)).all()
        worst = max(worst, float(np.abs(mine - want).max()))
    print(f"{name}: max |dlogit| {worst:.2g} over {len(a) + len(b)} positions")


def test_unknown_architecture_names_families_and_the_hook(tmp_path):
    from poot.models.family import UnknownArchitecture
    from poot.testing.checkpoints import write_gguf

    write_gguf(tmp_path / "m.gguf", "mamba", {}, [("token_embd.weight", "f32", (4, 32), np.ones((4, 32), np.float32))])
    ck = open_checkpoint(tmp_path / "m.gguf")
    with pytest.raises(UnknownArchitecture, match=r"'mamba'.*llama \(llama, mistral.*gemma.*poot_model_families"):
        family_for(ck.architecture)
