"""Building blocks for kernels written as Kernel IR by hand, public for backends that bring kernels
of their own (tensor-core GEMMs, a target's attention): the expression helpers the core's GPU
schedules are built from, and the pieces of its kernels those reuse (Q4_K lanes' scales and bf16
pairs, a lane's part of x quantized to two int8 terms, packed weights dequantized to bf16, KV pool
loads). The statements themselves are ``poot.backend.kir``'s; a kernel is checked by
``poot.backend.verify_kernel``.

- constants and references: ``c`` (i32), ``f`` (f32), ``r`` (a local, i32 unless given);
- arithmetic: ``b`` (a binary op by name), ``add`` (any number of terms), ``mul``, ``fma``;
- bits: ``lo16``/``hi16`` (a word's halves), ``bf16_bits`` (the nearest bf16's bits of an f32),
  ``bf16_rest`` (the nearest bf16 of what those leave), ``pair`` (two halves into a word),
  ``silu_mul`` (silu(g) * u);
- kernel pieces: ``q4_k_lane_scales``, ``q4_k_bf16_pairs``, ``q8_quantize_lane``,
  ``dequantize_bf16``/``dequant_groups``, ``pool_dtype``/``pool_load``/``fmax``;
- x quantized once to two int8 terms for integer products: ``quantize_q8x2`` (grid of
  ``Q8_THREADS``-thread workgroups; x ~ d (q1 + q2 / ``Q8_SPLIT``)).
"""

from __future__ import annotations

from .library._kir import F32, I32
from .library._kir import _add as add
from .library._kir import _b as b
from .library._kir import _bf16_bits as bf16_bits
from .library._kir import _bf16_rest as bf16_rest
from .library._kir import _c as c
from .library._kir import _f as f
from .library._kir import _fma as fma
from .library._kir import _hi16 as hi16
from .library._kir import _lo16 as lo16
from .library._kir import _mul as mul
from .library._kir import _pair as pair
from .library._kir import _r as r
from .library._kir import _silu_mul as silu_mul
from .library.attention_gpu import fmax, pool_dtype, pool_load
from .library.dequant_gpu import dequant_groups, dequantize_bf16
from .library.linear_gpu import q4_k_bf16_pairs, q4_k_lane_scales
from .library.q8x import Q8_SPLIT, Q8_THREADS, q8_quantize_lane, quantize_q8x2

__all__ = [
    "F32",
    "I32",
    "Q8_SPLIT",
    "Q8_THREADS",
    "add",
    "b",
    "bf16_bits",
    "bf16_rest",
    "c",
    "dequant_groups",
    "dequantize_bf16",
    "f",
    "fma",
    "fmax",
    "hi16",
    "lo16",
    "mul",
    "pair",
    "pool_dtype",
    "pool_load",
    "q4_k_bf16_pairs",
    "q4_k_lane_scales",
    "q8_quantize_lane",
    "quantize_q8x2",
    "r",
    "silu_mul",
]
