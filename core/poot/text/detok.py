"""Streaming detokenization: token ids in, text out as soon as it is final.

Each new piece is the difference between decoding a short window of recent tokens with and without
the new ones, so leading-space conventions come out right. Text that ends in an incomplete UTF-8
sequence (U+FFFD) is held back until the next token completes it, and so is a run of byte-fallback
tokens: such a run decodes as one group (an invalid run becomes one U+FFFD per byte, valid bytes
included), so its text is final only when a token of another kind follows (special tokens that are
skipped do not count: the run continues across them).
"""

from __future__ import annotations

from .tokenizer import Tokenizer

__all__ = ["StreamingDetokenizer"]

REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    """``push(id)`` returns the text that token made final; ``finish()`` flushes the rest.
    Concatenated, the pieces equal ``tokenizer.decode(all ids)``."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: decoding from here gives context for the next piece
        self._read = 0  # tokens up to here have been emitted
        self.text = ""  # everything emitted so far
        self._byte_ids = tokenizer.byte_token_ids
        # a special token that decoding drops does not end a byte run: hold it like a byte token
        self._held = self._byte_ids | frozenset(tokenizer.special_ids) if skip_special_tokens else self._byte_ids

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if token_id in self._held:
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT) and after.startswith(before):
            self._prefix, self._read = self._read, len(self.ids)
            piece = after[len(before) :]
            self.text += piece
            return piece
        return ""

    def finish(self) -> str:
        """The held-back rest: whatever the full decode has past what was already emitted."""
        full = self._decode(self.ids)
        self._prefix = self._read = len(self.ids)
        piece = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += piece
        return piece
