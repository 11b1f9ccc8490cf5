"""A register-tiled GEMM on f32 FMAs for GPUs without matrix instructions (Vulkan, WebGPU) and for
packed weights: many rows (prefill, batched decode) where a backend's tensor-core
schedules do not apply.

Each workgroup computes a 64 x 64 tile of y, each of its 256 threads a 4 x 4 block of it, over K in
steps of ``bk``: the step's x (64 rows, 16-byte loads) and weights are staged in workgroup memory
as f32, transposed (k-major), so a thread reads its four rows of x and four features of w as two
16-byte loads and does 16 FMAs with them. bf16 weights are read 16 bytes at a time and widened
exactly; packed ones (any type of ``quant.bodies``) are dequantized once per workgroup, eight values
a thread a step. Rows are padded by four floats, which spreads the transposing stores over the banks
and keeps 16-byte alignment. Activations stay f32 (docs/NUMERICS.md).
"""

from __future__ import annotations

from functools import lru_cache

from ...graph import dtypes as dt
from ...quant.bodies import BODIES, dequant_expr
from .. import ir as K
from ..verify import verify_kernel
from ._kir import _add, _b, _c, _f, _hi16, _lo16, _mul, _r

__all__ = ["gemm_simt", "SIMT_TILE", "simt_shared_bytes"]

F32, I32 = dt.f32, dt.i32
SIMT_TILE = 64  # rows and features a workgroup
_T = 4  # rows and features a thread
_PAD = 4


def simt_shared_bytes(bk: int) -> int:
    """Workgroup memory ``gemm_simt`` with K steps of ``bk`` needs."""
    return 2 * bk * (SIMT_TILE + _PAD) * 4


@lru_cache(maxsize=None)
def gemm_simt(k: int, bk: int = 32, qtype: str = "bf16", words: bool = True) -> K.Kernel:
    """y[i, j] = sum_k x[i, k] * w[j, k]; grid (ceil(n / 64), ceil(m / 64)); K a multiple of ``bk``
    (16 or 32). Weights: bf16 read as 32-bit words (two values a word; ``words``), or rows of
    ``row_bytes`` packed bytes of ``qtype`` (buffers ``w`` as u8 and ``lut``). Rows of x past m and
    features past n read the last one and are not stored."""
    if bk not in (16, 32) or k % bk:
        raise ValueError(f"gemm_simt: K steps of 16 or 32 values dividing K, got bk={bk} for K={k}")
    words = words and qtype == "bf16"
    if not words and qtype not in BODIES:
        raise ValueError(f"gemm_simt: no dequantization for '{qtype}' (have: {', '.join(sorted(BODIES))})")
    tile, side = SIMT_TILE, SIMT_TILE // _T
    threads = side * side
    stride = tile + _PAD
    body: list[K.Stmt] = [
        K.Let("tid", K.Builtin("thread_id", 0)),
        K.Let("tx", _b("rem", _r("tid"), side)),
        K.Let("ty", _b("div", _r("tid"), side)),
        K.Let("row0", _mul(K.Builtin("group_id", 1), tile)),
        K.Let("col0", _mul(K.Builtin("group_id", 0), tile)),
    ]
    body += [K.Let(f"acc{i}_{j}", _f(0.0)) for i in range(_T) for j in range(_T)]
    loop: list[K.Stmt] = [K.Let("k0", _mul(_r("kt"), bk))]
    quads = bk // 4  # 16-byte loads of x a row
    for it in range(tile * quads // threads):  # x: 64 rows of bk floats, stored k-major
        e = _add(_mul(_c(it), threads), _r("tid")) if it else _r("tid")
        rr, c4 = f"ar{it}", f"ac{it}"
        names = tuple(f"a{it}_{v}" for v in range(4))
        loop += [
            K.Let(rr, _b("div", e, quads)),
            K.Let(c4, _b("rem", e, quads)),
            K.VecLoad(names, "x", _add(_mul(K.Bin("min", _add(_r("row0"), _r(rr)), _b("sub", _r("m"), 1)), k), _r("k0"), _mul(_r(c4), 4)), F32),
        ]
        loop += [K.Store("As", _add(_mul(_add(_mul(_r(c4), 4), v), stride), _r(rr)), _r(names[v], F32)) for v in range(4)]
    octs = bk // 8  # eight weights a thread a step: one 16-byte load of bf16
    for it in range(max(1, tile * octs // threads)):  # weights: 64 features of bk values, as f32, stored k-major
        e = _add(_mul(_c(it), threads), _r("tid")) if it else _r("tid")
        rr, cc = f"br{it}", f"bc{it}"
        feature = K.Bin("min", _add(_r("col0"), _r(rr)), _b("sub", _r("n"), 1))
        stmts: list[K.Stmt] = [K.Let(rr, _b("div", e, octs)), K.Let(cc, _b("rem", e, octs))]
        at = [_add(_mul(_add(_mul(_r(cc), 8), v), stride), _r(rr)) for v in range(8)]
        if words:
            names = tuple(f"b{it}_{v}" for v in range(4))
            stmts.append(K.VecLoad(names, "w", _add(_b("div", _add(_mul(feature, k), _r("k0")), 2), _mul(_r(cc), 4)), I32))
            stmts += [K.Store("Bs", at[2 * v + h], half(_r(names[v]))) for v in range(4) for h, half in enumerate((_lo16, _hi16))]
        else:
            stmts.append(K.Let(f"wrow{it}", _mul(feature, _r("row_bytes"))))
            stmts += [K.Store("Bs", at[v], dequant_expr(qtype, "w", _r(f"wrow{it}"), _add(_r("k0"), _mul(_r(cc), 8), v))) for v in range(8)]
        if tile * octs < threads:  # bk 16: half the threads load
            loop.append(K.If(K.Bin("lt", _r("tid"), _c(tile * octs)), tuple(stmts)))
        else:
            loop += stmts
    loop.append(K.Barrier())
    inner: list[K.Stmt] = [
        K.VecLoad(tuple(f"fa{i}" for i in range(_T)), "As", _add(_mul(_r("kk"), stride), _mul(_r("ty"), _T)), F32),
        K.VecLoad(tuple(f"fb{j}" for j in range(_T)), "Bs", _add(_mul(_r("kk"), stride), _mul(_r("tx"), _T)), F32),
    ]
    for i in range(_T):
        for j in range(_T):
            inner.append(K.Assign(f"acc{i}_{j}", K.Bin("add", _r(f"acc{i}_{j}", F32), K.Bin("mul", _r(f"fa{i}", F32), _r(f"fb{j}", F32)))))
    loop += [K.For("kk", _c(0), _c(bk), tuple(inner)), K.Barrier()]
    body.append(K.For("kt", _c(0), _c(k // bk), tuple(loop)))
    for i in range(_T):
        r = _add(_r("row0"), _mul(_r("ty"), _T), i)
        for j in range(_T):
            c = _add(_r("col0"), _mul(_r("tx"), _T), j)
            body.append(
                K.If(K.Bin("and", K.Bin("lt", r, _r("m")), K.Bin("lt", c, _r("n"))), (K.Store("y", _add(_mul(r, _r("n")), c), _r(f"acc{i}_{j}", F32)),))
            )
    shared = (K.Shared("As", F32, bk * stride), K.Shared("Bs", F32, bk * stride))
    if words:
        weights: tuple[K.Param, ...] = (K.Buffer("w", I32),)
        rest: tuple[K.Param, ...] = ()
    else:
        weights, rest = (K.Buffer("w", dt.u8), K.Buffer("lut", F32)), (K.ScalarParam("row_bytes", I32),)
    params = (K.Buffer("x", F32), *weights, K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32), *rest)
    kern = K.Kernel(f"gemm_simt_{qtype}{'' if words or qtype != 'bf16' else '_bytes'}_K{k}_BK{bk}", params, tuple(body), (threads, 1, 1), shared)
    verify_kernel(kern)
    return kern
