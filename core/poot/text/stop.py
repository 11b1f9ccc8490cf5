"""Stop strings that match across token boundaries.

Text is held back while its end could still be the start of a stop string, so a client never sees
part of a stop string that then completes; on a match, the text before it is released and the
sequence ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["StopMatcher", "StopResult"]


@dataclass(frozen=True)
class StopResult:
    text: str  # safe to emit now
    stopped: bool  # a stop string matched; ``text`` ends just before it
    stop: str | None = None  # which one


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
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
        keep = 0  # the longest end of buf that begins some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return StopResult(buf[: len(buf) - keep], False)

    def flush(self) -> str:
        """At the end of generation (no stop matched): release what was held back."""
        out, self._held = self._held, ""
        return out
