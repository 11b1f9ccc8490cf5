"""Tokenizers built from GGUF metadata against transformers' tokenizer loaded from the same GGUF:
encode and decode agree exactly over 2,000+ strings (unicode, emoji, CJK, code, whitespace runs,
digits, special-token text) and over random id sequences, for both real checkpoints."""

from __future__ import annotations

import pytest

from poot.load import open_checkpoint
from poot.models import family_for
from poot.testing.corpus import text_corpus
from poot.testing.references import hf_tokenizer
from poot.text import Tokenizer

transformers = pytest.importorskip("transformers", reason="transformers is the tokenizer oracle (pip install -r requirements-dev.txt)")


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def pair(request):
    path = request.getfixturevalue(f"{request.param}_path")
    ck = open_checkpoint(path)
    ours = family_for(ck.architecture).tokenizer(ck)  # Gemma's family says how its vocabulary spells spaces
    ref = hf_tokenizer(path)
    return request.param, ours, ref


def test_encode_and_decode_agree_on_the_corpus(pair, rng):
    name, ours, ref = pair
    specials = [ours.token_text(i) for i in sorted(ours.special_ids)][:40] + [ours.token_text(i) for i in ours.eot_ids]
    corpus = text_corpus(rng, specials, 2000)
    assert len(corpus) >= 2000
    bad = []
    for s in corpus:
        a, b = ours.encode(s), ref.encode(s)
        if a != b:
            bad.append(("encode", s, a[:12], b[:12]))
            continue
        if ours.decode(a) != ref.decode(b):
            bad.append(("decode", s, ours.decode(a), ref.decode(b)))
        if ours.encode(s, add_special_tokens=False) != ref.encode(s, add_special_tokens=False):
            bad.append(("encode-plain", s))
    assert not bad, f"{name}: {len(bad)} of {len(corpus)} differ, e.g. {bad[:3]}"


def test_decode_of_random_ids_agrees(pair, rng):
    name, ours, ref = pair
    n = ours.vocab_size
    assert n == len(ref)
    for _ in range(300):
        ids = [int(i) for i in rng.integers(0, n, size=int(rng.integers(1, 12)))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), (name, ids, skip)


def test_special_ids_and_stop_ids(pair):
    name, ours, ref = pair
    assert ours.bos_id == ref.bos_token_id and ours.eos_id == ref.eos_token_id
    if name == "smollm2":
        assert ours.token_text(ours.eos_id) == "<|im_end|>" and ours.stop_ids == (0, 2)
    else:
        assert ours.token_text(ours.eos_id) == "<eos>" and ours.token_text(max(ours.stop_ids)) == "<end_of_turn>"


def test_token_bytes_rebuild_decoded_text(pair, rng):
    name, ours, _ = pair
    table = ours.token_bytes
    assert len(table) == ours.vocab_size
    for s in text_corpus(rng, [], 300)[:300]:
        ids = ours.encode(s, add_special_tokens=False)
        assert b"".join(table[i] for i in ids).decode("utf-8", errors="replace") == ours.decode(ids), (name, s)


def test_hf_tokenizer_json_directory_agrees(pair, rng, tmp_path):
    """transformers saves its tokenizer as tokenizer.json + tokenizer_config.json; poot reads that
    directory and agrees with transformers reading it back."""
    name, _, ref = pair
    ref.save_pretrained(tmp_path)
    ours = Tokenizer.from_hf(tmp_path)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ours.bos_id == back.bos_token_id and ours.eos_id == back.eos_token_id
    for s in text_corpus(rng, ["<bos>", "<|im_start|>"], 400):
        a = ours.encode(s)
        assert a == back.encode(s), (name, s)
        assert ours.decode(a) == back.decode(a)


def test_a_long_encode_lets_other_threads_run_and_bad_text_is_a_typed_error(pair):
    """A server's event loop goes on while a long prompt is tokenized in a worker thread (the
    backend's plain encode held the GIL throughout), and a str that is no Unicode text (a lone
    surrogate, which a JSON escape can carry) is a TokenizerError naming the character."""
    import threading
    import time

    from poot.text.tokenizer import TokenizerError

    _, ours, _ = pair
    text = "hello world, and again " * 60_000
    ticks: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    t0 = time.perf_counter()
    ids = ours.encode(text)
    t1 = time.perf_counter()
    done.set()
    ticker.join()
    assert len(ids) > 100_000
    inside = [t for t in ticks if t0 < t < t1]
    assert len(inside) >= 0.3 * (t1 - t0) / 0.005, (len(inside), t1 - t0)  # the ticker ran most of the time
    with pytest.raises(TokenizerError, match="character 3"):
        ours.encode("hi \ud800 there")
