"""RMSNorm for GPUs with 32-lane subgroups, built as Kernel IR, that also writes its output quantized
for the dp4a GEMVs that read it (``q8x``): the norm and ``quantize_q8x2`` in one launch, a row a
workgroup, a thread a word of four values (one 16-byte load of each input)."""

from __future__ import annotations

from functools import lru_cache

from .. import ir as K
from ..verify import verify_kernel
from ._kir import F32, I32, _add, _b, _c, _f, _mul, _r
from .q8x import q8_quantize_word

__all__ = ["rms_norm_q8", "norm_q8_threads"]


def norm_q8_threads(k: int) -> int:
    """Threads of ``rms_norm_q8``'s workgroup for rows of ``k`` values: a word of four values each
    turn, whole warps, at most 1024."""
    words = k // 4
    turns = -(-words // 1024)
    while words % (turns * 32):
        turns += 1
    return words // turns


@lru_cache(maxsize=None)
def rms_norm_q8(k: int, add: bool = False, unit_offset: bool = False, subgroup: int = 32) -> K.Kernel:
    """y = x / sqrt(mean(x^2) + eps) * w (``unit_offset``: * (1 + w), Gemma), with ``add`` the
    residual add before it (h = a + b written, x = h), a row of ``k`` values a workgroup; y is
    written as f32 and as the two int8 terms of ``quantize_q8x2`` (buffers ``xq``, ``xr``, ``xds``,
    the same words). The weight (f32) is read before the wait for the launch before (no launch
    writes it). The sum of squares: a subgroup sum each ``subgroup`` lanes (the device's width, 8
    or more: a block's eight threads share its max by shuffles), those sums through workgroup
    memory. K a multiple of 256. Grid (rows,)."""
    if k % 256:
        raise ValueError(f"rms_norm_q8 needs K a multiple of 256, got {k}")
    if subgroup not in (8, 16, 32, 64):
        raise ValueError(f"rms_norm_q8 needs subgroups of 8, 16, 32 or 64 lanes, got {subgroup}")
    threads = norm_q8_threads(k)
    words = k // 4
    turns, warps = words // threads, threads // subgroup
    tid = K.Builtin("thread_id", 0)
    body: list[K.Stmt] = [K.Let("row", K.Builtin("group_id", 0)), K.Let("lane", _b("rem", tid, subgroup)), K.Let("warp", _b("div", tid, subgroup))]
    for u in range(turns):  # the weight first: it overlaps the launch before
        body.append(K.VecLoad(tuple(f"w{u}_{j}" for j in range(4)), "w", _mul(_add(tid, u * threads), 4), F32))
    body.append(K.AwaitPrior())
    ss: K.Expr = _f(0.0)
    for u in range(turns):
        at = _add(_mul(_r("row"), k), _mul(_add(tid, u * threads), 4))
        if add:
            body += [K.VecLoad(tuple(f"a{u}_{j}" for j in range(4)), "a", at, F32), K.VecLoad(tuple(f"b{u}_{j}" for j in range(4)), "b", at, F32)]
            body += [K.Let(f"v{u}_{j}", K.Bin("add", _r(f"a{u}_{j}", F32), _r(f"b{u}_{j}", F32))) for j in range(4)]
            body.append(K.VecStore("h", at, tuple(_r(f"v{u}_{j}", F32) for j in range(4))))
        else:
            body.append(K.VecLoad(tuple(f"v{u}_{j}" for j in range(4)), "x", at, F32))
        for j in range(4):
            ss = K.Bin("add", ss, K.Bin("mul", _r(f"v{u}_{j}", F32), _r(f"v{u}_{j}", F32)))
    body += [K.Let("wss", K.SubgroupReduce("add", ss)),
             K.If(K.Bin("eq", _r("lane"), _c(0)), (K.Store("part", _r("warp"), _r("wss", F32)),)),
             K.Barrier()]
    if warps <= subgroup:  # a subgroup sum of the subgroups' sums
        body.append(K.Let("tot", K.SubgroupReduce("add", K.Select(K.Bin("lt", _r("lane"), _c(warps)),
                                                                 K.Load("part", K.Bin("min", _r("lane"), _c(warps - 1)), F32), _f(0.0)))))
    else:
        body += [K.Let("tot", _f(0.0)), K.For("pi", _c(0), _c(warps), (K.Assign("tot", K.Bin("add", _r("tot", F32), K.Load("part", _r("pi"), F32))),))]
    body += [K.Let("scale", K.Un("rsqrt", K.Bin("add", K.Bin("div", _r("tot", F32), _f(float(k))), _r("eps", F32))))]
    for u in range(turns):
        at = _add(_mul(_r("row"), k), _mul(_add(tid, u * threads), 4))
        ys = []
        for j in range(4):
            g: K.Expr = _r(f"w{u}_{j}", F32)
            if unit_offset:
                g = K.Bin("add", g, _f(1.0))
            body.append(K.Let(f"y{u}_{j}", K.Bin("mul", K.Bin("mul", _r(f"v{u}_{j}", F32), _r("scale", F32)), g)))
            ys.append(_r(f"y{u}_{j}", F32))
        body += [K.VecStore("y", at, tuple(ys)), K.Let(f"qi{u}", _add(_mul(_r("row"), words), _add(tid, u * threads))),
                 *q8_quantize_word(ys, None, f"qi{u}", f"_{u}")]
    ins = (K.Buffer("a", F32), K.Buffer("b", F32)) if add else (K.Buffer("x", F32),)
    outs = ("h", "y") if add else ("y",)
    params = (*ins, K.Buffer("w", F32), *(K.Buffer(nm, F32, readonly=False) for nm in outs), K.Buffer("xq", I32, readonly=False),
              K.Buffer("xr", I32, readonly=False), K.Buffer("xds", F32, readonly=False), K.ScalarParam("eps", F32))
    name = f"{'add_' if add else ''}rms_norm_q8_K{k}{'_UNIT_OFFSET' if unit_offset else ''}" + ("" if subgroup == 32 else f"_SG{subgroup}")
    kern = K.Kernel(name, params, tuple(body), (threads, 1, 1), (K.Shared("part", F32, warps),))
    verify_kernel(kern)
    return kern

