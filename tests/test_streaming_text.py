"""Streaming detokenization concatenates to the full decode for any token sequence, and stop strings
match across token boundaries without leaking any part of the stop string."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poot.load import open_checkpoint
from poot.models import family_for
from poot.text.detok import StreamingDetokenizer
from poot.text.stop import StopMatcher


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tok(request):
    ck = open_checkpoint(request.getfixturevalue(f"{request.param}_path"))
    return family_for(ck.architecture).tokenizer(ck)


TRICKY = "日本語 🤖👍🏽 héllo  x\n\tdef f(): ü"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), skip=st.booleans())
def test_streamed_pieces_concatenate_to_the_full_decode(tok, data, skip):
    n = tok.vocab_size
    kind = data.draw(st.sampled_from(["random", "text", "byte-split"]))
    if kind == "random":
        ids = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=24))
    else:
        ids = tok.encode(TRICKY, add_special_tokens=False)
        if kind == "byte-split":  # a prefix cut mid-character, then the text again
            ids = ids[: data.draw(st.integers(1, len(ids)))] + ids
        ids += data.draw(st.lists(st.sampled_from(sorted(tok.special_ids)), max_size=2))
    d = StreamingDetokenizer(tok, skip)
    pieces = [d.push(i) for i in ids] + [d.finish()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    assert all("\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in tok.decode(ids, skip_special_tokens=skip)


def test_pieces_come_out_as_soon_as_characters_are_complete(tok):
    ids = tok.encode("a 🤖 b", add_special_tokens=False)
    d = StreamingDetokenizer(tok)
    out = [d.push(i) for i in ids]
    assert "".join(out) + d.finish() == "a 🤖 b"
    assert out[0] == "a"  # the first token is released at once


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="abcXYZ \n<>|", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    stops=st.lists(st.text(alphabet="abcXYZ \n<>|", min_size=1, max_size=5), min_size=1, max_size=3),
)
def test_stop_strings_across_piece_boundaries(text, cuts, stops):
    bounds = sorted({c for c in cuts if c < len(text)} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    m = StopMatcher(stops)
    out, matched = "", None
    for p in pieces:
        r = m.feed(p)
        out += r.text
        if r.stopped:
            matched = r.stop
            break
    if matched is None:
        out += m.flush()
    if any(s in text for s in stops):
        # the text is cut right before a stop string, and nothing emitted contains a whole one
        assert matched in stops and text.startswith(out + matched)
        assert not any(s in out for s in stops)
    else:
        assert matched is None and out == text


def _held_back(buf: str, stops: list[str]) -> int:
    """The reference: the longest end of ``buf`` that begins some stop string, by trying each."""
    return max((k for s in stops for k in range(1, min(len(s) - 1, len(buf)) + 1) if buf.endswith(s[:k])), default=0)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="ab|", max_size=6), max_size=12),
    stops=st.lists(st.text(alphabet="ab|", min_size=1, max_size=7), min_size=1, max_size=4),
)
def test_what_is_held_back_is_the_longest_start_of_a_stop_string(pieces, stops):
    """The matcher carries each stop string's automaton state across pieces instead of trying every
    start of it against the held text each piece (that had cost the square of a long stop string
    a token, on the loop every client waits on): after each piece it holds exactly what trying
    them holds, on a small alphabet where starts overlap themselves."""
    m = StopMatcher(stops)
    text = ""
    for p in pieces:
        released = len(text) - len(m._held)
        r = m.feed(p)
        text += p
        if r.stopped:
            break
        want = _held_back(text[released:], stops)
        assert m._held == text[len(text) - want :] if want else m._held == "", (text, stops, m._held)


def test_stop_holds_back_a_possible_start():
    m = StopMatcher(["</answer>"])
    assert m.feed("the answer is 4</ans").text == "the answer is 4"
    r = m.feed("wer> trailing")
    assert r.stopped and r.text == "" and r.stop == "</answer>"
    m2 = StopMatcher(["</answer>"])
    m2.feed("x</an")
    assert m2.feed("d more").text == "</and more"


def test_a_skipped_special_token_does_not_end_a_byte_run(tok):
    by_byte = {tok.token_bytes[i]: i for i in tok.byte_token_ids}
    if b"\x80" not in by_byte or not tok.special_ids:
        pytest.skip("this vocabulary has no byte-fallback tokens")
    special = min(tok.special_ids)
    ids = [by_byte[b"\x00"], special, by_byte[b"\x80"], by_byte[b"\x00"]]
    d = StreamingDetokenizer(tok, skip_special_tokens=True)
    pieces = [d.push(i) for i in ids] + [d.finish()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
