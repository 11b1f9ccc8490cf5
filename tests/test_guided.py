"""Guided decoding: every sequence produced by walking random allowed tokens to the end is accepted by
an independent checker (jsonschema, re, lark, membership), 200 walks per kind, on SmolLM2's vocabulary."""

from __future__ import annotations

import json
import re

import jsonschema
import lark
import numpy as np
import pytest

from poot.load import open_checkpoint
from poot.text import Tokenizer
from poot.text.guided import ConstraintCompiler, ConstraintError

WALKS = 200


@pytest.fixture(scope="module")
def compiler(smollm2_path):
    return ConstraintCompiler(Tokenizer.from_gguf(open_checkpoint(smollm2_path).metadata))


def walk(c, rng, limit=600):
    """Random allowed tokens until an end token; ends are taken half the time they are allowed."""
    c.start()
    stops = sorted(c.compiler.stop_ids)
    for _ in range(limit):
        mask = c.mask()
        allowed = np.nonzero(mask)[0]
        assert allowed.size, "a live constraint allowed no token"
        ends = [t for t in stops if mask[t]]
        tok = int(rng.choice(ends)) if ends and rng.random() < 0.5 else int(rng.choice(allowed))
        c.advance(tok)
        if c.is_finished():
            body = c.tokens[:-1]
            assert c.tokens[-1] in stops
            return c.compiler.tokenizer.decode(body)
    raise AssertionError(f"walk did not finish in {limit} tokens: {c.compiler.tokenizer.decode(c.tokens)[:200]!r}")


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number", "minimum": -1, "maximum": 1},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
        "nested": {
            "type": "object",
            "properties": {"x": {"type": ["integer", "null"], "maximum": 99, "minimum": -99}},
            "required": ["x"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_walks_validate(compiler, rng):
    c = compiler.json_schema(SCHEMA)
    for _ in range(WALKS):
        text = walk(c, rng)
        jsonschema.validate(json.loads(text), SCHEMA)


REGEXES = [
    r"[a-z]{2,6}-\d{1,3}",
    r"(yes|no)( please)?",
    r"\(\d{3}\) \d{3}-\d{4}",
    r"[A-Z][a-z]{0,8}( [A-Z][a-z]{0,8}){0,2}\.",
    r"0x[0-9a-fA-F]{1,8}",
    r"\w{1,5}\s\w{1,5}",
    r"[αβγ]{1,3}[^a-z\s]{0,2}",
]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_walks_match(compiler, rng, pattern):
    c = compiler.regex(pattern)
    for _ in range(WALKS // len(REGEXES) + 1):
        text = walk(c, rng)
        assert re.fullmatch(pattern, text, re.ASCII), (pattern, text)


# recursion is bounded: a random walk through unbounded nesting never closes its brackets
GRAMMAR = r"""
start: expr
expr: term (OP term)? (OP term)?
term: NUMBER | "(" inner ")" | FUNC "(" inner ")"
inner: NUMBER (OP NUMBER)?
OP: "+" | "-" | "*"
FUNC: "neg" | "abs"
NUMBER: /[0-9]{1,3}/
"""


def test_lark_grammar_walks_parse(compiler, rng):
    c = compiler.grammar(GRAMMAR)
    parser = lark.Lark(GRAMMAR, start="start")
    for _ in range(WALKS):
        parser.parse(walk(c, rng))


def test_gbnf_grammar_walks_match(compiler, rng):
    c = compiler.grammar('root ::= "color: " ("red" | "green") (", " [0-9]+)?', syntax="gbnf")
    for _ in range(WALKS // 4):
        text = walk(c, rng)
        assert re.fullmatch(r"color: (red|green)(, [0-9]+)?", text), text


def test_choice_walks_are_members(compiler, rng):
    options = ["yes", "no", "maybe so", "I don't know", "日本"]
    c = compiler.choice(options)
    seen = set()
    for _ in range(WALKS):
        text = walk(c, rng)
        assert text in options
        seen.add(text)
    assert len(seen) >= 4


def test_disallowed_tokens_and_bad_constraints_are_errors(compiler):
    c = compiler.regex(r"[0-9]+")
    c.start()
    letter = compiler.tokenizer.encode("a", add_special_tokens=False)[0]
    assert not c.mask()[letter]
    with pytest.raises(ConstraintError, match="rejected"):
        c.advance(letter)
    with pytest.raises(ConstraintError, match="regex"):
        compiler.regex("([unclosed")
    with pytest.raises(ConstraintError, match="JSON schema is not valid JSON"):
        compiler.json_schema("{not json")
    with pytest.raises(ConstraintError):
        compiler.grammar("start: undefined_rule")
    with pytest.raises(ConstraintError, match="non-empty"):
        compiler.choice([])


@pytest.mark.parametrize(
    ("pattern", "says"),
    [(r"[^\s\S]", "no text can match it"), (r"[a&&b]x(?!y)", "look-around, including look-ahead and look-behind, is not supported")],
)
def test_a_regex_nothing_can_follow_is_refused_in_one_line(compiler, pattern, says, recwarn):
    """An unsatisfiable or unsupported regex is refused when compiled, in one line that says why:
    not llguidance's parser state and grammar (two dozen lines), and no Python FutureWarning."""
    with pytest.raises(ConstraintError) as e:
        compiler.regex(pattern)
    assert says in str(e.value) and "\n" not in str(e.value) and "<state>" not in str(e.value)
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_mask_and_bitmask_agree(compiler):
    c = compiler.json_schema(SCHEMA)
    c.start()
    bits = c.bitmask()
    mask = c.mask()
    assert bits.dtype == np.int32 and bits.size == (compiler.vocab_size + 31) // 32
    expanded = np.unpackbits(bits.view(np.uint8), bitorder="little")[: compiler.vocab_size].astype(bool)
    np.testing.assert_array_equal(mask, expanded)
    first = {compiler.tokenizer.decode([int(t)]) for t in np.nonzero(mask)[0]}
    assert first and all(t.startswith("{") for t in first)  # compact JSON: the brace first, no whitespace
