"""A tensor-core lane's Q6_K weights, read as stored and dequantized in registers to the nearest
bf16 of each value (the values ``dequantize_bf16`` writes): the pieces ``gemm_warp`` takes for a
64-value chunk of a row.

A Q6_K block is 256 values in 210 bytes: ``ql`` (128 bytes of low nibbles), ``qh`` (64 bytes of
high bit pairs), 16 int8 scales and d (f16). Each half (128 values) of a block is four quarters q
of 32: value 32q + l of half h has its low nibble in ``ql`` byte 64h + 32(q % 2) + l (the nibble
q / 2), its high two bits in ``qh`` byte 32h + l (bits 2q, 2q + 1) and its scale in byte 8h + 2q +
l / 16. A chunk is two quarters (2p, 2p + 1) of a half, and a lane's eight values (l = 8 t4..8 t4
+ 7) in them take 8 bytes of ``ql`` at 64h + 8 t4 (the first quarter) and at 64h + 32 + 8 t4 (the
second), the same nibble p of both, 8 bytes of ``qh`` at 32h + 8 t4, and two scales. Blocks are
210 bytes, so an odd block's words straddle two of the buffer's (rows of an even number of blocks
start word-aligned): each 4 bytes are read as two words and joined.
"""

from __future__ import annotations

from poot.backend import kir as K
from poot.kernel.build import F32, I32
from poot.kernel.build import add as _add
from poot.kernel.build import b as _b
from poot.kernel.build import c as _c
from poot.kernel.build import f as _f
from poot.kernel.build import mul as _mul
from poot.kernel.build import r as _r

__all__ = ["Q6_K_BYTES", "Q6_K_WORDS", "joined", "q6_k_bf16_pairs", "q6_k_lane_loads", "q6_k_lane_words"]

Q6_K_BYTES = 210  # a block's bytes
# the words a lane keeps for a chunk of one row: the quarters' nibble bytes (a, b), the high bits
# (h), two words each, and the two quarters' scales times d (f32)
Q6_K_WORDS = ("a0", "a1", "b0", "b1", "h0", "h1", "sc0", "sc1")

_MAGIC = 0x4B000000  # the bits of 2^23: a 6-bit field q 2^at under them is the float 2^23 + q 2^at


def q6_k_lane_loads(pre: str, j: int, ob: K.Expr, hn: K.Expr, pp: K.Expr) -> list[K.Stmt]:
    """The words row ``j``'s chunk needs, as loaded (``{pre}r{j}...``): the block at byte ``ob`` of
    the buffer ``w`` (bound as i32 words), its half ``hn`` and the chunk ``pp`` of the half: three
    words for each 8-byte piece, two for the scales, one for d, and ``{pre}r{j}o``: 16 for an odd
    block (its fields start 2 bytes past a word), else 0. ``q6_k_lane_words`` joins them."""
    out: list[K.Stmt] = [K.Let(f"{pre}r{j}ob", ob), K.Let(f"{pre}r{j}o", _mul(_b("and", _r(f"{pre}r{j}ob"), 2), 8))]
    base = _r(f"{pre}r{j}ob")
    pieces = {
        "a": _add(base, _mul(hn, 64), _mul(_r("t4"), 8)),
        "b": _add(base, _mul(hn, 64), 32, _mul(_r("t4"), 8)),
        "h": _add(base, 128, _mul(hn, 32), _mul(_r("t4"), 8)),
    }
    for name, at in pieces.items():
        w0 = _b("shr", at, 2)
        out += [K.Let(f"{pre}r{j}{name}{i}", K.Load("w", _add(w0, i) if i else w0, I32)) for i in range(3)]
    sw = _b("shr", _add(base, 192, _mul(hn, 8), _mul(pp, 4)), 2)
    out += [K.Let(f"{pre}r{j}s0", K.Load("w", sw, I32)), K.Let(f"{pre}r{j}s1", K.Load("w", _add(sw, 1), I32))]
    out.append(K.Let(f"{pre}r{j}d", K.Load("w", _b("shr", _add(base, 208), 2), I32)))
    return out


def joined(lo: K.Expr, hi: K.Expr, odd: K.Expr) -> K.Expr:
    """The 4 bytes that start 2 bytes into word ``lo`` (its upper half, then ``hi``'s lower) where
    ``odd``, else ``lo``: one byte permute and a select."""
    return K.Select(odd, _b("or", _b("and", _b("shr", lo, 16), 0xFFFF), _b("shl", hi, 16)), lo)


def q6_k_lane_words(pre: str, out_pre: str, j: int) -> list[K.Stmt]:
    """Row ``j``'s chunk words as the products take them (``{out_pre}w{j}`` + ``Q6_K_WORDS``), from
    the loaded ones of ``q6_k_lane_loads`` (prefix ``pre``): the straddling words joined, and the two
    scales (bytes 2u + t4 / 2 of the chunk's four: the lane's 16 values of quarter u) as int8 times
    d. Separate from the loads so that a pipelined loop joins the next chunk's words after this
    chunk's products, not while its loads are in flight."""
    raw = lambda nm: _r(f"{pre}r{j}{nm}")  # noqa: E731
    odd = K.Bin("ne", raw("o"), _c(0))
    w = f"{out_pre}w{j}"
    out: list[K.Stmt] = []
    for piece in ("a", "b", "h"):
        out += [K.Let(f"{w}{piece}{i}", joined(raw(f"{piece}{i}"), raw(f"{piece}{i + 1}"), odd)) for i in range(2)]
    out.append(K.Let(f"{w}sw", joined(raw("s0"), raw("s1"), odd)))
    out.append(K.Let(f"{w}dd", K.HalfToF32(_b("and", _b("shr", raw("d"), raw("o")), 0xFFFF))))
    for u in range(2):
        byte = _b("and", _b("shr", _r(f"{w}sw"), _mul(_add(_b("shr", _r("t4"), 1), 2 * u), 8)), 255)
        out.append(K.Let(f"{w}sc{u}", K.Bin("mul", _r(f"{w}dd", F32), K.Cast(_b("sub", _b("xor", byte, 128), 128), F32))))
    return out


def q6_k_bf16_pairs(w: str, u: int, pp: K.Expr, names: list[str]) -> list[K.Stmt]:
    """Locals ``names`` (four): the lane's eight values of the chunk's quarter ``u`` (row words ``w``
    + ``Q6_K_WORDS``; the chunk ``pp`` of its half picks the nibble and the bit pair) as words of
    two bf16 values (nearest even, the first value in the low half): d sc (q - 32) in f32, exact
    (at most 23 significant bits), then rounded. Each 6-bit q is put under the bits of 2^23 (one
    AND-OR), 2^23 + 32 2^at subtracted and the scale 2^-at applied: no integer-to-float conversion
    nor shift a value."""
    q, sc = ("a", "b")[u], _r(f"{w}sc{u}", F32)
    out: list[K.Stmt] = []
    vals: list[K.Expr] = []
    for i in range(2):
        six = f"{names[0]}_six{i}"
        out.append(
            K.Let(
                six,
                _b(
                    "or",
                    _b("and", _b("shr", _r(f"{w}{q}{i}"), _mul(pp, 4)), 0x0F0F0F0F),
                    _b("shl", _b("and", _b("shr", _r(f"{w}h{i}"), _add(_mul(pp, 4), 2 * u)), 0x03030303), 4),
                ),
            )
        )
        for x, at in ((_r(six), 0), (_r(six), 8), (_r(six), 16), (_b("shr", _r(six), 16), 8)):
            bits = _b("or", _b("and", x, 0x3F << at), _MAGIC)
            v = K.Bin("sub", K.Bitcast(bits, F32), _f(float(8388608 + 32 * (1 << at))))
            vals.append(K.Bin("mul", K.Bin("mul", sc, _f(2.0**-at)) if at else sc, v))
    return out + [K.Let(names[p], K.PackBf16x2(vals[2 * p], vals[2 * p + 1])) for p in range(4)]
