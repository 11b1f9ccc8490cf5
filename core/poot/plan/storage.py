"""Storage planning: activations share one arena, each placed at an offset so that values alive at the
same time never overlap and the arena stays small ("greedy by size", as TFLite's arena planner does:
the largest values first, each at the lowest offset that fits between the ones already placed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Lifetime", "ArenaPlan", "plan_arena", "live_peak"]


@dataclass(frozen=True)
class Lifetime:
    """A value that needs ``size`` bytes from step ``first`` (written) to step ``last`` (last read)."""

    key: object
    size: int
    first: int
    last: int

    def overlaps_in_time(self, other: "Lifetime") -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class ArenaPlan:
    offsets: dict[object, int]
    size: int  # bytes the arena needs (the planned peak)
    alignment: int


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def plan_arena(values: Iterable[Lifetime], alignment: int = 64) -> ArenaPlan:
    """Offsets for every value: no two values alive at the same step share a byte."""
    vals = sorted(values, key=lambda v: (-v.size, v.first, str(v.key)))
    placed: list[tuple[Lifetime, int]] = []
    offsets: dict[object, int] = {}
    top = 0
    for v in vals:
        if v.size < 0 or v.first > v.last:
            raise ValueError(f"value {v.key!r}: bad lifetime {v}")
        need = _align(v.size, alignment)
        busy = sorted((off, off + _align(o.size, alignment)) for o, off in placed if o.overlaps_in_time(v))
        at = 0
        for lo, hi in busy:
            if at + need <= lo:
                break
            at = max(at, hi)
        offsets[v.key] = at
        placed.append((v, at))
        top = max(top, at + need)
    return ArenaPlan(offsets, top, alignment)


def live_peak(values: Iterable[Lifetime], alignment: int = 64) -> int:
    """The most bytes alive at any one step: a lower bound on any arena."""
    vals = list(values)
    steps = {s for v in vals for s in (v.first, v.last)}
    return max((sum(_align(v.size, alignment) for v in vals if v.first <= s <= v.last) for s in steps), default=0)
