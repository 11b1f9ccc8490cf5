"""Weights a plan reads in a layout of its own, and arrays that say which layout they hold.

A schedule may read a weight faster in another order of its bytes than the checkpoint's (the host's
Q8_0 products read 16 rows as one stream: ``kernel.library.linear_q8_rows``). The planner gives
such a weight a ``WeightLayout`` in ``Plan.layouts`` only when every launch that reads it reads that
layout, so the stored bytes are then not needed at all: whoever holds the weights (a model handle)
lays them out once, before they are copied where they live (``lay_out``), and an executor binds
them as they come. The arrays it makes are ``LaidOut``: they carry their layout's name, so an
executor lays out a weight given as stored (a test, a script) itself, takes one already laid out as
it is, and refuses one laid out for another plan (``as_read``); a stored weight and a laid-out one
have the same size, and nothing else could tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PootError

__all__ = ["WeightLayout", "LaidOut", "layout_of", "lay_out", "as_read"]


@dataclass(frozen=True)
class WeightLayout:
    """A weight's bytes in another order: ``name`` says which (arrays carry it), ``make`` takes the
    stored bytes to the layout's, as a new array of the same size."""

    name: str
    make: Callable[[np.ndarray], np.ndarray]


class LaidOut(np.ndarray):
    """An array whose bytes are a weight in the layout ``layout`` (views and copies keep it)."""

    layout: str = ""

    def __array_finalize__(self, obj: Any) -> None:
        self.layout = getattr(obj, "layout", "")


def layout_of(a: Any) -> str:
    """The layout ``a`` holds a weight in: "" for the stored bytes."""
    return a.layout if isinstance(a, LaidOut) else ""


def _made(name: str, a: np.ndarray, layout: WeightLayout) -> LaidOut:
    out = np.ascontiguousarray(layout.make(np.asarray(a)))
    if out.nbytes != np.asarray(a).nbytes:
        raise PootError(f"weight '{name}': layout {layout.name} made {out.nbytes} bytes of {np.asarray(a).nbytes}")
    laid = out.view(LaidOut)
    laid.layout = layout.name
    return laid


def lay_out(weights: Mapping[str, np.ndarray], layouts: Mapping[str, WeightLayout]) -> dict[str, np.ndarray]:
    """``weights`` with each one that ``layouts`` names laid out (a ``LaidOut`` array; one already in
    that layout is kept); the rest as they are."""
    return {name: as_read(name, a, layouts.get(name)) for name, a in weights.items()}


def as_read(name: str, a: np.ndarray, layout: WeightLayout | None) -> np.ndarray:
    """Weight ``name`` as a plan reads it, the plan's layout for it being ``layout`` (None: as
    stored): ``a`` itself when it is in that layout already, laid out when it is stored; a weight
    laid out otherwise is refused, naming both layouts."""
    have = layout_of(a)
    want = layout.name if layout is not None else ""
    if have == want:
        return a
    if have:
        reads = f"in layout {want}" if want else "as the checkpoint stores it"
        raise PootError(f"weight '{name}' is given in layout {have}, but the plan reads it {reads}: bind the checkpoint's arrays")
    assert layout is not None
    return _made(name, a, layout)
