"""RMSNorm for GPUs with 32-lane subgroups, built as Kernel IR, that also writes its output quantized
for the dp4a GEMVs that read it (``q8x``): the norm and ``quantize_q8x2`` in one launch, a row a
workgroup, a thread a word of four values (one 16-byte load of each input)."""

from __future__ import annotations

from functools import lru_cache

from .. import ir as K
from ..verify import verify_kernel
from ._kir import F32, I32, _add, _b, _c, _f, _mul, _r
from .q8x import q8_quantize_word

__all__ = ["rms_norm_q8", "rms_norm_q8_body", "norm_q8_threads"]

NORM_BUFFERS = {nm: nm for nm in ("a", "b", "x", "w", "h", "y", "xq", "xr", "xds", "eps")}


def rms_norm_q8_body(
    k: int, threads: int, add: bool, unit_offset: bool, subgroup: int, row: K.Expr, p: str = "", bufs: dict[str, str] | None = None
) -> tuple[list[K.Stmt], list[K.Stmt], tuple[K.Shared, ...]]:
    """``rms_norm_q8``'s work on row ``row`` by ``threads`` threads (a word of four values each turn:
    ``k / 4`` a multiple of ``threads``): the statements that read the weight, those after (which
    every thread reaches), and the workgroup array they use. Locals and that array are prefixed
    ``p``; buffers and the ``eps`` scalar are named by ``bufs`` (default: as ``rms_norm_q8`` names
    them), so that another kernel can end with a norm."""
    nm = {**NORM_BUFFERS, **(bufs or {})}
    words = k // 4
    if words % threads or threads % subgroup:
        raise ValueError(f"rms_norm_q8: {words} words of four values do not split into turns of {threads} threads in subgroups of {subgroup}")
    turns, warps = words // threads, threads // subgroup
    tid = K.Builtin("thread_id", 0)
    first: list[K.Stmt] = [K.Let(f"{p}row", row), K.Let(f"{p}lane", _b("rem", tid, subgroup)), K.Let(f"{p}warp", _b("div", tid, subgroup))]
    for u in range(turns):  # the weight first: it overlaps the launch before
        first.append(K.VecLoad(tuple(f"{p}w{u}_{j}" for j in range(4)), nm["w"], _mul(_add(tid, u * threads), 4), F32))
    body: list[K.Stmt] = []
    ss: K.Expr = _f(0.0)
    for u in range(turns):
        at = _add(_mul(_r(f"{p}row"), k), _mul(_add(tid, u * threads), 4))
        if add:
            body += [K.VecLoad(tuple(f"{p}a{u}_{j}" for j in range(4)), nm["a"], at, F32), K.VecLoad(tuple(f"{p}b{u}_{j}" for j in range(4)), nm["b"], at, F32)]
            body += [K.Let(f"{p}v{u}_{j}", K.Bin("add", _r(f"{p}a{u}_{j}", F32), _r(f"{p}b{u}_{j}", F32))) for j in range(4)]
            body.append(K.VecStore(nm["h"], at, tuple(_r(f"{p}v{u}_{j}", F32) for j in range(4))))
        else:
            body.append(K.VecLoad(tuple(f"{p}v{u}_{j}" for j in range(4)), nm["x"], at, F32))
        for j in range(4):
            ss = K.Bin("add", ss, K.Bin("mul", _r(f"{p}v{u}_{j}", F32), _r(f"{p}v{u}_{j}", F32)))
    part = f"{p}part"
    body += [
        K.Let(f"{p}wss", K.SubgroupReduce("add", ss)),
        K.If(K.Bin("eq", _r(f"{p}lane"), _c(0)), (K.Store(part, _r(f"{p}warp"), _r(f"{p}wss", F32)),)),
        K.Barrier(),
    ]
    if warps <= subgroup:  # a subgroup sum of the subgroups' sums
        body.append(
            K.Let(
                f"{p}tot",
                K.SubgroupReduce(
                    "add", K.Select(K.Bin("lt", _r(f"{p}lane"), _c(warps)), K.Load(part, K.Bin("min", _r(f"{p}lane"), _c(warps - 1)), F32), _f(0.0))
                ),
            )
        )
    else:
        body += [
            K.Let(f"{p}tot", _f(0.0)),
            K.For(f"{p}pi", _c(0), _c(warps), (K.Assign(f"{p}tot", K.Bin("add", _r(f"{p}tot", F32), K.Load(part, _r(f"{p}pi"), F32))),)),
        ]
    body += [K.Let(f"{p}scale", K.Un("rsqrt", K.Bin("add", K.Bin("div", _r(f"{p}tot", F32), _f(float(k))), _r(nm["eps"], F32))))]
    for u in range(turns):
        at = _add(_mul(_r(f"{p}row"), k), _mul(_add(tid, u * threads), 4))
        ys = []
        for j in range(4):
            g: K.Expr = _r(f"{p}w{u}_{j}", F32)
            if unit_offset:
                g = K.Bin("add", g, _f(1.0))
            body.append(K.Let(f"{p}y{u}_{j}", K.Bin("mul", K.Bin("mul", _r(f"{p}v{u}_{j}", F32), _r(f"{p}scale", F32)), g)))
            ys.append(_r(f"{p}y{u}_{j}", F32))
        body += [
            K.VecStore(nm["y"], at, tuple(ys)),
            K.Let(f"{p}qi{u}", _add(_mul(_r(f"{p}row"), words), _add(tid, u * threads))),
            *q8_quantize_word(ys, None, f"{p}qi{u}", f"_{p}{u}", (nm["xq"], nm["xr"], nm["xds"])),
        ]
    return first, body, (K.Shared(part, F32, warps),)


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
    first, rest, shared = rms_norm_q8_body(k, threads, add, unit_offset, subgroup, K.Builtin("group_id", 0))
    body = [*first, K.AwaitPrior(), *rest]
    ins = (K.Buffer("a", F32), K.Buffer("b", F32)) if add else (K.Buffer("x", F32),)
    outs = ("h", "y") if add else ("y",)
    params = (
        *ins,
        K.Buffer("w", F32),
        *(K.Buffer(nm, F32, readonly=False) for nm in outs),
        K.Buffer("xq", I32, readonly=False),
        K.Buffer("xr", I32, readonly=False),
        K.Buffer("xds", F32, readonly=False),
        K.ScalarParam("eps", F32),
    )
    name = f"{'add_' if add else ''}rms_norm_q8_K{k}{'_UNIT_OFFSET' if unit_offset else ''}" + ("" if subgroup == 32 else f"_SG{subgroup}")
    kern = K.Kernel(name, params, tuple(body), (threads, 1, 1), shared)
    verify_kernel(kern)
    return kern
