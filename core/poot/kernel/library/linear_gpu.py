"""Matrix products for GPUs, built as Kernel IR: schedules that use the chip.

- ``gemv_warp``: decode. One warp per output feature reads its weight row with 16-byte loads
  (eight bf16 values, or a quarter of a Q4_K block's quants per lane), so every byte of the
  weights is read once per step at close to the memory's bandwidth; ``MR`` rows of x share each
  load. Sums are finished with a subgroup reduction. The Q4_K one first quantizes the workgroup's
  rows of x in workgroup memory to two int8 terms per value (per 32 values a scale, as llama.cpp's
  Q8_1, and a second term for the remainder: about 15 bits of each value) and sums quants by
  ``dp4a``: dequantizing nibbles to floats costs more instructions than the chip can issue at full
  memory bandwidth.
- ``gemm_mma``: prefill and batched decode on tensor cores (``mma.sync`` m16n8k16 bf16). Tiles of x
  and of the weights are staged through workgroup memory (rows padded to avoid bank conflicts);
  each warp keeps its accumulators in registers for the whole K loop. x is split into two bf16
  terms (hi + lo, ``SPLIT``), so the product keeps about 16 bits of each activation's mantissa
  against bf16 weights (which are exact) instead of rounding activations to bf16.

Weight rows are bound as i32 words (pairs of bf16 values; the words of Q4_K blocks).
"""

from __future__ import annotations

from functools import lru_cache

from ...graph import dtypes as dt
from .. import ir as K
from ..verify import verify_kernel

__all__ = ["gemv_warp", "gemm_warp", "gemm_mma", "quantize_q8x2", "split_bf16x2", "sum_parts", "SPLIT_THREADS", "GEMV_TYPES", "MMA_PAD", "Q4_K_WARPS", "Q8_THREADS", "q8_shared_words"]

GEMV_TYPES = ("bf16", "q4_k")
MMA_PAD = 4  # words of padding per staged row: eight rows of a fragment load hit 32 different banks
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


def _pair(lo: K.Expr, hi: K.Expr) -> K.Expr:
    return _b("or", lo, _b("shl", hi, 16))


def _mma_lanes() -> list[K.Stmt]:
    """A thread's place in an mma.sync fragment: ``tid``, ``lane``, ``warp``, and the lane's group
    ``g`` (lane / 4: its rows) and ``t4`` (lane % 4: its pair of columns)."""
    return [K.Let("tid", K.Builtin("thread_id", 0)), K.Let("lane", _b("rem", _r("tid"), 32)), K.Let("warp", _b("div", _r("tid"), 32)),
            K.Let("g", _b("div", _r("lane"), 4)), K.Let("t4", _b("rem", _r("lane"), 4))]


# -- decode: one warp per output feature ------------------------------------------------------------


def _silu_mul(g: K.Expr, u: K.Expr) -> K.Expr:
    """silu(g) * u with the operations of the fused elementwise kernel: (g * (1 / (1 + exp(-g)))) * u."""
    one = _f(1.0)
    return K.Bin("mul", K.Bin("mul", g, K.Bin("div", one, K.Bin("add", one, K.Un("exp", K.Un("neg", g))))), u)


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
            inner += [K.VecLoad(tuple(f"x{u}_{r}_{i}" for i in range(4)), "x", xi, F32),
                      K.VecLoad(tuple(f"x{u}_{r}_{i}" for i in range(4, 8)), "x", _add(xi, 4), F32)]
            for wb in weights:
                acc: K.Expr = _r(f"{wb}acc{r}", F32)
                for q in range(4):
                    acc = _fma(acc, _r(f"x{u}_{r}_{2 * q}", F32), _lo16(_r(f"{wb}{u}_{q}")))
                    acc = _fma(acc, _r(f"x{u}_{r}_{2 * q + 1}", F32), _hi16(_r(f"{wb}{u}_{q}")))
                inner.append(K.Assign(f"{wb}acc{r}", acc))
    return inner, un


Q8_SPLIT = 254  # the second int8 term's scale is the first's / Q8_SPLIT (its values are within half a step)
Q4_K_WARPS = 16  # a workgroup's quantized x serves this many features (512 threads: up to 128 registers each)


def q8_shared_words(k: int, mr: int) -> int:
    """Workgroup memory (4-byte words) a Q4_K warp GEMV needs for ``mr`` rows of x as two int8 terms."""
    return mr * (k // 2 + k // 16)


def _quantize_x_q8(k: int, mr: int, threads: int) -> list[K.Stmt]:
    """The workgroup's ``mr`` rows of x quantized into workgroup memory as two int8 terms per value,
    x ~ d (q1 + q2 / Q8_SPLIT): per 32 values d = max|x| / 127 and q1 = rint(x / d) (four a word in
    ``xq``) as llama.cpp's Q8_1, then the remainder's q2 = rint((x - d q1) Q8_SPLIT / d) (``xr``),
    which keeps about 15 bits of each value where one int8 keeps 7; the exact f32 sum of the 32
    values sits beside d (``xds``: d, sum). A thread a word (four values), the eight threads of a
    block exchanging max and sum by shuffles: short, so the GEMV starts soon. Rounding by ``rint``,
    not by adding and subtracting 1.5 * 2**23: SPIR-V lets a driver fold (t + c) - c to t (Mesa's
    does: every q2 came out zero). Ends with a barrier. ``mr * k / 4`` is a multiple of 32 (k of
    256): whole warps take part in each step."""
    words = k // 4
    row = K.Bin("min", _add(_r("m0"), _b("div", _r("qi"), words)), _b("sub", _r("m"), 1))
    inner = _q8_word(_add(_mul(row, k), _mul(_b("rem", _r("qi"), words), 4)))
    return [K.For("qi", K.Builtin("thread_id", 0), _c(mr * words), tuple(inner), step=threads), K.Barrier()]


def _q8_word(at: K.Expr) -> list[K.Stmt]:
    """Word ``qi`` of x as two int8 terms (``_quantize_x_q8``): its four values loaded from x at ``at``,
    its block's max and sum shared by shuffles, stored at ``qi`` of ``xq``/``xr`` and, by the block's
    first thread, at ``2 (qi / 8)`` of ``xds``."""
    inner: list[K.Stmt] = [K.VecLoad(tuple(f"qv{j}" for j in range(4)), "x", at, F32)]
    v = [_r(f"qv{j}", F32) for j in range(4)]
    inner += [K.Let("qmax", K.Bin("max", K.Bin("max", K.Un("abs", v[0]), K.Un("abs", v[1])), K.Bin("max", K.Un("abs", v[2]), K.Un("abs", v[3])))),
              K.Let("qsum", K.Bin("add", K.Bin("add", v[0], v[1]), K.Bin("add", v[2], v[3])))]
    for lane in (1, 2, 4):  # the block's eight threads are eight consecutive lanes
        inner += [K.Assign("qmax", K.Bin("max", _r("qmax", F32), K.SubgroupShuffle(_r("qmax", F32), _c(lane), xor=True))),
                  K.Assign("qsum", K.Bin("add", _r("qsum", F32), K.SubgroupShuffle(_r("qsum", F32), _c(lane), xor=True)))]
    inner += [K.Let("qinv", K.Select(K.Bin("gt", _r("qmax", F32), _f(0.0)), K.Bin("div", _f(127.0), _r("qmax", F32)), _f(0.0))),
              K.Let("qinv2", K.Bin("mul", _r("qinv", F32), _f(float(Q8_SPLIT)))),
              K.Let("qd", K.Bin("div", _r("qmax", F32), _f(127.0)))]
    b1, b2 = [], []
    for j in range(4):  # q1 = rint(x / d); the remainder x - d q1, and its q2
        inner.append(K.Let(f"qt{j}", K.Un("rint", K.Bin("mul", v[j], _r("qinv", F32)))))
        rem = K.Bin("sub", v[j], K.Bin("mul", _r(f"qt{j}", F32), _r("qd", F32)))
        b1.append(_b("and", K.Cast(_r(f"qt{j}", F32), I32), 255))
        b2.append(_b("and", K.Cast(K.Un("rint", K.Bin("mul", rem, _r("qinv2", F32))), I32), 255))

    def word(b: list[K.Expr]) -> K.Expr:
        return _b("or", _b("or", b[0], _b("shl", b[1], 8)), _b("or", _b("shl", b[2], 16), _b("shl", b[3], 24)))

    inner += [K.Store("xq", _r("qi"), word(b1)), K.Store("xr", _r("qi"), word(b2)),
              K.If(K.Bin("eq", _b("rem", _r("qi"), 8), _c(0)),
                   (K.VecStore("xds", _b("div", _r("qi"), 4), (_r("qd", F32), _r("qsum", F32))),))]
    return inner


Q8_THREADS = 256


@lru_cache(maxsize=None)
def quantize_q8x2(k: int) -> K.Kernel:
    """x [m, k] as the Q4_K GEMV's two int8 terms (``_quantize_x_q8``), once for every GEMV that
    reads it, into buffers ``xq``, ``xr`` (m k / 4 words each) and ``xds`` (m k / 16 floats): a
    thread a word; grid (ceil(m k / 4 / Q8_THREADS),). K a multiple of 256, so warps are whole."""
    if k % 256:
        raise ValueError(f"quantize_q8x2 needs K a multiple of 256, got {k}")
    body: list[K.Stmt] = [K.Let("qi", _add(_mul(K.Builtin("group_id", 0), Q8_THREADS), K.Builtin("thread_id", 0))),
                          K.If(K.Bin("lt", _r("qi"), _mul(_r("m"), k // 4)), tuple(_q8_word(_mul(_r("qi"), 4))))]
    params = (K.Buffer("x", F32), K.Buffer("xq", I32, readonly=False), K.Buffer("xr", I32, readonly=False), K.Buffer("xds", F32, readonly=False),
              K.ScalarParam("m", I32))
    kern = K.Kernel(f"quantize_q8x2_K{k}", params, tuple(body), (Q8_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern


def _q4_k_rows(weights: list[str], k: int, mr: int, un: int = 2, xglobal: bool = False) -> list[K.Stmt]:
    """The loop body of a Q4_K warp GEMV step: 4 ``un`` blocks a step, eight lanes a block, each lane 16
    quant bytes (32 values, halves of two sub-blocks) of ``un`` blocks of each weight row, against x
    quantized to int8 in workgroup memory: the sums are dp4a's, scaled per sub-block."""
    nb, nb32 = k // 256, k // 32
    mask = _c(0x0F0F0F0F)
    out: list[K.Stmt] = [
        K.Let("l8", _b("rem", _r("lane"), 8)),
        K.Let("c", _b("div", _r("l8"), 2)),
        K.Let("h", _b("rem", _r("l8"), 2)),
    ]
    for u in range(un):
        blk = _add(_mul(_r("it"), 4 * un), _b("div", _r("lane"), 8), 4 * u)
        body: list[K.Stmt] = [K.Let(f"blk{u}", blk)]
        for p in weights:  # the weight loads first
            base = _add(_mul(_r("j"), nb * 36), _mul(_r(f"blk{u}"), 36))
            body += [K.Let(f"{p}base{u}", base),  # a block is 36 words: 16-byte aligned
                     K.VecLoad(tuple(f"{p}q{u}_{i}" for i in range(4)), p, _add(_r(f"{p}base{u}"), 4, _mul(_r("l8"), 4)), I32),
                     K.VecLoad((f"{p}dm{u}", f"{p}s0{u}", f"{p}s1{u}", f"{p}s2{u}"), p, _r(f"{p}base{u}"), I32)]
        for r in range(mr):  # x's row r: in workgroup memory, or row min(m0 + r, m - 1) of the quantized buffers
            xrow: K.Expr = K.Bin("min", _add(_r("m0"), r), _b("sub", _r("m"), 1)) if xglobal else _c(r)
            xw = _add(_mul(xrow, k // 4), _mul(_r(f"blk{u}"), 64), _mul(_r("c"), 16), _mul(_r("h"), 4))
            sb = _add(_mul(xrow, nb32), _mul(_r(f"blk{u}"), 8), _mul(_r("c"), 2))
            body += [K.VecLoad(tuple(f"xl{u}_{r}_{i}" for i in range(4)), "xq", xw, I32),
                     K.VecLoad(tuple(f"xh{u}_{r}_{i}" for i in range(4)), "xq", _add(xw, 8), I32),
                     K.VecLoad(tuple(f"yl{u}_{r}_{i}" for i in range(4)), "xr", xw, I32),
                     K.VecLoad(tuple(f"yh{u}_{r}_{i}" for i in range(4)), "xr", _add(xw, 8), I32),
                     K.VecLoad((f"dl{u}_{r}", f"sl{u}_{r}"), "xds", _mul(sb, 2), F32),
                     K.VecLoad((f"dh{u}_{r}", f"sh{u}_{r}"), "xds", _add(_mul(sb, 2), 2), F32)]
        for p in weights:
            body += [K.Let(f"{p}d{u}", K.HalfToF32(_b("and", _r(f"{p}dm{u}"), 0xFFFF))),
                     K.Let(f"{p}dmin{u}", K.HalfToF32(_b("and", _b("shr", _r(f"{p}dm{u}"), 16), 0xFFFF)))]

            def byte(i: K.Expr, p: str = p, u: int = u) -> K.Expr:  # scale byte i (0..11), i run-time
                word = K.Select(K.Bin("lt", i, _c(4)), _r(f"{p}s0{u}"), K.Select(K.Bin("lt", i, _c(8)), _r(f"{p}s1{u}"), _r(f"{p}s2{u}")))
                return _b("and", K.Bin("shr", word, _mul(_b("rem", i, 4), 8)), 255)

            for part, sub in (("l", _mul(_r("c"), 2)), ("h", _add(_mul(_r("c"), 2), 1))):
                # ggml's get_scale_min_k4 for sub-block ``sub``
                small = K.Bin("lt", sub, _c(4))
                sc = K.Select(small, _b("and", byte(sub), 63),
                              _b("or", _b("and", byte(_add(sub, 4)), 15), _b("shl", _b("shr", byte(_b("sub", sub, 4)), 6), 4)))
                mn = K.Select(small, _b("and", byte(_add(sub, 4)), 63),
                              _b("or", _b("shr", byte(_add(sub, 4)), 4), _b("shl", _b("shr", byte(sub), 6), 4)))
                body += [K.Let(f"{p}sc{part}{u}", K.Bin("mul", _r(f"{p}d{u}", F32), K.Cast(sc, F32))),
                         K.Let(f"{p}mn{part}{u}", K.Bin("mul", _r(f"{p}dmin{u}", F32), K.Cast(mn, F32)))]
            for r in range(mr):
                il: K.Expr = _c(0)
                ih: K.Expr = _c(0)
                jl: K.Expr = _c(0)
                jh: K.Expr = _c(0)
                for i in range(4):
                    q = _r(f"{p}q{u}_{i}")
                    lo, hi = _b("and", q, mask), _b("and", _b("shr", q, 4), mask)
                    il = K.Dot4I8(lo, _r(f"xl{u}_{r}_{i}"), il)
                    ih = K.Dot4I8(hi, _r(f"xh{u}_{r}_{i}"), ih)
                    jl = K.Dot4I8(lo, _r(f"yl{u}_{r}_{i}"), jl)
                    jh = K.Dot4I8(hi, _r(f"yh{u}_{r}_{i}"), jh)

                def both(i1: K.Expr, i2: K.Expr) -> K.Expr:  # q1 . n + (q2 . n) / Q8_SPLIT
                    return K.Bin("add", K.Cast(i1, F32), K.Bin("mul", K.Cast(i2, F32), _f(1.0 / Q8_SPLIT)))

                dots = K.Bin("add", K.Bin("mul", _r(f"{p}scl{u}", F32), K.Bin("mul", _r(f"dl{u}_{r}", F32), both(il, jl))),
                             K.Bin("mul", _r(f"{p}sch{u}", F32), K.Bin("mul", _r(f"dh{u}_{r}", F32), both(ih, jh))))
                mins = K.Bin("mul", _f(0.5), K.Bin("add", K.Bin("mul", _r(f"{p}mnl{u}", F32), _r(f"sl{u}_{r}", F32)),
                                                   K.Bin("mul", _r(f"{p}mnh{u}", F32), _r(f"sh{u}_{r}", F32))))
                body.append(K.Assign(f"{p}acc{r}", K.Bin("add", _r(f"{p}acc{r}", F32), K.Bin("sub", dots, mins))))
        if nb % (4 * un) == 0:
            out += body
        else:
            out.append(K.If(K.Bin("lt", blk, _c(nb)), tuple(body)))
    return out


@lru_cache(maxsize=None)
def gemv_warp(qtype: str, k: int, mr: int, warps: int | None = None, glu: bool = False, parts: tuple[int, ...] = (), unroll: int = 2,
              shared_sums: bool = False, xglobal: bool = False, per_warp: int = 1) -> K.Kernel:
    """y[m, j] = sum_k x[m, k] * w[j, k] for up to ``mr`` rows of x per workgroup; grid
    (ceil(n / warps), ceil(m / mr)); ``warps`` is 8, or ``Q4_K_WARPS`` for Q4_K (whose workgroups
    quantize x first). Rows past ``m`` read row ``m - 1`` and are not stored. ``unroll``: Q4_K blocks
    a lane loads before it sums them. With ``xglobal`` (Q4_K) x comes already quantized, by
    ``quantize_q8x2``, in buffers ``xq``, ``xr`` and ``xds`` instead of ``x``: no workgroup memory, no
    barrier, any number of warps a workgroup. With ``shared_sums`` (bf16, targets without subgroup operations:
    SPIR-V here) the 32 lanes of a warp finish their sums through workgroup memory, every thread
    reaching the barriers (a warp past ``n`` computes row ``n - 1`` and stores nothing).
    With ``glu``: two weights ``wg`` and ``wu`` against the same x, and y = silu(x wg^T) * (x wu^T)
    (a gated MLP's first half in one pass over both weights). With ``parts`` (feature counts):
    several products of the same x in one launch, weights ``w0``, ``w1``, ... into ``y0``, ``y1``,
    ... (q, k and v, say); n is then their total. ``per_warp``: features a warp computes one after
    the other (grid (ceil(n / (warps per_warp)), ...)): fewer workgroups, so a Q4_K workgroup's
    quantization of x serves more features."""
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
    if xglobal and qtype != "q4_k":
        raise ValueError("gemv_warp: x comes quantized for Q4_K weights only")
    if qtype == "q4_k" and not xglobal:
        body += _quantize_x_q8(k, mr, threads)
        shared = (K.Shared("xq", I32, mr * k // 4), K.Shared("xr", I32, mr * k // 4), K.Shared("xds", F32, mr * k // 16))
    else:
        for r in range(mr):
            body.append(K.Let(f"xr{r}", _mul(K.Bin("min", _add(_r("m0"), r), _b("sub", _r("m"), 1)), k)))

    def product(weights: list[str], y: str, width: K.Expr) -> list[K.Stmt]:
        """Rows j of this product (``j`` declared by the caller) into ``y`` of ``width`` features."""
        out: list[K.Stmt] = [K.Let(f"{wb}acc{r}", _f(0.0)) for r in range(mr) for wb in weights]
        if qtype == "bf16":
            inner, un = _bf16_rows(weights, k, mr)
            out.append(K.For("it", _c(0), _c(k // (256 * un)), tuple(inner)))
        else:
            out.append(K.For("it", _c(0), _c(-(-(k // 256) // (4 * unroll))), tuple(_q4_k_rows(weights, k, mr, unroll, xglobal))))
        sums = [(r, wb) for r in range(mr) for wb in weights]
        if shared_sums:  # lane i of a warp keeps slot i; halving strides leave the warp's sum in lane 0
            tid = K.Builtin("thread_id", 0)
            for i, (r, wb) in enumerate(sums):
                out.append(K.Store("sums", _add(i * threads, tid), _r(f"{wb}acc{r}", F32)))
            out.append(K.Barrier())
            for step in (16, 8, 4, 2, 1):
                adds = tuple(K.Store("sums", _add(i * threads, tid), K.Bin("add", K.Load("sums", _add(i * threads, tid), F32),
                                                                            K.Load("sums", _add(i * threads, tid, step), F32)))
                             for i in range(len(sums)))
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
            out.append(K.If(cond, (K.Store(y, _add(_mul(_add(_r("m0"), r), width), _r("j")), val),)))
        return out

    feature: list[K.Stmt] = []  # one feature jf of this warp (jg its first of per_warp)
    if parts:
        off = 0
        for i, size in enumerate(parts):  # one feature lies in one part: the branch is uniform
            inside = K.Bin("and", K.Bin("ge", _r("jf"), _c(off)), K.Bin("lt", _r("jf"), _c(off + size)))
            feature.append(K.If(inside, (K.Let("j", _b("sub", _r("jf"), off)), *product([f"w{i}"], f"y{i}", _c(size)))))
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
    if per_warp == 1:
        body += [K.Let("jf", _r("jg")), *feature]
    else:
        body.append(K.For("fi", _c(0), _c(per_warp), (K.Let("jf", _add(_mul(_r("jg"), per_warp), _r("fi"))), *feature)))
    xs: tuple[K.Param, ...] = (K.Buffer("xq", I32), K.Buffer("xr", I32), K.Buffer("xds", F32)) if xglobal else (K.Buffer("x", F32),)
    params = (*xs, *weights_p, *outs, K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    tag = "glu_" if glu else f"{len(parts)}x_" if parts else ""
    name = f"gemv_warp_{tag}{qtype}_K{k}_MR{mr}" + ("_" + "_".join(map(str, parts)) if parts else "")
    if qtype == "q4_k" and (warps, unroll) != (Q4_K_WARPS, 2):
        name += f"_W{warps}_U{unroll}"
    if per_warp != 1:
        name += f"_F{per_warp}"
    if shared_sums:
        name += "_shared_sums"
    if xglobal:
        name += "_xq"
    kern = K.Kernel(name, params, tuple(body), (threads, 1, 1), shared)
    verify_kernel(kern)
    return kern


# -- prefill and batched decode: tensor cores -------------------------------------------------------


SPLIT_THREADS = 256


@lru_cache(maxsize=None)
def split_bf16x2(k: int) -> K.Kernel:
    """x [m, k] as the tensor-core GEMMs read it (``xs``): the nearest bf16 of each value (hi) and the
    nearest bf16 of what is left (lo), two values a word, the low half first: the hi plane
    (m k / 2 words) then the lo plane. Once per x, so no GEMM workgroup converts it again. A thread
    eight values; grid (ceil(m k / 8 / SPLIT_THREADS),). K a multiple of 8."""
    if k % 8:
        raise ValueError(f"split_bf16x2 needs K a multiple of 8, got {k}")
    body: list[K.Stmt] = [K.Let("t", _add(_mul(K.Builtin("group_id", 0), SPLIT_THREADS), K.Builtin("thread_id", 0)))]
    inner: list[K.Stmt] = [K.VecLoad(tuple(f"v{i}" for i in range(4)), "x", _mul(_r("t"), 8), F32),
                           K.VecLoad(tuple(f"v{i}" for i in range(4, 8)), "x", _add(_mul(_r("t"), 8), 4), F32)]
    inner += [K.Let(f"h{i}", _bf16_bits(_r(f"v{i}", F32))) for i in range(8)]
    inner += [K.Let(f"l{i}", _bf16_bits(K.Bin("sub", _r(f"v{i}", F32), K.Bitcast(_b("shl", _r(f"h{i}"), 16), F32)))) for i in range(8)]
    inner += [K.VecStore("xs", _mul(_r("t"), 4), tuple(_pair(_r(f"h{2 * q}"), _r(f"h{2 * q + 1}")) for q in range(4))),
              K.VecStore("xs", _add(_mul(_r("m"), k // 2), _mul(_r("t"), 4)), tuple(_pair(_r(f"l{2 * q}"), _r(f"l{2 * q + 1}")) for q in range(4)))]
    body.append(K.If(K.Bin("lt", _r("t"), _mul(_r("m"), k // 8)), tuple(inner)))
    params = (K.Buffer("x", F32), K.Buffer("xs", I32, readonly=False), K.ScalarParam("m", I32))
    kern = K.Kernel(f"split_bf16x2_K{k}", params, tuple(body), (SPLIT_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern


@lru_cache(maxsize=None)
def sum_parts(parts: int) -> K.Kernel:
    """y[i] = sum over s < ``parts`` of p[s count + i], i < count, in order of s (a K-split GEMM's parts
    added): a thread four elements (count a multiple of 4); grid (ceil(count / 4 / SPLIT_THREADS),)."""
    body: list[K.Stmt] = [K.Let("i", _mul(_add(_mul(K.Builtin("group_id", 0), SPLIT_THREADS), K.Builtin("thread_id", 0)), 4))]
    inner: list[K.Stmt] = [K.VecLoad(tuple(f"a{v}" for v in range(4)), "p", _r("i"), F32)]
    for s in range(1, parts):
        inner.append(K.VecLoad(tuple(f"b{s}_{v}" for v in range(4)), "p", _add(_mul(_r("count"), s), _r("i")), F32))
        inner += [K.Assign(f"a{v}", K.Bin("add", _r(f"a{v}", F32), _r(f"b{s}_{v}", F32))) for v in range(4)]
    inner.append(K.VecStore("y", _r("i"), tuple(_r(f"a{v}", F32) for v in range(4))))
    body.append(K.If(K.Bin("lt", _r("i"), _r("count")), tuple(inner)))
    params = (K.Buffer("p", F32), K.Buffer("y", F32, readonly=False), K.ScalarParam("count", I32))
    kern = K.Kernel(f"sum_parts_{parts}", params, tuple(body), (SPLIT_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern


@lru_cache(maxsize=None)
def gemm_mma(k: int, wm: int = 2, wn: int = 2, tm: int = 2, tn: int = 4, split: bool = True, xsplit: bool = False, ksplit: int = 1) -> K.Kernel:
    """y[i, j] = sum_k x[i, k] * w[j, k] with bf16 weights on tensor cores. Warps are arranged
    ``wm x wn``; each owns ``tm`` 16-row by ``tn`` 8-column tiles, so a workgroup computes
    (16 wm tm) x (8 wn tn) outputs; grid (ceil(n / BN), ceil(m / BM)). K must be a multiple of 32.
    Each step's tiles are loaded from memory into registers during the step before (one workgroup
    memory stage, two barriers a step). With ``xsplit`` x comes as ``split_bf16x2`` wrote it (buffer
    ``xs``): staged as it is, no conversion in the loop. With ``ksplit`` S > 1 (few rows: more
    workgroups than the output's tiles give) K is split in S parts, grid (..., ..., S), and part s of
    the sum goes to ``y`` at s m n: ``sum_parts`` adds them."""
    if k % (32 * ksplit):
        raise ValueError(f"gemm_mma needs K a multiple of 32 (times the K split, {ksplit}), got {k}")
    if xsplit and not split:
        raise ValueError("gemm_mma: x comes split for the split product only")
    threads = 32 * wm * wn
    bm, bn = 16 * wm * tm, 8 * wn * tn
    stride = 16 + MMA_PAD  # words per staged row of 32 bf16
    xloads = bm * (4 if xsplit else 8)  # 16-byte loads of a step's x (threads past them repeat the last)
    if (xloads % threads and xloads > threads) or (bn * 4) % threads:
        raise ValueError(f"gemm_mma: a {bm}x{bn} tile does not divide among {threads} threads")
    halves = ("hi", "lo") if split else ("hi",)
    body: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("wr", _mul(_b("rem", _r("warp"), wm), 16 * tm)),
        K.Let("wc", _mul(_b("div", _r("warp"), wm), 8 * tn)),
        K.Let("row0", _mul(K.Builtin("group_id", 1), bm)),
        K.Let("col0", _mul(K.Builtin("group_id", 0), bn)),
        K.Let("kz", _mul(K.Builtin("group_id", 2), k // ksplit) if ksplit > 1 else _c(0)),  # this workgroup's part of K
    ]
    steps = k // ksplit // 32
    acc = {(i, j): tuple(f"acc{i}_{j}_{e}" for e in range(4)) for i in range(tm) for j in range(tn)}
    for names in acc.values():
        body += [K.Let(nm, _f(0.0)) for nm in names]
    xits, wits = -(-xloads // threads), bn * 4 // threads
    lo_plane = _mul(_r("m"), k // 2)

    def where(it: int, per_row: int, count: int) -> tuple[K.Expr, K.Expr]:  # (row, 16-byte column) of this thread's load ``it`` of ``count``
        e = _add(_mul(_c(it), threads), _r("tid")) if it else _r("tid")
        if count < threads:
            e = K.Bin("min", e, _c(count - 1))
        return _b("div", e, per_row), _b("rem", e, per_row)

    def loads(k0: K.Expr, pre: str) -> list[K.Stmt]:
        """This thread's share of the step at ``k0``: into registers named ``pre``..."""
        out: list[K.Stmt] = []
        for it in range(xits):
            rr, cc = where(it, 4 if xsplit else 8, xloads)
            row = K.Bin("min", _add(_r("row0"), rr), _b("sub", _r("m"), 1))
            if xsplit:
                at = _add(_b("div", _add(_mul(row, k), k0), 2), _mul(cc, 4))
                out.append(K.VecLoad(tuple(f"{pre}ah{it}_{v}" for v in range(4)), "xs", at, I32))
                out.append(K.VecLoad(tuple(f"{pre}al{it}_{v}" for v in range(4)), "xs", _add(lo_plane, at), I32))
            else:
                out.append(K.VecLoad(tuple(f"{pre}a{it}_{v}" for v in range(4)), "x", _add(_mul(row, k), k0, _mul(cc, 4)), F32))
        for it in range(wits):
            rr, cc = where(it, 4, bn * 4)
            at = _add(_b("div", _add(_mul(K.Bin("min", _add(_r("col0"), rr), _b("sub", _r("n"), 1)), k), k0), 2), _mul(cc, 4))
            out.append(K.VecLoad(tuple(f"{pre}b{it}_{v}" for v in range(4)), "w", at, I32))
        return out

    def names(pre: str) -> list[str]:
        out = []
        for it in range(xits):
            out += [f"{pre}ah{it}_{v}" for v in range(4)] + [f"{pre}al{it}_{v}" for v in range(4)] if xsplit else [f"{pre}a{it}_{v}" for v in range(4)]
        return out + [f"{pre}b{it}_{v}" for it in range(wits) for v in range(4)]

    def stores(pre: str) -> list[K.Stmt]:
        """The registers ``pre``... into workgroup memory (x as bf16 hi/lo pairs)."""
        out: list[K.Stmt] = []
        for it in range(xits):
            rr, cc = where(it, 4 if xsplit else 8, xloads)
            if xsplit:
                at = _add(_mul(rr, stride), _mul(cc, 4))
                out.append(K.VecStore("As_hi", at, tuple(_r(f"{pre}ah{it}_{v}") for v in range(4))))
                out.append(K.VecStore("As_lo", at, tuple(_r(f"{pre}al{it}_{v}") for v in range(4))))
                continue
            hi = [f"{pre}a{it}_h{v}" for v in range(4)]
            out += [K.Let(hi[v], _bf16_bits(_r(f"{pre}a{it}_{v}", F32))) for v in range(4)]
            at = _add(_mul(rr, stride), _mul(cc, 2))
            out.append(K.VecStore("As_hi", at, (_pair(_r(hi[0]), _r(hi[1])), _pair(_r(hi[2]), _r(hi[3])))))
            if split:
                lo = [_bf16_bits(K.Bin("sub", _r(f"{pre}a{it}_{v}", F32), K.Bitcast(_b("shl", _r(hi[v]), 16), F32))) for v in range(4)]
                out.append(K.VecStore("As_lo", at, (_pair(lo[0], lo[1]), _pair(lo[2], lo[3]))))
        for it in range(wits):
            rr, cc = where(it, 4, bn * 4)
            out.append(K.VecStore("Bs", _add(_mul(rr, stride), _mul(cc, 4)), tuple(_r(f"{pre}b{it}_{v}") for v in range(4))))
        return out

    body += loads(_r("kz"), "p")
    loop: list[K.Stmt] = [*stores("p"), K.Barrier(), *loads(_add(_r("kz"), _mul(K.Bin("min", _add(_r("kt"), 1), _c(steps - 1)), 32)), "n")]
    for ks in range(2):
        kk = 8 * ks
        for i in range(tm):
            ar = _add(_r("wr"), 16 * i, _r("g"))
            for h in halves:
                rows = (ar, _add(ar, 8), ar, _add(ar, 8))
                cols = (0, 0, 4, 4)
                for q in range(4):
                    loop.append(K.Let(f"fa{h}{ks}_{i}_{q}", K.Load(f"As_{h}", _add(_mul(rows[q], stride), kk + cols[q], _r("t4")), I32)))
        for j in range(tn):
            bnr = _add(_r("wc"), 8 * j, _r("g"))
            for q in range(2):
                loop.append(K.Let(f"fb{ks}_{j}_{q}", K.Load("Bs", _add(_mul(bnr, stride), kk + 4 * q, _r("t4")), I32)))
        for i in range(tm):
            for j in range(tn):
                for h in halves:
                    loop.append(K.Mma(acc[i, j], tuple(_r(f"fa{h}{ks}_{i}_{q}") for q in range(4)),  # type: ignore[arg-type]
                                      (_r(f"fb{ks}_{j}_0"), _r(f"fb{ks}_{j}_1"))))
    loop += [K.Assign(p, _r(nx, F32 if nx.startswith("na") and not xsplit else I32)) for p, nx in zip(names("p"), names("n"))]
    loop.append(K.Barrier())
    body.append(K.For("kt", _c(0), _c(steps), tuple(loop)))
    if ksplit > 1:
        body.append(K.Let("ybase", _mul(_mul(K.Builtin("group_id", 2), _r("m")), _r("n"))))
    for i in range(tm):
        for j in range(tn):
            r = _add(_r("row0"), _r("wr"), 16 * i, _r("g"))
            col = _add(_r("col0"), _r("wc"), 8 * j, _mul(_r("t4"), 2))
            for e, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
                rr, cc = _add(r, dr), _add(col, dc)
                at = _add(_mul(rr, _r("n")), cc)
                body.append(K.If(K.Bin("and", K.Bin("lt", rr, _r("m")), K.Bin("lt", cc, _r("n"))),
                                 (K.Store("y", _add(_r("ybase"), at) if ksplit > 1 else at, _r(acc[i, j][e], F32)),)))
    shared = [K.Shared("As_hi", I32, bm * stride), K.Shared("Bs", I32, bn * stride)]
    if split:
        shared.append(K.Shared("As_lo", I32, bm * stride))
    xs: K.Param = K.Buffer("xs", I32) if xsplit else K.Buffer("x", F32)
    params = (xs, K.Buffer("w", I32), K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    tag = ("_xs" if xsplit else "_split" if split else "") + (f"_S{ksplit}" if ksplit > 1 else "")
    kern = K.Kernel(f"gemm_mma_bf16_K{k}_{wm}x{wn}_{tm}x{tn}{tag}", params, tuple(body), (threads, 1, 1), tuple(shared))
    verify_kernel(kern)
    return kern


@lru_cache(maxsize=None)
def gemm_warp(k: int, mt: int = 1, tn: int = 4, wk: int = 8, split: bool = True, xsplit: bool = False) -> K.Kernel:
    """y = x @ w^T for few rows on tensor cores, streaming the weights like a GEMV: no staging
    through workgroup memory and no barrier in the loop. The ``wk`` warps of a workgroup split K and
    add their tiles at the end; each warp owns ``mt`` 16-row by ``tn`` 8-feature tiles. A lane loads
    16 contiguous bytes of a weight row (eight values) per 32-wide step of K and feeds them to two
    m16n8k16 products: K is summed in a permuted order (the same for x and the weights), which is
    what lets every load be 16 bytes. Grid (ceil(m / (16 mt)), ceil(n / (8 tn))). With ``xsplit`` x
    comes as ``split_bf16x2`` wrote it (buffer ``xs``): its words are the fragments, no conversion."""
    if xsplit and not split:
        raise ValueError("gemm_warp: x comes split for the split product only")
    if k % (32 * wk):
        raise ValueError(f"gemm_warp needs K a multiple of {32 * wk}, got {k}")
    threads, steps = 32 * wk, k // (32 * wk)
    un = 2 if steps % 2 == 0 else 1
    halves = ("hi", "lo") if split else ("hi",)
    nacc = mt * tn * 4
    body: list[K.Stmt] = [
        *_mma_lanes(),
        K.Let("row0", _mul(K.Builtin("group_id", 0), 16 * mt)),
        K.Let("col0", _mul(K.Builtin("group_id", 1), 8 * tn)),
        K.Let("kw", _add(_mul(_r("warp"), k // wk), _mul(_r("t4"), 8))),  # this lane's first value of K
    ]
    last_m, last_n = _b("sub", _r("m"), 1), _b("sub", _r("n"), 1)
    for i in range(mt):
        for h in (0, 8):
            body.append(K.Let(f"xr{i}_{h}", _mul(K.Bin("min", _add(_r("row0"), 16 * i + h, _r("g")), last_m), k)))
    for j in range(tn):
        body.append(K.Let(f"wr{j}", _mul(K.Bin("min", _add(_r("col0"), 8 * j, _r("g")), last_n), k)))
    acc = {(i, j): tuple(f"acc{i}_{j}_{e}" for e in range(4)) for i in range(mt) for j in range(tn)}
    for names in acc.values():
        body += [K.Let(nm, _f(0.0)) for nm in names]
    # with x split, the next step's loads are issued before this step's products (its registers
    # named "n...", this step's "c..."): twice the bytes in flight a warp
    cur = "c" if xsplit else ""

    def loads(sx: K.Expr, pre: str) -> tuple[list[K.Stmt], list[str]]:
        out: list[K.Stmt] = []
        names: list[str] = []
        for u in range(un):  # every load of the unrolled steps first, then the products
            out.append(K.Let(f"{pre}k{u}", _add(_r("kw"), _mul(sx, 32 * un), 32 * u)))
            for j in range(tn):
                names += [f"{pre}p{u}_{j}_{q}" for q in range(4)]
                out.append(K.VecLoad(tuple(names[-4:]), "w", _b("div", _add(_r(f"wr{j}"), _r(f"{pre}k{u}")), 2), I32))
            for i in range(mt):
                for h in (0, 8):
                    xi = _add(_r(f"xr{i}_{h}"), _r(f"{pre}k{u}"))
                    if xsplit:  # the eight values' hi words, then their lo words
                        hw, lw = [f"{pre}hw{u}_{i}_{h}_{q}" for q in range(4)], [f"{pre}lw{u}_{i}_{h}_{q}" for q in range(4)]
                        names += hw + lw
                        out += [K.VecLoad(tuple(hw), "xs", _b("div", xi, 2), I32),
                                K.VecLoad(tuple(lw), "xs", _add(_mul(_r("m"), k // 2), _b("div", xi, 2)), I32)]
                        continue
                    out += [K.VecLoad(tuple(f"x{u}_{i}_{h}_{v}" for v in range(4)), "x", xi, F32),
                            K.VecLoad(tuple(f"x{u}_{i}_{h}_{v}" for v in range(4, 8)), "x", _add(xi, 4), F32)]
        return out, names

    loop: list[K.Stmt] = []
    if xsplit:
        first, cnames = loads(_c(0), cur)
        body += first
        nxt, nnames = loads(K.Bin("min", _add(_r("s"), 1), _c(steps // un - 1)), "n")
        loop += nxt
    else:
        loop += loads(_r("s"), cur)[0]
    for u in range(un):
        for i in range(mt):
            for h in (0, 8):
                for v in range(8 if not xsplit else 0):
                    xv = _r(f"x{u}_{i}_{h}_{v}", F32)
                    loop.append(K.Let(f"h{u}_{i}_{h}_{v}", _bf16_bits(xv)))
                    if split:
                        loop.append(K.Let(f"l{u}_{i}_{h}_{v}", _bf16_bits(K.Bin("sub", xv, K.Bitcast(_b("shl", _r(f"h{u}_{i}_{h}_{v}"), 16), F32)))))
        for half in (0, 1):  # values 0-3 of the lane's eight, then 4-7
            for i in range(mt):
                for hl, pre in (("hi", "h"), ("lo", "l"))[: len(halves)]:
                    if xsplit:
                        pr = lambda rr, q: _r(f"{cur}{pre}w{u}_{i}_{rr}_{q}")  # noqa: E731
                    else:
                        pr = lambda rr, q: _pair(_r(f"{pre}{u}_{i}_{rr}_{2 * q}"), _r(f"{pre}{u}_{i}_{rr}_{2 * q + 1}"))  # noqa: E731
                    a = (pr(0, 2 * half), pr(8, 2 * half), pr(0, 2 * half + 1), pr(8, 2 * half + 1))
                    for q in range(4):
                        loop.append(K.Let(f"fa{hl}{u}{half}_{i}_{q}", a[q]))
            for i in range(mt):
                for j in range(tn):
                    for hl in halves:
                        loop.append(K.Mma(acc[i, j], tuple(_r(f"fa{hl}{u}{half}_{i}_{q}") for q in range(4)),  # type: ignore[arg-type]
                                          (_r(f"{cur}p{u}_{j}_{2 * half}"), _r(f"{cur}p{u}_{j}_{2 * half + 1}"))))
    if xsplit:
        loop += [K.Assign(c, _r(nx)) for c, nx in zip(cnames, nnames)]
    body.append(K.For("s", _c(0), _c(steps // un), tuple(loop)))
    # the warps' partial tiles through workgroup memory, then summed and stored
    flat = [nm for i in range(mt) for j in range(tn) for nm in acc[i, j]]
    for e, nm in enumerate(flat):
        body.append(K.Store("part", _add(_mul(_r("tid"), nacc), e), _r(nm, F32)))
    body.append(K.Barrier())
    # o = lane * nacc + e, e = ((i * tn) + j) * 4 + c: c picks row g or g + 8 and column 2 t4 or 2 t4 + 1
    part = K.Load("part", _add(_mul(_add(_mul(_r("ww"), 32), _r("ln")), nacc), _r("e")), F32)
    out: list[K.Stmt] = [
        K.Let("ln", _b("div", _r("o"), nacc)), K.Let("e", _b("rem", _r("o"), nacc)),
        K.Let("c", _b("rem", _r("e"), 4)), K.Let("tile", _b("div", _r("e"), 4)), K.Let("sum", _f(0.0)),
        K.For("ww", _c(0), _c(wk), (K.Assign("sum", K.Bin("add", _r("sum", F32), part)),)),
        K.Let("orow", _add(_r("row0"), _mul(_b("div", _r("tile"), tn), 16), _b("div", _r("ln"), 4), _mul(_b("div", _r("c"), 2), 8))),
        K.Let("ocol", _add(_r("col0"), _mul(_b("rem", _r("tile"), tn), 8), _mul(_b("rem", _r("ln"), 4), 2), _b("rem", _r("c"), 2))),
        K.If(K.Bin("and", K.Bin("lt", _r("orow"), _r("m")), K.Bin("lt", _r("ocol"), _r("n"))),
             (K.Store("y", _add(_mul(_r("orow"), _r("n")), _r("ocol")), _r("sum", F32)),)),
    ]
    body.append(K.For("o", _r("tid"), _c(32 * nacc), tuple(out), step=threads))
    xs: K.Param = K.Buffer("xs", I32) if xsplit else K.Buffer("x", F32)
    params = (xs, K.Buffer("w", I32), K.Buffer("y", F32, readonly=False), K.ScalarParam("m", I32), K.ScalarParam("n", I32))
    tag = "_xs" if xsplit else "_split" if split else ""
    kern = K.Kernel(f"gemm_warp_bf16_K{k}_{mt}x{tn}_W{wk}{tag}", params, tuple(body), (threads, 1, 1),
                    (K.Shared("part", F32, threads * nacc),))
    verify_kernel(kern)
    return kern
