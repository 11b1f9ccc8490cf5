"""Decode attention a warp a position, built as Kernel IR over paged KV pools
(``attention_decode``): a GPU schedule over 32-lane subgroups, chosen where a backend has
verified it (``Schedules.warp_decode``), and the pool helpers attention kernels of backends share
(``pool_dtype``, ``pool_load``, ``fmax``; public through ``poot.kernel.build``).
"""

from __future__ import annotations

from functools import lru_cache

from ...graph import dtypes as dt
from .. import ir as K
from ..verify import verify_kernel
from ._kir import _add, _b, _c, _f, _mul, _r
from .q8x import q8_quantize_lane

__all__ = ["attention_decode", "DECODE_UNROLL", "DECODE_WARPS", "pool_dtype", "pool_load", "fmax"]

F32, I32 = dt.f32, dt.i32
_NEG = -3.0e38  # a masked score


def pool_dtype(kernel: str, pt: str) -> dt.DType:
    """The element type of KV pools of ``pt`` ("f32" or "f16"); ValueError naming ``kernel`` otherwise."""
    if pt not in ("f32", "f16"):
        raise ValueError(f"{kernel}: KV pools of f32 or f16, got {pt}")
    return F32 if pt == "f32" else dt.f16


def pool_load(names: tuple[str, ...], pool: str, at: K.Expr, dtype: dt.DType) -> list[K.Stmt]:
    """Locals ``names`` (f32) from consecutive elements of ``pool`` at ``at``: one wide load, halves
    widened after it."""
    if dtype == F32:
        return [K.VecLoad(names, pool, at, F32)]
    return [K.VecLoad(tuple(f"{nm}_h" for nm in names), pool, at, dtype), *(K.Let(nm, K.Cast(_r(f"{nm}_h", dtype), F32)) for nm in names)]


def fmax(a: K.Expr, b: K.Expr) -> K.Expr:
    """The larger of two f32 expressions."""
    return K.Bin("max", a, b)


DECODE_UNROLL = 4  # positions a warp scores per step (their key and value loads in flight together)
DECODE_WARPS = 16  # warps a decode attention workgroup: 64 positions a step


@lru_cache(maxsize=None)
def attention_decode(
    d: int = 128, causal: bool = True, splits: int = 1, pt: str = "f32", warps: int = 0, q8: bool = False, softcap: bool = True, group: int = 1
) -> K.Kernel:
    """Decode attention with a warp per position: out[t, h, :] = softmax(scale * q.k) v over token t's
    visible context, the parameters of ``attention.attention`` (``splits`` > 1: this workgroup's share
    of the context, partial results for ``attention.attention_merge``). ``warps`` warps (default
    ``DECODE_WARPS``) walk the context ``DECODE_UNROLL`` positions each a step, so a step has
    ``warps * DECODE_UNROLL`` positions' loads in flight (a decode context of up to 64 is one step:
    the kernel is a chain of memory latencies, a step each); the 32 lanes of a warp hold d / 32
    dimensions each, so a key or value row is one coalesced load a warp, and a score is a subgroup
    sum. Each warp keeps its own running max, sum and output; they are combined at the end through
    workgroup memory. The token's sequence, context and first step's block-table entries are read
    before the wait for the launch before (``AwaitPrior``: the step's inputs, which no launch
    writes), so they overlap it. Heads of ``d`` = 64 or 128 values (keys and values), no shared key
    part. Each step issues the next step's key and value loads before its own sums (a context of
    two steps waits on one memory latency, not two). Pools of ``pt`` "f32" or "f16" (halves widened
    as they are read). Soft-capping is compiled in only with ``softcap``.

    ``group`` 2 or 4: a workgroup scores ``group`` query heads that share one key/value head
    (grouped-query attention; ``group`` must divide hq / hkv), so each key and value row is loaded once for
    all of them instead of once a head: grid (tokens, hq / group, splits), against (tokens, hq,
    splits) for one head a workgroup. With ``q8`` (one share, ``splits`` 1, ``group`` 1) the output is
    also written as the two int8 terms the dp4a GEMVs read (``q8x``: buffers ``xq``, ``xr``, ``xds``),
    a warp a block of 32 dimensions."""
    if d not in (64, 128):
        raise ValueError(f"attention_decode: head width 64 or 128, got {d}")
    if q8 and splits != 1:
        raise ValueError("attention_decode: the output quantized (q8) by a kernel that takes the whole context (splits 1)")
    if q8 and group != 1:
        raise ValueError("attention_decode: the output quantized (q8) by a kernel of one head a workgroup (group 1)")
    if warps not in (0, 1, 2, 4, 8, 16, 32) or warps * 32 > 1024:
        raise ValueError(f"attention_decode: 1 to 32 warps, a power of two, got {warps}")
    if group not in (1, 2, 4):
        raise ValueError(f"attention_decode: a group of 1, 2 or 4 query heads, got {group}")
    pool = pool_dtype("attention_decode", pt)
    e, un, warps = d // 32, DECODE_UNROLL, warps or DECODE_WARPS
    gs = range(group)

    def g_(name: str, g: int) -> str:  # a local of head g of the group (one head: the plain name)
        return name if group == 1 else f"{name}g{g}"

    body: list[K.Stmt] = [
        K.Let("t", K.Builtin("group_id", 0)),
        K.Let("h", K.Builtin("group_id", 1) if group == 1 else _mul(K.Builtin("group_id", 1), group)),
        K.Let("split", K.Builtin("group_id", 2)),
        K.Let("tid", K.Builtin("thread_id", 0)),
        K.Let("lane", _b("rem", _r("tid"), 32)),
        K.Let("warp", _b("div", _r("tid"), 32)),
        K.Let("kvh", _b("div", _r("h"), _b("div", _r("hq"), _r("hkv")))),
        K.Let("s", K.Load("seq_ids", _r("t"), I32)),
        K.Let("pos", K.Load("positions", _r("t"), I32)),
        K.Let("wend", K.Bin("min", K.Load("ctx_lens", _r("s"), I32), _add(_r("pos"), 1)) if causal else K.Load("ctx_lens", _r("s"), I32)),
        K.Let("wstart", K.Select(K.Bin("gt", _r("window"), _c(0)), K.Bin("max", _c(0), _add(_b("sub", _r("pos"), _r("window")), 1)), _c(0))),
    ]
    if splits > 1:  # this workgroup's share, in runs of 32 positions
        body += [
            K.Let("runs", _b("div", _add(_b("sub", _r("wend"), _r("wstart")), 31), 32)),
            K.Let("per", _b("div", _add(_r("runs"), splits - 1), splits)),
            K.Let("s0", _add(_r("wstart"), _mul(_mul(_r("split"), _r("per")), 32))),
            K.Assign("wend", K.Bin("min", _r("wend"), _add(_r("s0"), _mul(_r("per"), 32)))),
            K.Assign("wstart", _r("s0")),
        ]

    def block(j: K.Expr) -> K.Expr:  # the pool block of position j (clamped into the context)
        return K.Load("block_tables", _add(_mul(_r("s"), _r("mb")), _b("div", K.Bin("max", K.Bin("min", j, _b("sub", _r("wend"), 1)), _c(0)), _r("bs"))), I32)

    # the first step's block-table entries, before the wait (the step's inputs: no launch writes them)
    body += [K.Let(f"bt{u}", block(_add(_r("wstart"), _r("warp"), warps * u))) for u in range(un)]
    body.append(K.AwaitPrior())
    for g in gs:
        head = _r("h") if g == 0 else _add(_r("h"), g)
        body.append(K.VecLoad(tuple(g_(f"q{i}", g) for i in range(e)), "q", _add(_mul(_add(_mul(_r("t"), _r("hq")), head), d), _mul(_r("lane"), e)), F32))
    for g in gs:
        body += [K.Let(g_("m", g), _f(_NEG)), K.Let(g_("l", g), _f(0.0))] + [K.Let(g_(f"acc{i}", g), _f(0.0)) for i in range(e)]

    def loads(jb: K.Expr, sfx: str, first: bool) -> list[K.Stmt]:
        """The key and value rows of the step from position ``jb`` (clamped into the context, so
        always in the pools), as locals ``k{u}_{i}``/``v{u}_{i}`` suffixed ``sfx``."""
        out: list[K.Stmt] = []
        for u in range(un):
            j = _add(jb, _r("warp"), warps * u)
            out += [
                K.Let(f"jc{u}{sfx}", K.Bin("max", K.Bin("min", j, _b("sub", _r("wend"), 1)), _c(0))),
                K.Let(f"sl{u}{sfx}", _add(_mul(_r(f"bt{u}") if first else block(j), _r("bs")), _b("rem", _r(f"jc{u}{sfx}"), _r("bs")))),
                K.Let(f"row{u}{sfx}", _add(_mul(_add(_mul(_r(f"sl{u}{sfx}"), _r("hkv")), _r("kvh")), d), _mul(_r("lane"), e))),
                *pool_load(tuple(f"k{u}_{i}{sfx}" for i in range(e)), "k_pool", _r(f"row{u}{sfx}"), pool),
                *pool_load(tuple(f"v{u}_{i}{sfx}" for i in range(e)), "v_pool", _r(f"row{u}{sfx}"), pool),
            ]
        return out

    kv = [f"{t}{u}_{i}" for u in range(un) for t in "kv" for i in range(e)]
    body += loads(_r("wstart"), "", True)  # the first step's rows; each step issues the next step's before its sums
    step: list[K.Stmt] = [*loads(_add(_r("jb"), warps * un), "_n", False)]
    step += [K.Let(f"j{u}", _add(_r("jb"), _r("warp"), warps * u)) for u in range(un)]
    for g in gs:
        for u in range(un):
            dot: K.Expr = K.Bin("mul", _r(g_("q0", g), F32), _r(f"k{u}_0", F32))
            for i in range(1, e):
                dot = K.Bin("add", dot, K.Bin("mul", _r(g_(f"q{i}", g), F32), _r(f"k{u}_{i}", F32)))
            step.append(K.Let(g_(f"dot{u}", g), K.SubgroupReduce("add", dot)))
            sv: K.Expr = K.Bin("mul", _r(g_(f"dot{u}", g), F32), _r("scale", F32))
            if softcap:
                sv = K.Select(
                    K.Bin("gt", _r("softcap", F32), _f(0.0)), K.Bin("mul", K.Un("tanh", K.Bin("div", sv, _r("softcap", F32))), _r("softcap", F32)), sv
                )
            step.append(K.Let(g_(f"sc{u}", g), K.Select(K.Bin("lt", _r(f"j{u}"), _r("wend")), sv, _f(_NEG))))
    for g in gs:
        mx: K.Expr = _r(g_("m", g), F32)
        for u in range(un):
            mx = fmax(mx, _r(g_(f"sc{u}", g), F32))
        step += [
            K.Let(g_("mn", g), mx),
            K.Let(g_("corr", g), K.Un("exp", K.Bin("sub", _r(g_("m", g), F32), _r(g_("mn", g), F32)))),
            K.Assign(g_("m", g), _r(g_("mn", g), F32)),
            K.Assign(g_("l", g), K.Bin("mul", _r(g_("l", g), F32), _r(g_("corr", g), F32))),
        ]
        step += [K.Assign(g_(f"acc{i}", g), K.Bin("mul", _r(g_(f"acc{i}", g), F32), _r(g_("corr", g), F32))) for i in range(e)]
        for u in range(un):
            p = g_(f"p{u}", g)
            step += [
                K.Let(
                    p,
                    K.Select(
                        K.Bin("gt", _r(g_(f"sc{u}", g), F32), _f(-1.0e38)), K.Un("exp", K.Bin("sub", _r(g_(f"sc{u}", g), F32), _r(g_("mn", g), F32))), _f(0.0)
                    ),
                ),
                K.Assign(g_("l", g), K.Bin("add", _r(g_("l", g), F32), _r(p, F32))),
            ]
            step += [K.Assign(g_(f"acc{i}", g), K.Bin("add", _r(g_(f"acc{i}", g), F32), K.Bin("mul", _r(p, F32), _r(f"v{u}_{i}", F32)))) for i in range(e)]
    step += [K.Assign(nm, _r(f"{nm}_n", F32)) for nm in kv]
    body.append(K.For("jb", _r("wstart"), _r("wend"), tuple(step), step=warps * un))
    # the warps' results combined: out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M); head g's
    # at g * warps (maxima and sums) and g * warps * d (outputs) of workgroup memory
    for g in gs:
        wi = _r("warp") if g == 0 else _add(_r("warp"), g * warps)
        body += [
            K.If(K.Bin("eq", _r("lane"), _c(0)), (K.Store("wm", wi, _r(g_("m", g), F32)), K.Store("wl", wi, _r(g_("l", g), F32)))),
            K.VecStore("wacc", _add(_mul(wi, d), _mul(_r("lane"), e)), tuple(_r(g_(f"acc{i}", g), F32) for i in range(e))),
        ]
    body.append(K.Barrier())
    fin: list[K.Stmt] = []
    for g in gs:
        wms: list[K.Expr] = [K.Load("wm", _c(g * warps + w), F32) for w in range(warps)]
        while len(wms) > 1:  # the largest of the warps' maxima, as a tree
            wms = [fmax(wms[i], wms[i + 1]) for i in range(0, len(wms), 2)]
        mm, ll, aa = g_("mm", g), g_("ll", g), g_("aa", g)
        fin += [K.Let(mm, wms[0]), K.Let(ll, _f(0.0)), K.Let(aa, _f(0.0))]
        for w in range(warps):
            f = g_(f"f{w}", g)
            fin += [
                K.Let(f, K.Un("exp", K.Bin("sub", K.Load("wm", _c(g * warps + w), F32), _r(mm, F32)))),
                K.Assign(ll, K.Bin("add", _r(ll, F32), K.Bin("mul", K.Load("wl", _c(g * warps + w), F32), _r(f, F32)))),
                K.Assign(aa, K.Bin("add", _r(aa, F32), K.Bin("mul", K.Load("wacc", _add(_c((g * warps + w) * d), _r("tid")), F32), _r(f, F32)))),
            ]
        row = _add(_mul(_r("t"), _r("hq")), _r("h") if g == 0 else _add(_r("h"), g))
        if splits > 1:
            part = _add(_mul(row, splits), _r("split"))
            fin += [
                K.Store("out", _add(_mul(part, d), _r("tid")), _r(aa, F32)),
                K.If(K.Bin("eq", _r("tid"), _c(0)), (K.Store("part_m", part, _r(mm, F32)), K.Store("part_l", part, _r(ll, F32)))),
            ]
        else:
            o = g_("o", g)
            fin += [
                K.Let(o, K.Select(K.Bin("gt", _r(ll, F32), _f(0.0)), K.Bin("div", _r(aa, F32), _r(ll, F32)), _f(0.0))),
                K.Store("out", _add(_mul(row, d), _r("tid")), _r(o, F32)),
            ]
            if q8:  # d is a multiple of 32: whole warps, each a block
                fin += q8_quantize_lane(_r(o, F32), _b("div", _add(_mul(row, d), _r("tid")), 4), _r("lane"))
    body.append(K.If(K.Bin("lt", _r("tid"), _c(d)), tuple(fin)))
    params = (
        K.Buffer("q", F32),
        K.Buffer("k_pool", pool),
        K.Buffer("v_pool", pool),
        K.Buffer("ks_pool", pool),
        K.Buffer("positions", I32),
        K.Buffer("seq_ids", I32),
        K.Buffer("ctx_lens", I32),
        K.Buffer("block_tables", I32),
        K.Buffer("out", F32, readonly=False),
        K.Buffer("part_m", F32, readonly=False),
        K.Buffer("part_l", F32, readonly=False),
        *((K.Buffer("xq", I32, readonly=False), K.Buffer("xr", I32, readonly=False), K.Buffer("xds", F32, readonly=False)) if q8 else ()),
        *(K.ScalarParam(nm, I32) for nm in ("hq", "hkv", "dk", "dv", "dr", "bs", "mb")),
        K.ScalarParam("scale", F32),
        K.ScalarParam("window", I32),
        K.ScalarParam("softcap", F32),
    )
    shared = (K.Shared("wm", F32, group * warps), K.Shared("wl", F32, group * warps), K.Shared("wacc", F32, group * warps * d))
    kern = K.Kernel(
        f"attention_decode_D{d}{'_causal' if causal else ''}_S{splits}"
        + ("" if warps == DECODE_WARPS else f"_W{warps}")
        + ("" if group == 1 else f"_G{group}")
        + ("" if softcap else "_nocap")
        + ("_PTf16" if pt == "f16" else "")
        + ("_Q8" if q8 else ""),
        params,
        tuple(body),
        (32 * warps, 1, 1),
        shared,
        # a group's registers (its heads' queries, sums and outputs) capped so that 16 warps launch
        min_groups=1 if group > 1 and warps == 16 else 0,
    )
    verify_kernel(kern)
    return kern
