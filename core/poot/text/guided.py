"""Guided decoding: constraints compiled against a tokenizer into per-step token masks.

Built on llguidance (Microsoft's Rust engine behind Guidance): it takes JSON schemas, regular
expressions and Lark grammars natively (GBNF is converted to Lark), computes a mask in tens of
microseconds with no GPU or torch dependency, and matches token bytes exactly, so byte-fallback and
multi-token characters are handled. xgrammar was the alternative; it brings a heavier dependency
chain and no Lark front end.

The API is what the driver and the server use: ``start()``, ``mask()`` for the next token,
``advance(token)``, ``is_finished()``.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import PootError
from .tokenizer import Tokenizer

__all__ = ["ConstraintError", "Constraint", "ConstraintCompiler"]


class ConstraintError(PootError):
    """A constraint that cannot be compiled, or a token it does not allow."""


_STOP_REASONS = {
    "NoExtensionBias": "no text can match it (no token may begin a match)",
    "NoExtension": "no text can match it",
    "LexerTooComplex": "it is too large to compile (a repetition count too high?)",
}


def _matcher_error(err: str) -> str:
    """llguidance's error in one line: its parser state and grammar dump (two dozen lines) cut off,
    a bare stop reason said in words, a regex parser's caret diagram reduced to its ``error:`` line."""
    lines = [line.strip() for line in err.split("<state>", 1)[0].splitlines() if line.strip()]
    if not lines:
        return "the constraint failed"
    said = [line[len("error:") :].strip() for line in lines if line.startswith("error:")]
    if said:
        return said[0]
    return _STOP_REASONS.get(lines[0], lines[0])


class Constraint:
    """One sequence's constraint state."""

    def __init__(self, compiler: "ConstraintCompiler", grammar: str, description: str) -> None:
        import llguidance as llg

        self.compiler, self.grammar, self.description = compiler, grammar, description
        self._matcher = llg.LLMatcher(compiler.ll_tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(f"{description}: {_matcher_error(self._matcher.get_error())}")
        self._words = (compiler.vocab_size + 31) // 32
        self.tokens: list[int] = []
        self._ended = False
        # a constraint no text satisfies is refused now, with the request, not after its first token
        if not self.bitmask().any() and not self.is_accepting():
            raise ConstraintError(f"{description}: {_STOP_REASONS['NoExtension']}")

    def copy(self) -> Constraint:
        """A fresh constraint of the same grammar for another sequence, without compiling it again."""
        new = object.__new__(Constraint)
        new.compiler, new.grammar, new.description = self.compiler, self.grammar, self.description
        new._matcher = self._matcher.deep_copy()
        new._matcher.reset()
        new._words, new.tokens, new._ended = self._words, [], False
        return new

    def start(self) -> None:
        """Back to the beginning (a constraint object can serve one sequence at a time)."""
        self._matcher.reset()
        self.tokens = []
        self._ended = False

    def bitmask(self) -> np.ndarray:
        """Allowed next tokens as a packed little-endian bitmask of int32 words (the device's form)."""
        out = np.empty(self._words, dtype=np.int32)
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        if self._matcher.is_error():
            raise ConstraintError(f"{self.description}: {_matcher_error(self._matcher.get_error())}")
        return out

    def mask(self) -> np.ndarray:
        """Allowed next tokens as a bool vector over the vocabulary."""
        bits = np.unpackbits(self.bitmask().view(np.uint8), bitorder="little")
        return bits[: self.compiler.vocab_size].astype(bool)

    def advance(self, token_id: int) -> None:
        """Consume a sampled token; a token the mask did not allow is an error."""
        token_id = int(token_id)
        if self._ended:
            raise ConstraintError(f"{self.description}: already finished, token {token_id} cannot follow")
        if token_id in self.compiler.stop_ids and (self._matcher.is_stopped() or self._matcher.is_accepting()):
            self._ended = True  # an end token on complete text ends the constrained sequence
            self.tokens.append(token_id)
            return
        if self._matcher.is_stopped():
            raise ConstraintError(f"{self.description}: the text is complete; only an end token may follow, not {token_id}")
        if not self._matcher.consume_token(int(token_id)):
            err = _matcher_error(self._matcher.get_error()) if self._matcher.is_error() else "not allowed here"
            raise ConstraintError(f"{self.description}: token {token_id} ({self.compiler.tokenizer.token_bytes[token_id]!r}) rejected: {err}")
        self.tokens.append(token_id)

    def is_accepting(self) -> bool:
        """The text so far is complete (an end-of-sequence token would be allowed)."""
        return bool(self._matcher.is_accepting())

    def is_finished(self) -> bool:
        """An end token was consumed on complete text: nothing more may be generated."""
        return self._ended


class ConstraintCompiler:
    """Compiles constraints against one tokenizer (building its token table once, ~1 s)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        import llguidance as llg

        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        stops = list(tokenizer.stop_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
        self.stop_ids = frozenset(stops)
        if not stops:
            raise ConstraintError("guided decoding needs an end-of-sequence token, and this tokenizer has none")
        self.ll_tokenizer = llg.LLTokenizer(tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=stops)

    def _grammar(self, make: Any, arg: Any, what: str) -> str:
        try:
            return make(arg)
        except (ValueError, TypeError, RuntimeError) as e:
            raise ConstraintError(f"{what}: {_matcher_error(str(e))}") from None

    def json_schema(self, schema: Mapping[str, Any] | str | bool, whitespace: str = "compact") -> Constraint:
        """JSON matching ``schema``. ``whitespace='compact'`` (the default) allows exactly
        ``json.dumps``'s separators, so a model cannot wander into endless whitespace;
        ``'flexible'`` allows any JSON whitespace."""
        import llguidance as llg

        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"JSON schema is not valid JSON: {e}") from None
        if whitespace == "compact":
            opts = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        elif whitespace == "flexible":
            opts = {"whitespace_flexible": True}
        else:
            raise ConstraintError(f"whitespace must be 'compact' or 'flexible', got {whitespace!r}")
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(text, defaults=opts)
        except (ValueError, TypeError, RuntimeError) as e:
            raise ConstraintError(f"JSON schema: {e}") from None
        return Constraint(self, grammar, "JSON schema")

    def json_object(self) -> Constraint:
        """Any JSON object (OpenAI's ``response_format: json_object``)."""
        return self.json_schema({"type": "object"})

    def regex(self, pattern: str) -> Constraint:
        """Text matching ``pattern`` in full. The classes ``\\d``, ``\\w`` and ``\\s`` are ASCII-only
        (Python's ``re.ASCII``): model output such as phone numbers or identifiers should not
        match exotic Unicode digits or letters. Spell out Unicode ranges where they are wanted."""
        import llguidance as llg

        try:
            with warnings.catch_warnings():  # Python's hints about its own future syntax are not the user's concern
                warnings.simplefilter("ignore", FutureWarning)
                re.compile(pattern)
        except re.error as e:
            raise ConstraintError(f"regex {pattern!r}: {e}") from None
        try:
            lark = "start: /" + llg.regex_to_lark(pattern, "dws") + "/"
        except (ValueError, RuntimeError) as e:
            raise ConstraintError(f"regex {pattern!r}: {e}") from None
        return Constraint(self, self._grammar(llg.LLMatcher.grammar_from_lark, lark, f"regex {pattern!r}"), f"regex {pattern!r}")

    def grammar(self, source: str, syntax: str = "lark") -> Constraint:
        """A Lark grammar (``start`` rule), or a GBNF (llama.cpp) grammar with ``syntax='gbnf'``."""
        import llguidance as llg

        if syntax == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                source = gbnf_to_lark(source)
            except Exception as e:  # noqa: BLE001 - the converter raises assorted errors
                raise ConstraintError(f"GBNF grammar: {e}") from None
        elif syntax != "lark":
            raise ConstraintError(f"grammar syntax must be 'lark' or 'gbnf', got {syntax!r}")
        return Constraint(self, self._grammar(llg.LLMatcher.grammar_from_lark, source, "grammar"), f"{syntax} grammar")

    def choice(self, options: Sequence[str]) -> Constraint:
        if not options or not all(isinstance(o, str) and o for o in options):
            raise ConstraintError("a choice constraint needs a non-empty list of non-empty strings")
        lark = "start: " + " | ".join(json.dumps(o) for o in options)
        return self.grammar(lark)
