"""Activations quantized for the dp4a GEMVs (Q4_K, Q6_K): x as two int8 terms per value, per 32
values a scale (llama.cpp's Q8_1) and a second term for the remainder (about 15 bits of each value),
placed in workgroup memory so that the GEMV's lanes read it free of bank conflicts; quantized by each
workgroup itself (``_quantize_x_q8``), or once for every reader by ``quantize_q8x2`` and then
read from global memory or copied into workgroup memory (``_stage_x_q8``)."""

from __future__ import annotations

from functools import lru_cache

from .. import ir as K
from ..verify import verify_kernel
from ._kir import F32, I32, _add, _b, _c, _f, _mul, _r

__all__ = ["quantize_q8x2", "q8_quantize_word", "q8_quantize_lane", "q8_shared_words", "Q8_SPLIT", "Q8_THREADS"]


Q8_SPLIT = 254  # the second int8 term's scale is the first's / Q8_SPLIT (its values are within half a step)


def q8_shared_words(k: int, mr: int) -> int:
    """Workgroup memory (4-byte words) a Q4_K warp GEMV needs for ``mr`` rows of x as two int8 terms."""
    return mr * (k // 2 + k // 16)


def _quantize_x_q8(k: int, mr: int, threads: int, wide: bool = False) -> list[K.Stmt]:
    """The workgroup's ``mr`` rows of x quantized into workgroup memory as two int8 terms per value,
    x ~ d (q1 + q2 / Q8_SPLIT): per 32 values d = max|x| / 127 and q1 = rint(x / d) (four a word in
    ``xq``) as llama.cpp's Q8_1, then the remainder's q2 = rint((x - d q1) Q8_SPLIT / d) (``xr``),
    which keeps about 15 bits of each value where one int8 keeps 7; the exact f32 sum of the 32
    values sits beside d (``xds``: d, sum). A thread a word (four values), the eight threads of a
    block exchanging max and sum by shuffles: short, so the GEMV starts soon. Rounding by ``rint``,
    not by adding and subtracting 1.5 * 2**23: SPIR-V lets a driver fold (t + c) - c to t (Mesa's
    does: every q2 came out zero). A block's words are stored even sub-blocks first, then odd ones
    (the readers' lanes of one block then read 32 consecutive words, no two in one bank); with
    ``wide`` (``_q4_k_rows``' lanes of 32 bytes) each sub-block's two halves of four words are 16
    words apart, the first of them after the second in odd blocks. Ends with a barrier. ``mr * k / 4`` is a
    multiple of 32 (k of 256): whole warps take part in each step."""
    words = k // 4
    total = mr * words  # a multiple of 64: a warp's threads are all in or all out of a turn
    turns = -(-total // threads)
    out: list[K.Stmt] = []
    loads: list[K.Stmt] = []
    sums: list[K.Stmt] = []
    for u in range(turns):  # up to 8 turns' x loaded before any is quantized: one memory latency, not eight
        if u % 8 == 0:
            out += loads + sums
            loads, sums = [], []
        qi = f"qi{u}"
        row = K.Bin("min", _add(_r("m0"), _b("div", _r(qi), words)), _b("sub", _r("m"), 1))
        first, rest = _q8_word(_add(_mul(row, k), _mul(_b("rem", _r(qi), words), 4)), _q8_slot(_r(qi), words, wide), qi, f"_{u}")
        loads += [K.Let(qi, K.Bin("min", _add(K.Builtin("thread_id", 0), u * threads), _c(total - 1))), *first]
        last = (u + 1) * threads > total
        sums += [K.If(K.Bin("lt", _add(K.Builtin("thread_id", 0), u * threads), _c(total)), tuple(rest))] if last else rest
    return out + loads + sums + [K.Barrier()]


def _q8_slot(qi: K.Expr, words: int, wide: bool) -> K.Expr:
    """Where word ``qi`` of the workgroup's quantized rows of x (``words`` a row) sits in workgroup
    memory (``_quantize_x_q8``'s layout). Four consecutive words from a multiple of four sit side
    by side."""
    t = _b("and", qi, 63)  # the word's place in its block of 256 values: sub-block s = t / 8, word t % 8
    odd = _b("shl", _b("and", _b("shr", t, 3), 1), 5)  # odd sub-blocks 32 words on
    if wide:  # sub-block pair s / 2 at 4 (s / 2) in each half; half h of 4 words at 16 (h ^ (block & 1))
        half = _b("xor", _b("and", _b("shr", t, 2), 1), _b("and", _b("shr", _b("rem", qi, words), 6), 1))
        place = _b("or", _b("or", _b("and", t, 3), _b("shl", _b("and", _b("shr", t, 4), 3), 2)), _b("or", _b("shl", half, 4), odd))
    else:  # sub-block pair s / 2 at 8 (s / 2)
        place = _b("or", _b("and", t, 7), _b("or", _b("shl", _b("and", _b("shr", t, 4), 3), 3), odd))
    return _add(_b("sub", qi, t), place)


def _stage_x_q8(k: int, mr: int, threads: int, wide: bool, scaled: tuple[list[K.Stmt], K.Expr] | None = None) -> list[K.Stmt]:
    """The workgroup's ``mr`` rows of x, quantized once for every reader by ``quantize_q8x2``
    (buffers ``xq_in``, ``xr_in``, ``xds_in``), copied into workgroup memory in
    ``_quantize_x_q8``'s layout, 16 bytes a load: a few loads a thread instead of the quantization's
    arithmetic. Every load is asked for before the first store (a store waits for its load). With
    ``scaled`` (statements, a scale: one row) the statements come between the loads and the stores,
    and each block's d and sum are stored times the scale: x scaled at no cost to the sums. Ends
    with a barrier."""
    words, sums = k // 4, k // 16
    loads: list[K.Stmt] = []
    stores: list[K.Stmt] = []
    tid = K.Builtin("thread_id", 0)
    for name, per, placed in (("xq", words, True), ("xr", words, True), ("xds", sums, False)):
        quads = mr * per // 4
        for u in range(-(-quads // threads)):
            qv = _add(tid, u * threads)
            partial = (u + 1) * threads > quads  # a turn some threads sit out: they read the last quad, store nothing
            qi = _mul(K.Bin("min", qv, _c(quads - 1)) if partial else qv, 4)  # the first of the quad's words among the workgroup's rows
            row = K.Bin("min", _add(_r("m0"), _b("div", qi, per)), _b("sub", _r("m"), 1))
            names = tuple(f"{name}s{u}_{i}" for i in range(4))
            dtype = F32 if name == "xds" else I32
            loads.append(K.VecLoad(names, f"{name}_in", _add(_mul(row, per), _b("rem", qi, per)), dtype))
            vals: tuple[K.Expr, ...] = tuple(_r(nm, dtype) for nm in names)
            if scaled is not None and name == "xds":
                vals = tuple(K.Bin("mul", v, scaled[1]) for v in vals)
            store = K.VecStore(name, _q8_slot(qi, per, wide) if placed else qi, vals)
            stores.append(K.If(K.Bin("lt", qv, _c(quads)), (store,)) if partial else store)
    return loads + (scaled[0] if scaled is not None else []) + stores + [K.Barrier()]  # every load asked for before the first store waits on one


def _q8_word(at: K.Expr, slot: K.Expr | None = None, qi: str = "qi", sfx: str = "") -> tuple[list[K.Stmt], list[K.Stmt]]:
    """Word ``qi`` of x as two int8 terms (``_quantize_x_q8``): its four values loaded from x at ``at``
    (the first list), its block's max and sum shared by shuffles, stored at ``slot`` (default ``qi``)
    of ``xq``/``xr`` and, by the block's first thread, at ``2 (qi / 8)`` of ``xds`` (the second).
    Locals are suffixed ``sfx``."""
    first: list[K.Stmt] = [K.VecLoad(tuple(f"qv{j}{sfx}" for j in range(4)), "x", at, F32)]
    return first, q8_quantize_word([_r(f"qv{j}{sfx}", F32) for j in range(4)], slot, qi, sfx)


def q8_quantize_word(
    v: list[K.Expr], slot: K.Expr | None = None, qi: str = "qi", sfx: str = "", names: tuple[str, str, str] = ("xq", "xr", "xds")
) -> list[K.Stmt]:
    """Four values ``v`` (word ``qi`` of x, a local) as two int8 terms (``_quantize_x_q8``): the
    block's max and sum shared by shuffles among its eight consecutive lanes, stored at ``slot``
    (default ``qi``) of ``xq``/``xr`` and, by the block's first thread, at ``2 (qi / 8)`` of ``xds``
    (buffers named ``names``). Every lane of the warp reaches it. Locals are suffixed ``sfx``."""
    inner: list[K.Stmt] = []
    qmax, qsum, qinv, qinv2, qd = (f"{n}{sfx}" for n in ("qmax", "qsum", "qinv", "qinv2", "qd"))
    inner += [
        K.Let(qmax, K.Bin("max", K.Bin("max", K.Un("abs", v[0]), K.Un("abs", v[1])), K.Bin("max", K.Un("abs", v[2]), K.Un("abs", v[3])))),
        K.Let(qsum, K.Bin("add", K.Bin("add", v[0], v[1]), K.Bin("add", v[2], v[3]))),
    ]
    for lane in (1, 2, 4):  # the block's eight threads are eight consecutive lanes
        inner += [
            K.Assign(qmax, K.Bin("max", _r(qmax, F32), K.SubgroupShuffle(_r(qmax, F32), _c(lane), xor=True))),
            K.Assign(qsum, K.Bin("add", _r(qsum, F32), K.SubgroupShuffle(_r(qsum, F32), _c(lane), xor=True))),
        ]
    inner += [
        K.Let(qinv, K.Select(K.Bin("gt", _r(qmax, F32), _f(0.0)), K.Bin("div", _f(127.0), _r(qmax, F32)), _f(0.0))),
        K.Let(qinv2, K.Bin("mul", _r(qinv, F32), _f(float(Q8_SPLIT)))),
        K.Let(qd, K.Bin("div", _r(qmax, F32), _f(127.0))),
    ]
    b1, b2 = [], []
    for j in range(4):  # q1 = rint(x / d); the remainder x - d q1, and its q2
        inner.append(K.Let(f"qt{j}{sfx}", K.Un("rint", K.Bin("mul", v[j], _r(qinv, F32)))))
        rem = K.Bin("sub", v[j], K.Bin("mul", _r(f"qt{j}{sfx}", F32), _r(qd, F32)))
        b1.append(_b("and", K.Cast(_r(f"qt{j}{sfx}", F32), I32), 255))
        b2.append(_b("and", K.Cast(K.Un("rint", K.Bin("mul", rem, _r(qinv2, F32))), I32), 255))

    def word(b: list[K.Expr]) -> K.Expr:
        return _b("or", _b("or", b[0], _b("shl", b[1], 8)), _b("or", _b("shl", b[2], 16), _b("shl", b[3], 24)))

    slot = _r(qi) if slot is None else slot
    nq, nr, nds = names
    inner += [
        K.Store(nq, slot, word(b1)),
        K.Store(nr, slot, word(b2)),
        K.If(K.Bin("eq", _b("rem", _r(qi), 8), _c(0)), (K.VecStore(nds, _b("div", _r(qi), 4), (_r(qd, F32), _r(qsum, F32))),)),
    ]
    return inner


def q8_quantize_lane(v: K.Expr, word: K.Expr, lane: K.Expr, names: tuple[str, str, str] = ("xq", "xr", "xds")) -> list[K.Stmt]:
    """One value ``v`` a lane of a 32-lane subgroup that holds a block of 32 consecutive values of x,
    as ``q8_quantize_word``'s two int8 terms: the block's max and sum by subgroup reductions, a
    lane's two bytes gathered four lanes a word by shuffles; lanes 4i store word ``word`` (the
    block's first word + i) of ``xq``/``xr``, lane 0 the block's (d, sum) at ``word / 4`` of ``xds``
    (buffers ``names``). Every lane of the subgroup reaches it."""
    shift = _mul(_b("and", lane, 3), 8)
    out: list[K.Stmt] = [
        K.Let("lv", v),
        K.Let("lmax", K.SubgroupReduce("max", K.Un("abs", _r("lv", F32)))),
        K.Let("lsum", K.SubgroupReduce("add", _r("lv", F32))),
        K.Let("linv", K.Select(K.Bin("gt", _r("lmax", F32), _f(0.0)), K.Bin("div", _f(127.0), _r("lmax", F32)), _f(0.0))),
        K.Let("ld", K.Bin("div", _r("lmax", F32), _f(127.0))),
        K.Let("lq1", K.Un("rint", K.Bin("mul", _r("lv", F32), _r("linv", F32)))),
        K.Let(
            "lq2",
            K.Un(
                "rint",
                K.Bin("mul", K.Bin("sub", _r("lv", F32), K.Bin("mul", _r("lq1", F32), _r("ld", F32))), K.Bin("mul", _r("linv", F32), _f(float(Q8_SPLIT)))),
            ),
        ),
    ]
    for t, q in (("xq", "lq1"), ("xr", "lq2")):  # the four lanes' bytes into one word (they do not overlap: adds are ors)
        out += [
            K.Let(f"{t}b", _b("shl", _b("and", K.Cast(_r(q, F32), I32), 255), shift)),
            K.Assign(f"{t}b", _add(_r(f"{t}b"), K.SubgroupShuffle(_r(f"{t}b"), _c(1), xor=True))),
            K.Assign(f"{t}b", _add(_r(f"{t}b"), K.SubgroupShuffle(_r(f"{t}b"), _c(2), xor=True))),
        ]
    xq, xr, xds = names
    out += [
        K.If(K.Bin("eq", _b("and", lane, 3), _c(0)), (K.Store(xq, word, _r("xqb")), K.Store(xr, word, _r("xrb")))),
        K.If(K.Bin("eq", lane, _c(0)), (K.VecStore(xds, _b("div", word, 4), (_r("ld", F32), _r("lsum", F32))),)),
    ]
    return out


Q8_THREADS = 256


@lru_cache(maxsize=None)
def quantize_q8x2(k: int) -> K.Kernel:
    """x [m, k] as the Q4_K GEMV's two int8 terms (``_quantize_x_q8``), once for every GEMV that
    reads it, into buffers ``xq``, ``xr`` (m k / 4 words each) and ``xds`` (m k / 16 floats): a
    thread a word; grid (ceil(m k / 4 / Q8_THREADS),). K a multiple of 256, so warps are whole."""
    if k % 256:
        raise ValueError(f"quantize_q8x2 needs K a multiple of 256, got {k}")
    body: list[K.Stmt] = [
        K.Let("qi", _add(_mul(K.Builtin("group_id", 0), Q8_THREADS), K.Builtin("thread_id", 0))),
        K.If(K.Bin("lt", _r("qi"), _mul(_r("m"), k // 4)), tuple(sum(_q8_word(_mul(_r("qi"), 4)), []))),
    ]
    params = (
        K.Buffer("x", F32),
        K.Buffer("xq", I32, readonly=False),
        K.Buffer("xr", I32, readonly=False),
        K.Buffer("xds", F32, readonly=False),
        K.ScalarParam("m", I32),
    )
    kern = K.Kernel(f"quantize_q8x2_K{k}", params, tuple(body), (Q8_THREADS, 1, 1), ())
    verify_kernel(kern)
    return kern
