"""Matrix-vector products for GPUs (decode), built as Kernel IR: schedules that use the chip.

``gemv_warp``: one warp per output feature reads its weight row with 16-byte loads (eight bf16
values, or a quarter of a Q4_K block's quants per lane), so every byte of the weights is read once
per step at close to the memory's bandwidth; ``MR`` rows of x share each load. Sums are finished
with a subgroup reduction. The Q4_K one first quantizes the workgroup's rows of x in workgroup
memory to two int8 terms per value (per 32 values a scale, as llama.cpp's Q8_1, and a second term
for the remainder: about 15 bits of each value) and sums quants by ``dp4a``: dequantizing nibbles
to floats costs more instructions than the chip can issue at full memory bandwidth (that
quantization is ``q8x``'s; its public names are re-exported here, as are ``gemv_packed``'s
GEMVs for the other packed types). Tensor-core products for more rows are a backend's own
(``Schedules.matmul_many_rows``).

Weight rows are bound as i32 words (pairs of bf16 values; the words of Q4_K blocks).
"""

from __future__ import annotations

from functools import lru_cache

from .. import ir as K
from ..verify import verify_kernel
from ._kir import F32, I32, _add, _b, _c, _f, _fma, _hi16, _lo16, _mul, _r, _silu_mul
from .gemv_packed import gemv_warp_packed, gemv_warp_q6_k
from .q8x import Q8_SPLIT, Q8_THREADS, _quantize_x_q8, _stage_x_q8, q8_quantize_lane, q8_shared_words, quantize_q8x2

__all__ = [
    "gemv_warp",
    "gemv_warp_packed",
    "gemv_warp_q6_k",
    "quantize_q8x2",
    "q4_k_lane_scales",
    "q4_k_bf16_pairs",
    "GEMV_TYPES",
    "Q4_K_WARPS",
    "Q8_THREADS",
    "q8_shared_words",
]

GEMV_TYPES = ("bf16", "q4_k")


# -- decode: one warp per output feature ------------------------------------------------------------


def _bf16_rows(weights: list[str], k: int, mr: int) -> tuple[list[K.Stmt], int]:
    """The loop body of a bf16 warp GEMV step: ``un`` 16-byte loads of each weight row issued first,
    then x (shared by the weights) and the products."""
    un = 8 if k % 2048 == 0 else 4 if k % 1024 == 0 else 2 if k % 512 == 0 else 1
    inner: list[K.Stmt] = []
    for u in range(un):
        inner.append(K.Let(f"kb{u}", _add(_mul(_r("it"), 256 * un), 256 * u, _mul(_r("lane"), 8))))
        for wb in weights:
            inner.append(K.VecLoad(tuple(f"{wb}{u}_{q}" for q in range(4)), wb, _b("div", _add(_mul(_r("j"), k), _r(f"kb{u}")), 2), I32))
    for u in range(un):
        for r in range(mr):
            xi = _add(_r(f"xr{r}"), _r(f"kb{u}"))
            inner += [
                K.VecLoad(tuple(f"x{u}_{r}_{i}" for i in range(4)), "x", xi, F32),
                K.VecLoad(tuple(f"x{u}_{r}_{i}" for i in range(4, 8)), "x", _add(xi, 4), F32),
            ]
            for wb in weights:
                acc: K.Expr = _r(f"{wb}acc{r}", F32)
                for q in range(4):
                    acc = _fma(acc, _r(f"x{u}_{r}_{2 * q}", F32), _lo16(_r(f"{wb}{u}_{q}")))
                    acc = _fma(acc, _r(f"x{u}_{r}_{2 * q + 1}", F32), _hi16(_r(f"{wb}{u}_{q}")))
                inner.append(K.Assign(f"{wb}acc{r}", acc))
    return inner, un


Q4_K_WARPS = 16  # a workgroup's quantized x serves this many features (512 threads: up to 128 registers each)


def q4_k_lane_scales(p: str, u: int | str) -> list[K.Stmt]:
    """A Q4_K lane's two sub-blocks 2c and 2c + 1 (locals ``c`` and ``sh = 16 (c % 2)``): from the
    block's first four words ``{p}dm{u}``, ``{p}s0{u}``..``{p}s2{u}``, the scales ``{p}scl{u}``,
    ``{p}sch{u}`` and mins ``{p}mnl{u}``, ``{p}mnh{u}`` (f32, d and dmin applied) of its low and
    high nibbles. ggml's get_scale_min_k4 for both sub-blocks at once, as 16-bit pairs (the bytes
    2c, 2c + 1 of the scales and of the mins): halfwords of the three scale words at the lane's
    fixed shift ``sh``, the branch on c < 2 a lane-constant select."""
    out: list[K.Stmt] = [
        K.Let(f"{p}d{u}", K.HalfToF32(_b("and", _r(f"{p}dm{u}"), 0xFFFF))),
        K.Let(f"{p}dmin{u}", K.HalfToF32(_b("and", _b("shr", _r(f"{p}dm{u}"), 16), 0xFFFF))),
    ]
    a0, a1, a2 = (_b("shr", _r(f"{p}s{i}{u}"), _r("sh")) for i in range(3))
    small = K.Bin("lt", _r("c"), _c(2))
    scp = K.Select(small, _b("and", a0, 0x3F3F), _b("or", _b("and", a2, 0x0F0F), _b("shr", _b("and", a0, 0xC0C0), 2)))
    mnp = K.Select(small, _b("and", a1, 0x3F3F), _b("or", _b("and", _b("shr", a2, 4), 0x0F0F), _b("shr", _b("and", a1, 0xC0C0), 2)))
    out += [K.Let(f"{p}scp{u}", scp), K.Let(f"{p}mnp{u}", mnp)]
    for part, shift in (("l", 0), ("h", 8)):
        sc = _b("and", _b("shr", _r(f"{p}scp{u}"), shift), 255)
        mn = _b("and", _b("shr", _r(f"{p}mnp{u}"), shift), 255)
        out += [
            K.Let(f"{p}sc{part}{u}", K.Bin("mul", _r(f"{p}d{u}", F32), K.Cast(sc, F32))),
            K.Let(f"{p}mn{part}{u}", K.Bin("mul", _r(f"{p}dmin{u}", F32), K.Cast(mn, F32))),
        ]
    return out


def _magic_halves(word: K.Expr) -> tuple[K.Expr, K.Expr]:
    """The low 20 bits of i32 ``word``, and its upper half shifted down, each under the bits of 2^23
    (0x4B000000): masking one of them to a nibble at bit ``at`` makes the float 2^23 + q 2^at
    (``_nibble_times``)."""
    lo = _b("or", _b("and", word, 0xFFFFF), 0x4B000000)
    hi = _b("or", _b("and", _b("shr", word, 16), 0xFFFF), 0x4B000000)
    return lo, hi


def _nibble_times(halves: tuple[K.Expr, K.Expr], at: int, scale: K.Expr) -> K.Expr:
    """``scale`` times the 4-bit value q at bit ``at`` of a word (given as ``_magic_halves``), exactly
    ``scale * f32(q)`` (a Q4_K scale has at most 17 significant bits, so the product is exact either
    way), without an integer-to-float conversion (a quarter of the rate on NVIDIA GPUs) nor a shift a
    value: the nibble under the bits of 2^23 is the float 2^23 + q 2^at (``at`` up to 19; higher
    nibbles are read from the shifted upper half), subtracting 2^23 leaves q 2^at exactly, and
    ``scale`` 2^-at (one for every value at that bit) scales it back."""
    word = halves[at > 19]
    at -= 16 * (at > 19)
    bits = _b("and", word, -8388608 | (15 << at))  # the exponent's bits (0xFF800000) and the nibble
    q = K.Bin("sub", K.Bitcast(bits, F32), _f(8388608.0))
    return K.Bin("mul", K.Bin("mul", scale, _f(2.0**-at)) if at else scale, q)


def q4_k_bf16_pairs(p: str, part: str, words: list[str], shift: int) -> list[K.Expr]:
    """The Q4_K values in the nibbles at ``shift`` (0: low, 4: high) of the bytes of i32 locals
    ``words``, in order, each ``{p}sc{part} q - {p}mn{part}`` (``q4_k_lane_scales``) as ggml's
    dequantization computes it in f32, as words of two bf16 values (nearest even, the first value
    in the low half): the weights the tensor-core GEMMs take for a Q4_K matrix."""
    sc, mn = _r(f"{p}sc{part}", F32), _r(f"{p}mn{part}", F32)
    halves = [_magic_halves(_r(w)) for w in words]
    vals = [K.Bin("sub", _nibble_times(halves[b // 4], 8 * (b % 4) + shift, sc), mn) for b in range(4 * len(words))]
    return [K.PackBf16x2(vals[2 * q], vals[2 * q + 1]) for q in range(len(vals) // 2)]


def _q4_k_lane(wide: bool) -> list[K.Stmt]:
    """A Q4_K warp GEMV lane's place in its blocks (the same every step): its pair of sub-blocks
    (2c, 2c + 1), 32 quant bytes a block with ``wide`` (four lanes a block), else the half ``hh`` of
    them (eight lanes a block)."""
    if wide:
        out = [K.Let("c", _b("rem", _r("lane"), 4))]
    else:
        out = [K.Let("c", _b("div", _b("rem", _r("lane"), 8), 2)), K.Let("hh", _b("rem", _r("lane"), 2))]
    return out + [K.Let("sh", _mul(_b("rem", _r("c"), 2), 16))]


def _q4_k_block(k: int, un: int, wide: bool, it: K.Expr, u: int, clamp: bool = True) -> K.Expr:
    """The block the lane reads ``u``-th in step ``it`` (``un`` blocks a lane a step); past the row's
    end (K not a multiple of a step's blocks) its last, read again and summed as nothing."""
    per = 8 if wide else 4  # blocks the warp reads at once
    blk = _add(_mul(it, per * un), _b("div", _r("lane"), 32 // per), per * u)
    return K.Bin("min", blk, _c(k // 256 - 1)) if clamp and (k // 256) % (per * un) else blk


def _landed_word(it: K.Expr, pi: int, u: int, h: int, lay: tuple[int, int, int]) -> K.Expr:
    """Where a wide lane's 16-byte chunk ``h`` of block ``u`` of weight ``pi`` in step ``it`` lies in
    the workgroup array ``wl`` (``gemv_warp``'s ``copied``; ``lay``: weights, blocks a lane a step,
    steps copied): each warp's region holds, step by step and weight by weight, the step's blocks
    of its row as they lie in memory (``_q4_k_weight_copies``); chunks 0 and 1 are the lane's
    quants, 2 the block's head. The 16-byte reads of a phase of eight lanes fall in eight different
    groups of four banks (no conflicts); a block's four lanes read its head at one address."""
    np_, un, copied = lay
    step_words = 8 * un * 36
    warp = _b("div", K.Builtin("thread_id", 0), 32)
    blk = _add(_mul(_add(_mul(warp, copied * np_), _mul(it, np_), pi), step_words), _mul(_add(_b("div", _r("lane"), 4), 8 * u), 36))
    return blk if h == 2 else _add(blk, 4 + 4 * h, _mul(_r("c"), 8))


def _q4_k_weight_loads(
    weights: list[str],
    k: int,
    un: int,
    wide: bool,
    it: K.Expr,
    j: K.Expr,
    sfx: str = "",
    bufs: dict[str, str] | None = None,
    landed: tuple[int, int, int] | None = None,
) -> list[K.Stmt]:
    """A Q4_K warp GEMV lane's weight words of step ``it`` of rows ``j``: each of its ``un`` blocks'
    quant words (16 or, ``wide``, 32 bytes) and 16-byte head (d, dmin, scales), as locals
    ``{weight}q{u}_{i}`` and ``{weight}dm{u}``, ``{weight}s0{u}``.. suffixed ``sfx``, read from the
    buffer of that name (or ``bufs[weight]``), or with ``landed`` from where ``_q4_k_weight_copies``
    put them in workgroup memory."""
    nb = k // 256
    qw = 8 if wide else 4  # quant words a lane a block
    loads: list[K.Stmt] = []
    for u in range(un):
        loads.append(K.Let(f"blk{u}{sfx}", _q4_k_block(k, un, wide, it, u)))
        for pi, p in enumerate(weights):
            if landed is not None:
                for h in range(qw // 4):
                    loads.append(K.VecLoad(tuple(f"{p}q{u}_{4 * h + i}{sfx}" for i in range(4)), "wl", _landed_word(it, pi, u, h, landed), I32))
                loads.append(
                    K.VecLoad((f"{p}dm{u}{sfx}", f"{p}s0{u}{sfx}", f"{p}s1{u}{sfx}", f"{p}s2{u}{sfx}"), "wl", _landed_word(it, pi, u, qw // 4, landed), I32)
                )
                continue
            buf = (bufs or {}).get(p, p)
            base = _add(_mul(j, nb * 36), _mul(_r(f"blk{u}{sfx}"), 36))  # a block is 36 words: 16-byte aligned
            loads.append(K.Let(f"{p}base{u}{sfx}", base))
            at = _add(_r(f"{p}base{u}{sfx}"), 4, _mul(_r("c"), 8), 0 if wide else _mul(_r("hh"), 4))
            for h in range(qw // 4):
                loads.append(K.VecLoad(tuple(f"{p}q{u}_{4 * h + i}{sfx}" for i in range(4)), buf, _add(at, 4 * h), I32))
            loads.append(K.VecLoad((f"{p}dm{u}{sfx}", f"{p}s0{u}{sfx}", f"{p}s1{u}{sfx}", f"{p}s2{u}{sfx}"), buf, _r(f"{p}base{u}{sfx}"), I32))
    return loads


def _q4_k_weight_copies(weights: list[str], k: int, un: int, j: K.Expr, lay: tuple[int, int, int], bufs: dict[str, str] | None = None) -> list[K.Stmt]:
    """The blocks a wide warp reads in its first ``lay[2]`` steps of row ``j``, copied as they lie
    into its region of the workgroup array ``wl`` (``CopyAsync``: no registers), 16 bytes a lane a
    copy, consecutive lanes consecutive chunks: every byte is asked for once. Another lane reads a
    chunk (``_landed_word``): a barrier after the wait for the copies comes first."""
    nb, (np_, _, copied) = k // 256, lay
    chunks = 8 * un * 9  # a step's 16-byte chunks: 8 un blocks of 144 bytes
    warp = _b("div", K.Builtin("thread_id", 0), 32)
    out: list[K.Stmt] = []
    for s in range(copied):
        for pi, p in enumerate(weights):
            region = _mul(_add(_mul(warp, copied * np_), s * np_ + pi), chunks * 4)
            src = _mul(_add(_mul(j, nb), s * 8 * un), 36)
            for t in range(-(-chunks // 32)):
                ch = _add(_r("lane"), 32 * t)
                cp = K.CopyAsync("wl", _add(region, _mul(ch, 4)), (bufs or {}).get(p, p), _add(src, _mul(ch, 4)))
                out.append(K.If(K.Bin("lt", ch, _c(chunks)), (cp,)) if 32 * (t + 1) > chunks else cp)
    return out


def _q4_k_weight_names(weights: list[str], un: int, wide: bool) -> list[str]:
    """The locals ``_q4_k_weight_loads`` declares for a step's weight words (unsuffixed)."""
    qw = 8 if wide else 4
    return [
        f"{p}{nm}{u}{tail}"
        for u in range(un)
        for p in weights
        for nm, tail in [*(("q", f"_{i}") for i in range(qw)), ("dm", ""), ("s0", ""), ("s1", ""), ("s2", "")]
    ]


def _q4_k_rows(
    weights: list[str],
    k: int,
    mr: int,
    un: int,
    xglobal: bool,
    wide: bool,
    early: bool = False,
    bufs: dict[str, str] | None = None,
    again: K.Expr | None = None,
    steps: int = 0,
    landed: tuple[int, int, int] | None = None,
) -> list[K.Stmt]:
    """The loop body of a Q4_K warp GEMV step ``it``: each lane's ``un`` blocks of each weight row
    ``j`` (``_q4_k_weight_loads``; ``bufs``: buffers named otherwise than the locals), every load
    issued before any sum, against x quantized to int8 (in workgroup memory, or with ``xglobal`` in
    global memory): dp4a's scaled per sub-block, into ``{weight}acc{r}``. With ``early`` the weight
    words of step 0 are already in their locals (loaded before the loop), and later steps (and step 0
    where ``again`` holds: a warp's later features) load into them. With ``steps`` (the loop's
    count; pipelined) step 0 is in the locals too, and each step asks for the next step's words
    (into ``{name}_n``, declared before the loop) before its own sums, which then become the locals:
    a warp's loads of step it + 1 are in flight while it sums step it. With ``landed`` the words come
    from workgroup memory (``_q4_k_weight_copies``)."""
    nb, nb32 = k // 256, k // 32
    partial = nb % ((8 if wide else 4) * un) != 0
    qw = 8 if wide else 4  # quant words a lane a block
    mask = _c(0x0F0F0F0F)
    tail: list[K.Stmt] = []
    if steps:
        names = _q4_k_weight_names(weights, un, wide)
        ahead_ = _q4_k_weight_loads(weights, k, un, wide, _add(_r("it"), 1), _r("j"), "_t", bufs)
        loads: list[K.Stmt] = [
            *(K.Let(f"blk{u}", _q4_k_block(k, un, wide, _r("it"), u)) for u in range(un)),
            K.If(K.Bin("lt", _add(_r("it"), 1), _c(steps)), (*ahead_, *(K.Assign(f"{nm}_n", _r(f"{nm}_t")) for nm in names))),
        ]
        tail = [K.Assign(nm, _r(f"{nm}_n")) for nm in names]
    elif early:
        names = _q4_k_weight_names(weights, un, wide)
        later = _q4_k_weight_loads(weights, k, un, wide, _r("it"), _r("j"), "_n", bufs)
        load_now: K.Expr = K.Bin("gt", _r("it"), _c(0))
        if again is not None:
            load_now = K.Bin("or", load_now, again)
        loads: list[K.Stmt] = [
            *(K.Let(f"blk{u}", _q4_k_block(k, un, wide, _r("it"), u)) for u in range(un)),
            K.If(load_now, (*later, *(K.Assign(nm, _r(f"{nm}_n")) for nm in names))),
        ]
    else:
        loads = _q4_k_weight_loads(weights, k, un, wide, _r("it"), _r("j"), bufs=bufs, landed=landed)
    body: list[K.Stmt] = []
    for u in range(un):
        for r in range(mr):  # x's row r: in workgroup memory, or row min(m0 + r, m - 1) of the quantized buffers
            xrow: K.Expr = K.Bin("min", _add(_r("m0"), r), _b("sub", _r("m"), 1)) if xglobal else _c(r)
            row0 = _add(_mul(xrow, k // 4), _mul(_r(f"blk{u}"), 64))
            # the lane's words of sub-blocks 2c (low nibbles) and 2c + 1 (high): in global memory in
            # order; in workgroup memory as _quantize_x_q8 placed them
            if xglobal:
                lo_at = [_add(row0, _mul(_r("c"), 16), 0 if wide else _mul(_r("hh"), 4), 4 * h) for h in range(qw // 4)]
                hi_off = 8
            elif wide:
                par = _mul(_b("and", _r(f"blk{u}"), 1), 16)
                lo_at = [_add(row0, _b("xor", _c(16 * h), par), _mul(_r("c"), 4)) for h in range(2)]
                hi_off = 32
            else:
                lo_at = [_add(row0, _mul(_r("c"), 8), _mul(_r("hh"), 4))]
                hi_off = 32
            for t, arr in (("x", "xq"), ("y", "xr")):
                for h, at in enumerate(lo_at):
                    body += [
                        K.VecLoad(tuple(f"{t}l{u}_{r}_{4 * h + i}" for i in range(4)), arr, at, I32),
                        K.VecLoad(tuple(f"{t}h{u}_{r}_{4 * h + i}" for i in range(4)), arr, _add(at, hi_off), I32),
                    ]
            sb = _add(_mul(xrow, nb32), _mul(_r(f"blk{u}"), 8), _mul(_r("c"), 2))  # (d, sum) of sub-blocks 2c, 2c + 1
            body.append(K.VecLoad((f"dl{u}_{r}", f"sl{u}_{r}", f"dh{u}_{r}", f"sh{u}_{r}"), "xds", _mul(sb, 2), F32))
        for p in weights:
            body += q4_k_lane_scales(p, u)
            for r in range(mr):
                il: K.Expr = _c(0)
                ih: K.Expr = _c(0)
                jl: K.Expr = _c(0)
                jh: K.Expr = _c(0)
                for i in range(qw):
                    q = _r(f"{p}q{u}_{i}")
                    lo, hi = _b("and", q, mask), _b("and", _b("shr", q, 4), mask)
                    il = K.Dot4I8(lo, _r(f"xl{u}_{r}_{i}"), il)
                    ih = K.Dot4I8(hi, _r(f"xh{u}_{r}_{i}"), ih)
                    jl = K.Dot4I8(lo, _r(f"yl{u}_{r}_{i}"), jl)
                    jh = K.Dot4I8(hi, _r(f"yh{u}_{r}_{i}"), jh)

                def both(i1: K.Expr, i2: K.Expr) -> K.Expr:  # q1 . n + (q2 . n) / Q8_SPLIT
                    return K.Bin("add", K.Cast(i1, F32), K.Bin("mul", K.Cast(i2, F32), _f(1.0 / Q8_SPLIT)))

                dots = K.Bin(
                    "add",
                    K.Bin("mul", _r(f"{p}scl{u}", F32), K.Bin("mul", _r(f"dl{u}_{r}", F32), both(il, jl))),
                    K.Bin("mul", _r(f"{p}sch{u}", F32), K.Bin("mul", _r(f"dh{u}_{r}", F32), both(ih, jh))),
                )
                mins = K.Bin("add", K.Bin("mul", _r(f"{p}mnl{u}", F32), _r(f"sl{u}_{r}", F32)), K.Bin("mul", _r(f"{p}mnh{u}", F32), _r(f"sh{u}_{r}", F32)))
                if not wide:
                    mins = K.Bin("mul", _f(0.5), mins)  # the two lanes of a sub-block pair each take half its sums' share
                term: K.Expr = K.Bin("sub", dots, mins)
                if partial:  # the block it read again adds nothing
                    term = K.Select(K.Bin("lt", _q4_k_block(k, un, wide, _r("it"), u, clamp=False), _c(nb)), term, _f(0.0))
                body.append(K.Assign(f"{p}acc{r}", K.Bin("add", _r(f"{p}acc{r}", F32), term)))
    return loads + body + tail


@lru_cache(maxsize=None)
def gemv_warp(
    qtype: str,
    k: int,
    mr: int,
    warps: int | None = None,
    glu: bool = False,
    parts: tuple[int, ...] = (),
    unroll: int | None = None,
    shared_sums: bool = False,
    xglobal: bool = False,
    per_warp: int = 1,
    wide: bool | None = None,
    prefetch: bool = False,
    staged: bool = False,
    early: bool = False,
    q8: bool = False,
    ahead: bool = False,
    min_groups: int = 0,
    pipelined: bool = False,
    norm_next: bool = False,
    unit_offset: bool = False,
    copied: int = 0,
    rms_in: int = 0,
) -> K.Kernel:
    """y[m, j] = sum_k x[m, k] * w[j, k] for up to ``mr`` rows of x per workgroup; grid
    (ceil(n / warps), ceil(m / mr)); ``warps`` is 8, or ``Q4_K_WARPS`` for Q4_K (whose workgroups
    quantize x first). Rows past ``m`` read row ``m - 1`` and are not stored. With ``xglobal`` (Q4_K) x comes already quantized, by
    ``quantize_q8x2``, in buffers ``xq``, ``xr`` and ``xds`` instead of ``x``: no workgroup memory, no
    barrier (but ``copied``'s), any number of warps a workgroup. With ``staged`` (Q4_K) x comes quantized in those
    buffers as ``xq_in``, ``xr_in`` and ``xds_in``, and the workgroup copies its rows into
    workgroup memory (``_stage_x_q8``) instead of quantizing them. With ``shared_sums`` (bf16, targets without subgroup operations:
    SPIR-V here) the 32 lanes of a warp finish their sums through workgroup memory, every thread
    reaching the barriers (a warp past ``n`` computes row ``n - 1`` and stores nothing).
    With ``glu``: two weights ``wg`` and ``wu`` against the same x, and y = silu(x wg^T) * (x wu^T)
    (a gated MLP's first half in one pass over both weights). With ``parts`` (feature counts):
    several products of the same x in one launch, weights ``w0``, ``w1``, ... into ``y0``, ``y1``,
    ... (q, k and v, say); n is then their total. ``per_warp``: features a warp computes one after
    the other (grid (ceil(n / (warps per_warp)), ...)): fewer workgroups, so a Q4_K workgroup's
    quantization of x serves more features. ``wide`` (Q4_K): a lane takes 32 quant bytes of a
    block (all of a sub-block pair's), four lanes a block, so its sub-blocks' scales are decoded once
    for twice the bytes and the whole of a pair's sums is one lane's; else 16 (eight lanes a block).
    By default wide for one row of x (more rows' x words would not fit the registers).
    ``unroll`` (Q4_K): blocks a lane loads before it sums them (default 1 wide, else 2: eight blocks
    a warp a step either way). With ``prefetch`` each warp's first lane asks for its weight rows whole
    (``Prefetch``, into the L2) first: they stream in while x is quantized, and the loads after hit
    the L2 instead of waiting on the memory one step at a time. (The kernel waits for the launch
    before first: asked for earlier, they make the step slower. With x ``staged`` the prefetch has no
    quantization to overlap and slows the kernel.) With
    ``early`` (Q4_K, one product or a gated pair, a feature a warp) each lane loads its first step's
    weight words before the wait for the launch before (``AwaitPrior``: no launch writes weights),
    so they arrive while that launch finishes and x is read. (Not planned: the waiting workgroups'
    weight traffic delays the small launch before them, which is on the path.)
    With ``ahead`` (Q4_K) each lane loads its first feature's first step right after that wait,
    before x is staged or quantized: the weights' trip to memory overlaps x's to the L2 and the
    barrier after it (any number of products or features a warp). (Not planned: the gated MLP's
    then needs too many registers for two workgroups an SM.)
    With ``pipelined`` (Q4_K) each step asks for the next step's weight words before it sums its own
    (twice the weight registers). ``min_groups``: workgroups an SM should hold at once (registers
    capped for them where the target can: ``Kernel.min_groups``).
    With ``copied`` (Q4_K, wide lanes summing by subgroups, whole steps) each warp copies the blocks
    of its first feature's first ``copied`` steps into workgroup memory as they lie (``CopyAsync``:
    16 bytes a lane a copy, no registers) before the wait for the launch before, and its lanes read
    them from there after a barrier: the weights stream in while that launch drains, where
    ``early`` kept them in registers. The array holds 1,152 x ``unroll`` bytes a warp a step a
    weight. (Not planned: it gains nothing in the step. The warp copies the blocks whole because
    each lane copying only its own words, 16 bytes at a 32-byte stride, fetches each 32-byte sector
    twice past the L1.)
    With ``norm_next`` (with ``q8``, one product: the RMSNorm after the product folded into it and
    into the products after): y = ``res`` + x w^T (the residual add), what is quantized into ``yq``,
    ``yr``, ``yds`` is y * ``nw`` (``unit_offset``: * (1 + ``nw``)), the norm's weights applied but
    not its scale, and each workgroup's sum of y^2 over its 32 features goes to ``ss[m0, group]``
    (the row's ``n / 32`` partial sums of squares). With ``rms_in`` (one row of x, staged) x is
    such an output and ``ss`` holds its row's ``rms_in`` partial sums: each warp adds them in one
    order, and x's block scales and sums are staged times rsqrt(sum / K + ``eps``), so the sums come
    out scaled (for ``glu``, before silu) and no register holds the scale across them: the norm's
    own launch, and its place on the step's path, saved (q8's int8 terms, d and block sums are
    scale-free: x's quantization is the norm's output's, up to rounding). (A backend's plan
    pass plans both: poot-ptx's norm fold.)
    With ``q8`` (one row of x, one product or a gated pair, ``warps * per_warp`` = 32: a workgroup's
    features are one block of 32 consecutive values of y; n a multiple of 32) y is also written
    quantized for the dp4a GEMVs that read it (``yq``, ``yr``, ``yds``, laid out as ``quantize_q8x2``
    writes its ``xq``, ``xr``, ``xds``; x's own names are the workgroup's arrays): the workgroup's sums
    meet in workgroup memory and its first warp quantizes the block."""
    if qtype not in GEMV_TYPES:
        raise ValueError(f"gemv_warp: no schedule for {qtype} (have {GEMV_TYPES})")
    if shared_sums and (qtype != "bf16" or parts):
        raise ValueError("gemv_warp: sums through workgroup memory are built for bf16 weights and one product (or a gated pair)")
    if per_warp < 1:
        raise ValueError(f"gemv_warp: per_warp must be positive, got {per_warp}")
    if k % 256:
        raise ValueError(f"gemv_warp {qtype} needs K a multiple of 256, got {k}")
    warps = warps or (Q4_K_WARPS if qtype == "q4_k" else 8)
    threads = 32 * warps
    body: list[K.Stmt] = [
        K.Let("lane", _b("rem", K.Builtin("thread_id", 0), 32)),
        K.Let("jg", _add(_mul(K.Builtin("group_id", 0), warps), _b("div", K.Builtin("thread_id", 0), 32))),
        K.Let("m0", _mul(K.Builtin("group_id", 1), mr)),
    ]
    shared: tuple[K.Shared, ...] = ()
    if (xglobal or staged) and qtype != "q4_k":
        raise ValueError("gemv_warp: x comes quantized for Q4_K weights only")
    if xglobal and staged:
        raise ValueError("gemv_warp: x quantized once is read from global memory (xglobal) or staged in workgroup memory (staged), not both")
    wide = mr == 1 if wide is None else wide
    unroll = unroll or (1 if wide else 2)
    if early and (qtype != "q4_k" or parts or per_warp != 1 or shared_sums):
        raise ValueError("gemv_warp: the first step's weights are loaded early for Q4_K, one product or a gated pair, a feature a warp")
    if pipelined and (qtype != "q4_k" or early or ahead):
        raise ValueError("gemv_warp: pipelined steps are built for Q4_K, and not with the first step loaded early or ahead")
    if ahead and (qtype != "q4_k" or shared_sums or early):
        raise ValueError("gemv_warp: the first step's weights are loaded ahead of x for Q4_K, summing by subgroups, and not also early")
    if q8 and (mr != 1 or parts or shared_sums or warps * per_warp != 32):
        raise ValueError("gemv_warp: y quantized by its workgroup needs one row of x, one product or a gated pair, and warps x per_warp = 32")
    steps = -(-(k // 256) // ((8 if wide else 4) * unroll))
    if copied and (qtype != "q4_k" or not wide or shared_sums or early or ahead or pipelined or not 0 < copied * 8 * unroll <= k // 256):
        raise ValueError(
            f"gemv_warp: weights copied ahead are built for Q4_K, wide lanes summing by subgroups, not with early, ahead or "
            f"pipelined loads, for whole steps ({k // 256 // (8 * unroll)} here); got {copied}"
        )
    if qtype == "q4_k":
        body += _q4_k_lane(wide)
    lay = (2 if glu else 1, unroll, copied)  # ``wl``'s layout (_landed_word)
    if copied:  # the first feature's first steps into ``wl``, then the wait
        first = _mul(_r("jg"), per_warp)
        if parts:
            off = 0
            for i, size in enumerate(parts):
                inside = K.Bin("and", K.Bin("ge", first, _c(off)), K.Bin("lt", first, _c(off + size)))
                body.append(K.If(inside, tuple(_q4_k_weight_copies([f"w{i}"], k, unroll, _b("sub", first, off), lay))))
                off += size
        else:
            body += _q4_k_weight_copies(["wg", "wu"] if glu else ["w"], k, unroll, K.Bin("min", first, _b("sub", _r("n"), 1)), lay)
        body += [K.CopyAsyncSync("commit"), K.AwaitPrior()]
    if early:
        ws = ["wg", "wu"] if glu else ["w"]
        body += [
            K.Let("j0", K.Bin("min", _r("jg"), _b("sub", _r("n"), 1))),
            *_q4_k_weight_loads(ws, k, unroll, wide, _c(0), _r("j0"), "_e"),
            *(K.Let(nm, _r(f"{nm}_e")) for nm in _q4_k_weight_names(ws, unroll, wide)),
            K.AwaitPrior(),
        ]
    if ahead:  # the first feature's step 0 into the locals the loop's first step reads (``w`` for every part)
        first = _mul(_r("jg"), per_warp)
        body.append(K.AwaitPrior())
        if parts:
            names = _q4_k_weight_names(["w"], unroll, wide)
            body += [K.Let(nm, _c(0)) for nm in names]
            off = 0
            for i, size in enumerate(parts):
                inside = K.Bin("and", K.Bin("ge", first, _c(off)), K.Bin("lt", first, _c(off + size)))
                body.append(
                    K.If(
                        inside,
                        (
                            *_q4_k_weight_loads(["w"], k, unroll, wide, _c(0), _b("sub", first, off), "_e", {"w": f"w{i}"}),
                            *(K.Assign(nm, _r(f"{nm}_e")) for nm in names),
                        ),
                    )
                )
                off += size
        else:
            ws = ["wg", "wu"] if glu else ["w"]
            body += [
                K.Let("j0", K.Bin("min", first, _b("sub", _r("n"), 1))),
                *_q4_k_weight_loads(ws, k, unroll, wide, _c(0), _r("j0"), "_e"),
                *(K.Let(nm, _r(f"{nm}_e")) for nm in _q4_k_weight_names(ws, unroll, wide)),
            ]
    if norm_next and (qtype != "q4_k" or mr != 1 or not q8 or parts or glu):
        raise ValueError("gemv_warp: the norm after the product (norm_next) is folded into Q4_K products of one row of x, one product, with q8")
    if rms_in and (qtype != "q4_k" or mr != 1 or not staged or shared_sums):
        raise ValueError("gemv_warp: x's norm scale from partial sums (rms_in) is built for Q4_K, one row of x quantized once and staged, summing by subgroups")
    asks: list[K.Stmt] = []  # the partial sums asked for first (before x's loads), added after them
    scale: list[K.Stmt] = []
    if rms_in:  # every warp adds the row's partial sums of squares in the same order
        total: K.Expr = _f(0.0)
        for u in range(-(-rms_in // 32)):
            idx = _add(_r("lane"), 32 * u)
            asks.append(K.Let(f"rp{u}", K.Load("ss", _add(_mul(_r("m0"), rms_in), K.Bin("min", idx, _c(rms_in - 1))), F32)))
            total = K.Bin("add", total, _r(f"rp{u}", F32) if 32 * (u + 1) <= rms_in else K.Select(K.Bin("lt", idx, _c(rms_in)), _r(f"rp{u}", F32), _f(0.0)))
        scale.append(K.Let("rscale", K.Un("rsqrt", K.Bin("add", K.Bin("div", K.SubgroupReduce("add", total), _f(float(k))), _r("eps", F32)))))
    if qtype == "q4_k" and not xglobal:
        # (``rms_in``: the partial sums asked for first, added between x's loads and stores, and each
        # block's d and sum stored scaled: no register holds the scale across the sums)
        staged_x = _stage_x_q8(k, mr, threads, wide, (scale, _r("rscale", F32)) if rms_in else None)
        body += [*asks, *staged_x] if staged else _quantize_x_q8(k, mr, threads, wide)
        shared = (K.Shared("xq", I32, mr * k // 4), K.Shared("xr", I32, mr * k // 4), K.Shared("xds", F32, mr * k // 16))
    else:
        for r in range(mr):
            body.append(K.Let(f"xr{r}", _mul(K.Bin("min", _add(_r("m0"), r), _b("sub", _r("m"), 1)), k)))
    if copied:  # every thread's copies in, then a barrier shows them to all (x's own last barrier, moved after the wait; a new one for xglobal)
        last = body.pop() if isinstance(body[-1], K.Barrier) else K.Barrier()
        body += [K.CopyAsyncSync("wait"), last]
        shared = (*shared, K.Shared("wl", I32, warps * copied * lay[0] * 8 * unroll * 36))

    def product(weights: list[str], y: str, width: K.Expr, bufs: dict[str, str] | None = None) -> list[K.Stmt]:
        """Rows j of this product (``j`` declared by the caller) into ``y`` of ``width`` features
        (``bufs``: weight buffers named otherwise than their locals)."""
        out: list[K.Stmt] = [K.Let(f"{wb}acc{r}", _f(0.0)) for r in range(mr) for wb in weights]
        if qtype == "bf16":
            inner, un = _bf16_rows(weights, k, mr)
            out.append(K.For("it", _c(0), _c(k // (256 * un)), tuple(inner)))
        else:
            again = K.Bin("gt", _r("fi"), _c(0)) if ahead and per_warp > 1 else None
            if copied:  # the first steps from ``wl`` (a warp's first feature's), the rest from the buffers
                there = K.For("it", _c(0), _c(copied), tuple(_q4_k_rows(weights, k, mr, unroll, xglobal, wide, bufs=bufs, landed=lay)))
                if per_warp > 1:
                    here = K.For("it", _c(0), _c(copied), tuple(_q4_k_rows(weights, k, mr, unroll, xglobal, wide, bufs=bufs)))
                    out.append(K.If(K.Bin("eq", _r("fi"), _c(0)), (there,), (here,)))
                else:
                    out.append(there)
                if steps > copied:
                    out.append(K.For("it", _c(copied), _c(steps), tuple(_q4_k_rows(weights, k, mr, unroll, xglobal, wide, bufs=bufs))))
            elif pipelined:  # step 0 into the locals; the next step's words into ``_n`` locals, step by step
                names = _q4_k_weight_names(weights, unroll, wide)
                out += [
                    *_q4_k_weight_loads(weights, k, unroll, wide, _c(0), _r("j"), "_p", bufs),
                    *(K.Let(nm, _r(f"{nm}_p")) for nm in names),
                    *(K.Let(f"{nm}_n", _c(0)) for nm in names),
                ]
            if not copied:
                out.append(
                    K.For(
                        "it", _c(0), _c(steps), tuple(_q4_k_rows(weights, k, mr, unroll, xglobal, wide, early or ahead, bufs, again, steps if pipelined else 0))
                    )
                )
        sums = [(r, wb) for r in range(mr) for wb in weights]
        if shared_sums:  # lane i of a warp keeps slot i; halving strides leave the warp's sum in lane 0
            tid = K.Builtin("thread_id", 0)
            for i, (r, wb) in enumerate(sums):
                out.append(K.Store("sums", _add(i * threads, tid), _r(f"{wb}acc{r}", F32)))
            out.append(K.Barrier())
            for step in (16, 8, 4, 2, 1):
                adds = tuple(
                    K.Store(
                        "sums",
                        _add(i * threads, tid),
                        K.Bin("add", K.Load("sums", _add(i * threads, tid), F32), K.Load("sums", _add(i * threads, tid, step), F32)),
                    )
                    for i in range(len(sums))
                )
                out += [K.If(K.Bin("lt", _r("lane"), _c(step)), adds), K.Barrier()]
            for i, (r, wb) in enumerate(sums):
                out.append(K.Let(f"{wb}s{r}", K.Load("sums", _add(i * threads, tid), F32)))
        else:
            for r, wb in sums:
                out.append(K.Let(f"{wb}s{r}", K.SubgroupReduce("add", _r(f"{wb}acc{r}", F32))))
        for r in range(mr):
            val = _silu_mul(_r(f"wgs{r}", F32), _r(f"wus{r}", F32)) if glu else _r(f"{weights[0]}s{r}", F32)
            cond = K.Bin("and", K.Bin("eq", _r("lane"), _c(0)), K.Bin("lt", _add(_r("m0"), r), _r("m")))
            if shared_sums:
                cond = K.Bin("and", cond, K.Bin("lt", _r("jf"), _r("n")))
            if norm_next:  # the residual add
                val = K.Bin("add", K.Load("res", _add(_mul(_add(_r("m0"), r), width), _r("j")), F32), val)
            if q8:  # the workgroup's block of y meets in workgroup memory
                out += [
                    K.Let("yv", val),
                    K.If(K.Bin("eq", _r("lane"), _c(0)), (K.Store("yb", _b("sub", _r("j"), _mul(K.Builtin("group_id", 0), 32)), _r("yv", F32)),)),
                ]
                val = _r("yv", F32)
            out.append(K.If(cond, (K.Store(y, _add(_mul(_add(_r("m0"), r), width), _r("j")), val),)))
        return out

    feature: list[K.Stmt] = []  # one feature jf of this warp (jg its first of per_warp)
    if parts:
        off = 0
        for i, size in enumerate(parts):  # one feature lies in one part: the branch is uniform
            inside = K.Bin("and", K.Bin("ge", _r("jf"), _c(off)), K.Bin("lt", _r("jf"), _c(off + size)))
            mine = product(["w"], f"y{i}", _c(size), {"w": f"w{i}"}) if ahead else product([f"w{i}"], f"y{i}", _c(size))
            feature.append(K.If(inside, (K.Let("j", _b("sub", _r("jf"), off)), *mine)))
            off += size
        weights_p: list[K.Param] = [K.Buffer(f"w{i}", I32) for i in range(len(parts))]
        outs: list[K.Param] = [K.Buffer(f"y{i}", F32, readonly=False) for i in range(len(parts))]
    else:
        weights = ["wg", "wu"] if glu else ["w"]
        if shared_sums:  # every thread reaches the barriers: warps past n compute row n - 1
            feature += [K.Let("j", K.Bin("min", _r("jf"), _b("sub", _r("n"), 1))), *product(weights, "y", _r("n"))]
            shared = (K.Shared("sums", F32, threads * mr * len(weights)),)
        else:
            feature.append(K.If(K.Bin("lt", _r("jf"), _r("n")), (K.Let("j", _r("jf")), *product(weights, "y", _r("n")))))
        weights_p = [K.Buffer(wb, I32) for wb in weights]
        outs = [K.Buffer("y", F32, readonly=False)]
    if prefetch:
        row_words = k // 2 if qtype == "bf16" else k // 256 * 36
        asks: list[K.Stmt] = []
        for fi in range(per_warp):
            jf = _add(_mul(_r("jg"), per_warp), fi)
            if parts:
                off = 0
                for i, size in enumerate(parts):
                    inside = K.Bin("and", K.Bin("ge", jf, _c(off)), K.Bin("lt", jf, _c(off + size)))
                    asks.append(K.If(inside, (K.Prefetch(f"w{i}", _mul(_b("sub", jf, off), row_words), _c(row_words * 4)),)))
                    off += size
            else:
                asks.append(K.If(K.Bin("lt", jf, _r("n")), tuple(K.Prefetch(wb, _mul(jf, row_words), _c(row_words * 4)) for wb in weights)))
        body = [*body[:3], K.If(K.Bin("eq", _r("lane"), _c(0)), tuple(asks)), *body[3:]]
    if per_warp == 1:
        body += [K.Let("jf", _r("jg")), *feature]
    else:
        body.append(K.For("fi", _c(0), _c(per_warp), (K.Let("jf", _add(_mul(_r("jg"), per_warp), _r("fi"))), *feature)))
    if q8:  # the first warp quantizes the workgroup's block (feature j of row m0: word (m0 n + j) / 4)
        shared = (*shared, K.Shared("yb", F32, 32))
        at = _add(_mul(_r("m0"), _r("n")), _mul(K.Builtin("group_id", 0), 32), _r("lane"))
        v: K.Expr = K.Load("yb", _r("lane"), F32)
        fold: list[K.Stmt] = []
        if norm_next:  # the workgroup's sum of y^2, and y * nw quantized
            g: K.Expr = K.Load("nw", _add(_mul(K.Builtin("group_id", 0), 32), _r("lane")), F32)
            fold = [
                K.Let("hv", v),
                K.Let("hss", K.SubgroupReduce("add", K.Bin("mul", _r("hv", F32), _r("hv", F32)))),
                K.If(
                    K.Bin("eq", _r("lane"), _c(0)), (K.Store("ss", _add(_mul(_r("m0"), K.Builtin("num_groups", 0)), K.Builtin("group_id", 0)), _r("hss", F32)),)
                ),
            ]
            v = K.Bin("mul", _r("hv", F32), K.Bin("add", g, _f(1.0)) if unit_offset else g)
        body += [
            K.Barrier(),
            K.If(K.Bin("lt", K.Builtin("thread_id", 0), _c(32)), (*fold, *q8_quantize_lane(v, _b("div", at, 4), _r("lane"), ("yq", "yr", "yds")))),
        ]
    xs: tuple[K.Param, ...] = (K.Buffer("x", F32),)
    if xglobal or staged:
        sfx = "_in" if staged else ""
        xs = (K.Buffer(f"xq{sfx}", I32), K.Buffer(f"xr{sfx}", I32), K.Buffer(f"xds{sfx}", F32))
    if q8:
        outs = [*outs, K.Buffer("yq", I32, readonly=False), K.Buffer("yr", I32, readonly=False), K.Buffer("yds", F32, readonly=False)]
    if norm_next:
        outs = [*outs, K.Buffer("res", F32), K.Buffer("nw", F32), K.Buffer("ss", F32, readonly=False)]
    if rms_in:
        xs = (*xs, K.Buffer("ss", F32))
    params = (*xs, *weights_p, *outs, K.ScalarParam("m", I32), K.ScalarParam("n", I32), *((K.ScalarParam("eps", F32),) if rms_in else ()))
    tag = "glu_" if glu else f"{len(parts)}x_" if parts else ""
    name = f"gemv_warp_{tag}{qtype}_K{k}_MR{mr}" + ("_" + "_".join(map(str, parts)) if parts else "")
    if qtype == "q4_k" and (warps, unroll) != (Q4_K_WARPS, 1 if wide else 2):
        name += f"_W{warps}_U{unroll}"
    if per_warp != 1:
        name += f"_F{per_warp}"
    if qtype == "q4_k" and wide != (mr == 1):
        name += "_wide" if wide else "_narrow"
    if shared_sums:
        name += "_shared_sums"
    if prefetch:
        name += "_pf"
    if xglobal:
        name += "_xq"
    if staged:
        name += "_xs"
    if early:
        name += "_early"
    if ahead:
        name += "_ahead"
    if q8:
        name += "_Q8"
    if pipelined:
        name += "_pipe"
    if min_groups:
        name += f"_G{min_groups}"
    if copied:
        name += f"_C{copied}"
    if norm_next:
        name += "_norm" + ("_UNIT_OFFSET" if unit_offset else "")
    if rms_in:
        name += f"_rms{rms_in}"
    kern = K.Kernel(name, params, tuple(body), (threads, 1, 1), shared, min_groups=min_groups)
    verify_kernel(kern)
    return kern
