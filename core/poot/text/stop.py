"""Stop strings that match across token boundaries.

Text is held back while its end could still be the start of a stop string, so a client never sees
part of a stop string that then completes; on a match, the text before it is released and the
sequence ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["StopMatcher", "StopResult"]


@dataclass(frozen=True)
class StopResult:
    text: str  # safe to emit now
    stopped: bool  # a stop string matched; ``text`` ends just before it
    stop: str | None = None  # which one


class StopMatcher:
    """Stop strings matched over a stream of text pieces. Each stop string carries how much of its
    start the text ends with (a KMP automaton's state, advanced a character at a time), so what is
    held back costs nothing to find again: a piece costs its length times the number of stop
    strings, however long they are and however much text is held."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._fail = [_failure(s) for s in self.stops]
        self._state = [0] * len(self.stops)  # per stop string: the length of its start the text ends with
        self._held = ""
        self.done = False

    def feed(self, piece: str) -> StopResult:
        if self.done:
            return StopResult("", True)
        buf = self._held + piece
        first: tuple[int, str] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        if first is not None:
            self.done, self._held = True, ""
            return StopResult(buf[: first[0]], True, first[1])
        for j, s in enumerate(self.stops):  # (no stop string occurs in the text: no state reaches its length)
            fail, q = self._fail[j], self._state[j]
            for ch in piece:
                while q and s[q] != ch:
                    q = fail[q - 1]
                if s[q] == ch:
                    q += 1
            self._state[j] = q
        keep = min(max(self._state, default=0), len(buf))  # the longest end of buf that begins some stop string
        self._held = buf[len(buf) - keep :] if keep else ""
        return StopResult(buf[: len(buf) - keep], False)

    def flush(self) -> str:
        """At the end of generation (no stop matched): release what was held back."""
        out, self._held = self._held, ""
        return out


@lru_cache(maxsize=256)
def _failure(s: str) -> tuple[int, ...]:
    """KMP's failure function of ``s``: for each prefix, the length of its longest proper border.
    Kept for the strings asked for lately: a request's sequences (``n``, several prompts) share them."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return tuple(fail)
