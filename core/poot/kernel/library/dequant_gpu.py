"""Packed weights dequantized to bf16 on a GPU, so that products of many rows (prefill, batched decode)
of a quantized model run on a backend's tensor-core GEMMs, as bf16 weights do: llama.cpp
dequantizes to f16 for its large-batch products the same way.

``dequantize_bf16(qtype, k)`` writes an [n, k] weight as rows of bf16 pairs (i32 words, the layout
the tensor-core GEMMs read), each value the nearest bf16 of the type's f32 dequantization.
Q4_K has a schedule of its own: eight lanes a block, each reading 16 bytes of quants and the block's
16-byte head (the GEMV's layout, ``linear_gpu``), and storing its 32 values as four 16-byte stores.
Any other type of ``quant.bodies`` goes through its generic body, eight values a thread.
"""

from __future__ import annotations

from functools import lru_cache

from ...graph import dtypes as dt
from ...quant.bodies import BODIES, dequant_expr
from .. import ir as K
from ..verify import verify_kernel
from ._kir import _add, _b, _mul, _r
from .linear_gpu import q4_k_bf16_pairs, q4_k_lane_scales

__all__ = ["dequantize_bf16", "dequant_groups", "DEQUANT_THREADS"]

F32, I32 = dt.f32, dt.i32
DEQUANT_THREADS = 256


def _values_a_thread(qtype: str) -> int:
    return 32 if qtype == "q4_k" else 8


def dequant_groups(qtype: str, n: int, k: int) -> int:
    """Workgroups ``dequantize_bf16(qtype, k)`` takes for ``n`` rows."""
    return -(-n * k // _values_a_thread(qtype) // DEQUANT_THREADS)


def _q4_k_body() -> list[K.Stmt]:
    """Lane ``t``: block t / 8 of the matrix (rows of whole blocks: a block's place does not depend on
    its row), its chunk c = (t % 8) / 2 of 64 values and half ``hh``: bytes 16 hh.. of the chunk's 32,
    whose low nibbles are values 64c + 16hh + b and high nibbles 64c + 32 + 16hh + b."""
    out: list[K.Stmt] = [
        K.Let("blk", _b("div", _r("t"), 8)),
        K.Let("lb", _b("rem", _r("t"), 8)),
        K.Let("c", _b("div", _r("lb"), 2)),
        K.Let("hh", _b("rem", _r("lb"), 2)),
        K.Let("sh", _mul(_b("rem", _r("c"), 2), 16)),
        K.Let("base", _mul(_r("blk"), 36)),  # a block is 36 words: 16-byte aligned
        K.VecLoad(tuple(f"q{i}" for i in range(4)), "w", _add(_r("base"), 4, _mul(_r("c"), 8), _mul(_r("hh"), 4)), I32),
        K.VecLoad(("dm", "s0", "s1", "s2"), "w", _r("base"), I32),
    ]
    out += q4_k_lane_scales("", "")
    for part, shift, at in (("l", 0, 0), ("h", 4, 16)):
        words = q4_k_bf16_pairs("", part, [f"q{i}" for i in range(4)], shift)
        first = _add(_mul(_r("blk"), 128), _mul(_r("c"), 32), at, _mul(_r("hh"), 8))
        for s in range(2):  # 16 values: two 16-byte stores of four words
            out.append(K.VecStore("wd", _add(first, 4 * s), tuple(words[4 * s : 4 * s + 4])))
    return out


@lru_cache(maxsize=None)
def dequantize_bf16(qtype: str, k: int) -> K.Kernel:
    """``wd`` [n, k] as bf16 pairs (i32 words, the first value in the low half) from the packed
    weight ``w`` [n, k] of ``qtype``; grid (``dequant_groups(qtype, n, k)``,). Q4_K weights are bound
    as i32 words, other types as bytes with their ``lut`` and ``row_bytes``. K a multiple of 256."""
    if qtype not in BODIES or BODIES[qtype][0] == 1:
        raise ValueError(f"dequantize_bf16: '{qtype}' is not a packed type (have: {', '.join(sorted(q for q in BODIES if BODIES[q][0] > 1))})")
    if k % 256:
        raise ValueError(f"dequantize_bf16 needs K a multiple of 256, got {k}")
    per_thread = _values_a_thread(qtype)
    body: list[K.Stmt] = [K.Let("t", _add(_mul(K.Builtin("group_id", 0), DEQUANT_THREADS), K.Builtin("thread_id", 0)))]
    inside = K.Bin("lt", _r("t"), _mul(_r("n"), k // per_thread))
    rest: tuple[K.Param, ...] = ()
    if qtype == "q4_k":
        body.append(K.If(inside, tuple(_q4_k_body())))
        weights: tuple[K.Param, ...] = (K.Buffer("w", I32),)
    else:
        octs = k // 8
        row = _mul(_b("div", _r("t"), octs), _r("row_bytes"))
        col = _mul(_b("rem", _r("t"), octs), 8)
        vals = [dequant_expr(qtype, "w", _r("row"), _add(_r("col"), v)) for v in range(8)]
        words = tuple(K.PackBf16x2(vals[2 * q], vals[2 * q + 1]) for q in range(4))
        body.append(K.If(inside, (K.Let("row", row), K.Let("col", col), K.VecStore("wd", _mul(_r("t"), 4), words))))
        weights, rest = (K.Buffer("w", dt.u8), K.Buffer("lut", F32)), (K.ScalarParam("row_bytes", I32),)
    params = (*weights, K.Buffer("wd", I32, readonly=False), K.ScalarParam("n", I32), *rest)
    kern = K.Kernel(f"dequantize_bf16_{qtype}_K{k}", params, tuple(body), (DEQUANT_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern
