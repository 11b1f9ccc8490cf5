"""A thread's place in a tensor-core fragment, shared by the mma.sync kernels."""

from __future__ import annotations

from collections.abc import Callable

from poot.backend import kir as K
from poot.kernel.build import F32
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r

__all__ = ["mma_lanes", "warp_tiles_summed"]


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


def warp_tiles_summed(flat: list[str], wk: int, threads: int, place: Callable[[K.Expr, K.Expr, K.Expr], tuple[K.Expr, K.Expr]]) -> list[K.Stmt]:
    """The ``wk`` warps' partial tiles (this lane's f32 accumulators ``flat``, four a tile) added
    through workgroup memory ``part`` (``threads`` * len(flat) words) and stored into y [m, n]:
    ``place(ln, q, tile)`` gives the (row, column) of a lane ``ln``'s accumulator ``q`` (0-3) of its
    tile ``tile``; outside y nothing is stored."""
    nacc = len(flat)
    out: list[K.Stmt] = [K.Store("part", _add(_mul(_r("tid"), nacc), e), _r(nm, F32)) for e, nm in enumerate(flat)]
    out.append(K.Barrier())
    part = K.Load("part", _add(_mul(_add(_mul(_r("ww"), 32), _r("ln")), nacc), _r("e")), F32)
    orow, ocol = place(_r("ln"), _b("rem", _r("e"), 4), _b("div", _r("e"), 4))
    each: list[K.Stmt] = [
        K.Let("ln", _b("div", _r("o"), nacc)),
        K.Let("e", _b("rem", _r("o"), nacc)),
        K.Let("sum", _f(0.0)),
        K.For("ww", _c(0), _c(wk), (K.Assign("sum", K.Bin("add", _r("sum", F32), part)),)),
        K.Let("orow", orow),
        K.Let("ocol", ocol),
        K.If(
            K.Bin("and", K.Bin("lt", _r("orow"), _r("m")), K.Bin("lt", _r("ocol"), _r("n"))),
            (K.Store("y", _add(_mul(_r("orow"), _r("n")), _r("ocol")), _r("sum", F32)),),
        ),
    ]
    out.append(K.For("o", _r("tid"), _c(32 * nacc), tuple(each), step=threads))
    return out
