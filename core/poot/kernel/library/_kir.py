"""Helpers that build Kernel IR expressions for the GPU schedule modules (``linear_gpu``,
``linear_simt``, ``attention_gpu``; public as ``poot.kernel.build``): constants, references,
integer arithmetic and bf16 bit manipulation."""

from __future__ import annotations

from ...graph import dtypes as dt
from .. import ir as K

I32, F32 = dt.i32, dt.f32


def _c(v: int) -> K.Const:
    return K.Const(v, I32)


def _f(v: float) -> K.Const:
    return K.Const(float(v), F32)


def _r(name: str, t: dt.DType = I32) -> K.Ref:
    return K.Ref(name, t)


def _b(op: str, a: K.Expr, b: K.Expr | int) -> K.Bin:
    return K.Bin(op, a, _c(b) if isinstance(b, int) else b)


def _add(*xs: K.Expr | int) -> K.Expr:
    e = xs[0] if not isinstance(xs[0], int) else _c(xs[0])
    for x in xs[1:]:
        e = _b("add", e, x)
    return e


def _mul(a: K.Expr, b: K.Expr | int) -> K.Expr:
    return _b("mul", a, b)


def _fma(acc: K.Expr, a: K.Expr, b: K.Expr) -> K.Expr:
    return K.Bin("add", acc, K.Bin("mul", a, b))


def _lo16(w: K.Expr) -> K.Expr:
    """The bf16 in the low half of a word, as f32."""
    return K.Bitcast(_b("shl", w, 16), F32)


def _hi16(w: K.Expr) -> K.Expr:
    return K.Bitcast(_b("and", w, -65536), F32)


def _bf16_bits(x: K.Expr) -> K.Expr:
    """f32 -> the 16 bits of the nearest bf16 (ties to even), in the low half of an i32."""
    bits = K.Bitcast(x, I32)
    lsb = _b("and", _b("shr", bits, 16), 1)
    return _b("and", _b("shr", _add(bits, 0x7FFF, lsb), 16), 0xFFFF)


def _bf16_rest(x: K.Expr, hi: K.Expr) -> K.Expr:
    """The bf16 bits nearest to what f32 ``x`` leaves over its nearest bf16 ``hi`` (bits, as
    ``_bf16_bits`` gives them): the second of the two terms x is split into."""
    return _bf16_bits(K.Bin("sub", x, K.Bitcast(_b("shl", hi, 16), F32)))


def _silu_mul(g: K.Expr, u: K.Expr) -> K.Expr:
    """silu(g) * u with the operations of the fused elementwise kernel: (g * (1 / (1 + exp(-g)))) * u."""
    one = _f(1.0)
    return K.Bin("mul", K.Bin("mul", g, K.Bin("div", one, K.Bin("add", one, K.Un("exp", K.Un("neg", g))))), u)


def _pair(lo: K.Expr, hi: K.Expr) -> K.Expr:
    return _b("or", lo, _b("shl", hi, 16))
