"""Kernel IR bodies that dequantize one element of a packed row in registers.

``dequant_expr(qtype, buf, row, k)`` is the value of element ``k`` of the row starting at byte
``row`` of the u8 buffer ``buf``, as an f32 Kernel IR expression; it performs exactly the float32
operations of the numpy dequantizer (ggml's order), so kernels match the oracle bit for bit per
element. Lookup-table types read their table from an f32 buffer named ``lut`` (``LUTS`` gives it).
Kernels reach these through the front end's ``dequant(QTYPE, buf, row, k)`` macro.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..graph import dtypes as dt
from ..kernel import ir

__all__ = ["dequant_expr", "dequant_in_block", "BODIES", "LUTS", "WIDE_BLOCK", "block_layout"]

E = ir.Expr


def _i(v: int) -> ir.Const:
    return ir.Const(v, dt.i32)


def _f(v: float) -> ir.Const:
    return ir.Const(float(v), dt.f32)


def _add(a: E, b: E) -> E:
    return ir.Bin("add", a, b)


def _mul(a: E, b: E) -> E:
    return ir.Bin("mul", a, b)


def _sub(a: E, b: E) -> E:
    return ir.Bin("sub", a, b)


def _div(a: E, b: int) -> E:
    return ir.Bin("div", a, _i(b))


def _rem(a: E, b: int) -> E:
    return ir.Bin("rem", a, _i(b))


def _and(a: E, m: int) -> E:
    return ir.Bin("and", a, _i(m))


def _shr(a: E, s: E | int) -> E:
    return ir.Bin("shr", a, _i(s) if isinstance(s, int) else s)


def _shl(a: E, s: E | int) -> E:
    return ir.Bin("shl", a, _i(s) if isinstance(s, int) else s)


def _byte(buf: str, at: E) -> E:
    """u8 at byte ``at`` as i32 in 0..255."""
    return ir.Cast(ir.Load(buf, at, dt.u8), dt.i32)


def _sbyte(buf: str, at: E) -> E:
    """int8 at byte ``at`` as i32."""
    return _sub(ir.Bin("xor", _byte(buf, at), _i(128)), _i(128))


def _f16(buf: str, at: E) -> E:
    return ir.HalfToF32(ir.Bin("or", _byte(buf, at), _shl(_byte(buf, _add(at, _i(1))), 8)))


def _u32(buf: str, at: E) -> E:
    v = _byte(buf, at)
    for j in (1, 2, 3):
        v = ir.Bin("or", v, _shl(_byte(buf, _add(at, _i(j))), 8 * j))
    return v


def _fl(v: E) -> E:
    return ir.Cast(v, dt.f32)


def _nibble_in(buf: str, base: E, j: E, half: int) -> E:
    """Element j of a run of 2*half values stored as ``half`` bytes: low nibbles first, then high."""
    byte = _byte(buf, _add(base, _rem(j, half)))
    return ir.Select(ir.Bin("lt", j, _i(half)), _and(byte, 15), _shr(byte, 4))


def _nibble_chunks(buf: str, base: E, e: E, chunk: int) -> E:
    run, r = _div(e, 2 * chunk), _rem(e, 2 * chunk)
    return _nibble_in(buf, _add(base, _mul(run, _i(chunk))), r, chunk)


def _crumb(buf: str, base: E, e: E) -> E:
    """2-bit field: byte 32c + l holds values 128c + 32s + l at bit 2s."""
    c, r = _div(e, 128), _rem(e, 128)
    byte = _byte(buf, _add(base, _add(_mul(c, _i(32)), _rem(r, 32))))
    return _and(_shr(byte, _mul(_div(r, 32), _i(2))), 3)


def _bit(buf: str, base: E, e: E) -> E:
    """One bit per value: bit j of byte l is value 32j + l."""
    return _and(_shr(_byte(buf, _add(base, _rem(e, 32))), _div(e, 32)), 1)


# -- per type: (block size, block bytes, element body(buf, block start byte, j in block, lut)) -------


def _q8_0(b: str, p: E, j: E, lut: str) -> E:
    return _mul(_f16(b, p), _fl(_sbyte(b, _add(p, _add(_i(2), j)))))


def _q4_0(b: str, p: E, j: E, lut: str) -> E:
    return _mul(_f16(b, p), _fl(_sub(_nibble_in(b, _add(p, _i(2)), j, 16), _i(8))))


def _q4_1(b: str, p: E, j: E, lut: str) -> E:
    return _add(_mul(_f16(b, p), _fl(_nibble_in(b, _add(p, _i(4)), j, 16))), _f16(b, _add(p, _i(2))))


def _q5(b: str, p: E, j: E, qh_at: int) -> E:
    hi = _and(_shr(_u32(b, _add(p, _i(qh_at))), j), 1)
    return ir.Bin("or", _nibble_in(b, _add(p, _i(qh_at + 4)), j, 16), _shl(hi, 4))


def _q5_0(b: str, p: E, j: E, lut: str) -> E:
    return _mul(_f16(b, p), _fl(_sub(_q5(b, p, j, 2), _i(16))))


def _q5_1(b: str, p: E, j: E, lut: str) -> E:
    return _add(_mul(_f16(b, p), _fl(_q5(b, p, j, 4))), _f16(b, _add(p, _i(2))))


def _q2_k(b: str, p: E, j: E, lut: str) -> E:
    s = _byte(b, _add(p, _div(j, 16)))
    dl = _mul(_f16(b, _add(p, _i(80))), _fl(_and(s, 15)))
    ml = _mul(_f16(b, _add(p, _i(82))), _fl(_shr(s, 4)))
    return _sub(_mul(dl, _fl(_crumb(b, _add(p, _i(16)), j))), ml)


def _q3_k(b: str, p: E, j: E, lut: str) -> E:
    i = _div(j, 16)
    low_byte = _byte(b, _add(p, _add(_i(96), _rem(i, 8))))
    low = ir.Select(ir.Bin("lt", i, _i(8)), _and(low_byte, 15), _shr(low_byte, 4))
    high = _and(_shr(_byte(b, _add(p, _add(_i(104), _rem(i, 4)))), _mul(_div(i, 4), _i(2))), 3)
    sc = _sub(ir.Bin("or", low, _shl(high, 4)), _i(32))
    dl = _mul(_f16(b, _add(p, _i(108))), _fl(sc))
    q = _sub(_crumb(b, _add(p, _i(32)), j), _mul(_sub(_i(1), _bit(b, p, j)), _i(4)))
    return _mul(dl, _fl(q))


def _k4_scale_min(b: str, p: E, sub: E) -> tuple[E, E]:
    s = lambda k: _byte(b, _add(p, _add(_i(4), k)))  # noqa: E731 - the 12 scale bytes
    lo = ir.Bin("lt", sub, _i(4))
    sc = ir.Select(lo, _and(s(sub), 63), ir.Bin("or", _and(s(_add(sub, _i(4))), 15), _shl(_shr(s(_sub(sub, _i(4))), 6), 4)))
    mn = ir.Select(lo, _and(s(_add(sub, _i(4))), 63), ir.Bin("or", _shr(s(_add(sub, _i(4))), 4), _shl(_shr(s(sub), 6), 4)))
    return sc, mn


def _q4_k(b: str, p: E, j: E, lut: str) -> E:
    sc, mn = _k4_scale_min(b, p, _div(j, 32))
    dl, ml = _mul(_f16(b, p), _fl(sc)), _mul(_f16(b, _add(p, _i(2))), _fl(mn))
    return _sub(_mul(dl, _fl(_nibble_chunks(b, _add(p, _i(16)), j, 32))), ml)


def _q5_k(b: str, p: E, j: E, lut: str) -> E:
    sc, mn = _k4_scale_min(b, p, _div(j, 32))
    dl, ml = _mul(_f16(b, p), _fl(sc)), _mul(_f16(b, _add(p, _i(2))), _fl(mn))
    q = ir.Bin("or", _nibble_chunks(b, _add(p, _i(48)), j, 32), _shl(_bit(b, _add(p, _i(16)), j), 4))
    return _sub(_mul(dl, _fl(q)), ml)


def _q6_k(b: str, p: E, j: E, lut: str) -> E:
    dl = _mul(_f16(b, _add(p, _i(208))), _fl(_sbyte(b, _add(p, _add(_i(192), _div(j, 16))))))
    q = ir.Bin("or", _nibble_chunks(b, p, j, 64), _shl(_crumb(b, _add(p, _i(128)), j), 4))
    return _mul(dl, _fl(_sub(q, _i(32))))


def _lut(lut: str, code: E) -> E:
    return ir.Load(lut, code, dt.f32)


def _iq4_nl(b: str, p: E, j: E, lut: str) -> E:
    return _mul(_f16(b, p), _lut(lut, _nibble_in(b, _add(p, _i(2)), j, 16)))


def _iq4_xs(b: str, p: E, j: E, lut: str) -> E:
    ib = _div(j, 32)
    lbyte = _byte(b, _add(p, _add(_i(4), _div(ib, 2))))
    low = ir.Select(ir.Bin("eq", _rem(ib, 2), _i(0)), _and(lbyte, 15), _shr(lbyte, 4))
    sh = ir.Bin("or", _byte(b, _add(p, _i(2))), _shl(_byte(b, _add(p, _i(3))), 8))
    high = _and(_shr(sh, _mul(ib, _i(2))), 3)
    dl = _mul(_f16(b, p), _fl(_sub(ir.Bin("or", low, _shl(high, 4)), _i(32))))
    return _mul(dl, _lut(lut, _nibble_in(b, _add(p, _add(_i(8), _mul(ib, _i(16)))), _rem(j, 32), 16)))


def _mxfp4(b: str, p: E, j: E, lut: str) -> E:
    e = _byte(b, p)
    # 2^(e-128): a normal f32 from e >= 2, the subnormals 2^-127 and 2^-128 below
    scale = ir.Bitcast(ir.Select(ir.Bin("ge", e, _i(2)), _shl(_sub(e, _i(1)), 23), _shr(_i(0x00400000), _sub(_i(1), e))), dt.f32)
    return _mul(scale, _lut(lut, _nibble_in(b, _add(p, _i(1)), j, 16)))


def _f16_body(b: str, p: E, j: E, lut: str) -> E:
    return _f16(b, _add(p, _mul(j, _i(2))))


def _bf16_body(b: str, p: E, j: E, lut: str) -> E:
    at = _add(p, _mul(j, _i(2)))
    return ir.Bitcast(_shl(ir.Bin("or", _byte(b, at), _shl(_byte(b, _add(at, _i(1))), 8)), 16), dt.f32)


# 16-bit floats are a "block" of one value; schedules that work a block at a time may view a row as
# blocks of WIDE_BLOCK values (the bodies index the value within the block)
WIDE_BLOCK = 32


BODIES: dict[str, tuple[int, int, Callable[[str, E, E, str], E]]] = {
    "f16": (1, 2, _f16_body),
    "bf16": (1, 2, _bf16_body),
    "q8_0": (32, 34, _q8_0),
    "q4_0": (32, 18, _q4_0),
    "q4_1": (32, 20, _q4_1),
    "q5_0": (32, 22, _q5_0),
    "q5_1": (32, 24, _q5_1),
    "q2_k": (256, 84, _q2_k),
    "q3_k": (256, 110, _q3_k),
    "q4_k": (256, 144, _q4_k),
    "q5_k": (256, 176, _q5_k),
    "q6_k": (256, 210, _q6_k),
    "iq4_nl": (32, 18, _iq4_nl),
    "iq4_xs": (256, 136, _iq4_xs),
    "mxfp4": (32, 17, _mxfp4),
}
LUTS: dict[str, np.ndarray] = {
    "iq4_nl": np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32),
    "iq4_xs": np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32),
    "mxfp4": np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32),
}


def block_layout(qtype: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a packed type."""
    bs, bb, _ = BODIES[qtype]
    return bs, bb


def dequant_expr(qtype: str, buf: str, row: E, k: E, lut: str = "lut") -> E:
    """Element ``k`` of the packed row starting at byte ``row`` of u8 buffer ``buf``, as f32."""
    if qtype not in BODIES:
        raise KeyError(f"no kernel body for packed type '{qtype}' (have: {', '.join(sorted(BODIES))})")
    bs, bb, body = BODIES[qtype]
    return body(buf, _add(row, _mul(_div(k, bs), _i(bb))), _rem(k, bs), lut)


def dequant_in_block(qtype: str, buf: str, block: E, j: E, lut: str = "lut") -> E:
    """Element ``j`` of the block starting at byte ``block``: in a loop over ``j`` the block's scales
    are loop-invariant, so LLVM hoists their decoding out of the loop."""
    if qtype not in BODIES:
        raise KeyError(f"no kernel body for packed type '{qtype}' (have: {', '.join(sorted(BODIES))})")
    return BODIES[qtype][2](buf, block, j, lut)
