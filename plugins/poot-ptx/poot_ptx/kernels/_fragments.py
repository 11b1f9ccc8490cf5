"""A thread's place in a tensor-core fragment, shared by the mma.sync kernels."""

from __future__ import annotations

from poot.backend import kir as K
from poot.kernel.build import b as _b
from poot.kernel.build import r as _r

__all__ = ["mma_lanes"]


def mma_lanes() -> list[K.Stmt]:
    """A thread's place in an mma.sync fragment: ``tid``, ``lane``, ``warp``, and the lane's group
    ``g`` (lane / 4: its rows) and ``t4`` (lane % 4: its pair of columns)."""
    return [
        K.Let("tid", K.Builtin("thread_id", 0)),
        K.Let("lane", _b("rem", _r("tid"), 32)),
        K.Let("warp", _b("div", _r("tid"), 32)),
        K.Let("g", _b("div", _r("lane"), 4)),
        K.Let("t4", _b("rem", _r("lane"), 4)),
    ]
