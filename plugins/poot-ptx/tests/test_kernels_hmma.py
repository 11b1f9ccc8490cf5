"""The f16 tensor-core GEMM on exact Q4_K weights (``gemm_hmma_q4_k_xs``, ``mma.sync`` m16n8k16 f16)
and the x it reads (``split_f16x2``) against numpy. The products run where ``POOT_TEST_DEVICE``
names a device with mma.sync (``cuda:0`` through ``scripts/gpu-check``); elsewhere small cases run
through the Kernel IR interpreter (``simt``: fragment layouts and indexing, not the hardware), and
the kernels are compiled to PTX and checked."""

from __future__ import annotations

import numpy as np
import pytest

from poot.codegen import compile_kernel
from poot.codegen.targets import target
from poot.quant import quantization
from poot.testing.kernels import features_under_test, poisoned, run_host
from poot_ptx.assembler import find_ptxas, ptxas_usage
from poot_ptx.kernels.hmma_xs import SPLIT_F16_THREADS, XDS_BLOCK, gemm_hmma_q4_k_xs, split_f16x2
from poot_ptx.kernels.mma import sum_parts
from poot_ptx.simt import run_simt

SUBGROUP, MATRIX = features_under_test()
ON_DEVICE = SUBGROUP == 32 and "mma.sync.bf16" in MATRIX


def _run(kern, grid, bufs, scalars) -> None:  # type: ignore[no-untyped-def]
    """On the device under test where it has mma.sync, else through the interpreter."""
    (run_host if ON_DEVICE else run_simt)(kern, grid, bufs, scalars)


def _halves_poisoned(n: int) -> np.ndarray:
    """Words of two f16 NaNs: a term's word never written stays NaN (its halves are finite)."""
    return np.full(n, 0x7E007E00, np.int32)


def _split(x: np.ndarray, glu: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    m, k = x.shape
    bufs = {"xh": _halves_poisoned(m * k // 2), "xl": _halves_poisoned(m * k // 2), "xds": poisoned((m * k // 16,))}
    ins = {"g": glu[0], "u": glu[1]} if glu else {"x": x}
    _run(split_f16x2(k, glu is not None), (-(-m * k // 256 // (SPLIT_F16_THREADS // 32)),), {**ins, **bufs}, {"m": m})
    return bufs


def _rebuilt(b: dict[str, np.ndarray], m: int, k: int) -> np.ndarray:
    """x from its two f16 terms (undoing the order within groups of four, and the blocks' scales)."""
    t = b["xh"].view(np.float16).reshape(m, k).astype(np.float64) + b["xl"].view(np.float16).reshape(m, k).astype(np.float64)
    out = np.empty_like(t)
    out[:, np.arange(k).reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(-1)] = t
    return out * b["xds"].reshape(m, k // 256, XDS_BLOCK)[:, :, 8].astype(np.float64).repeat(256, axis=1)


def _x(rng, m: int, k: int) -> np.ndarray:
    """Blocks of 32 at scales from 1e-3 to 1e3: every block's own power-of-two scale matters."""
    return (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-3, 3, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)


@pytest.mark.parametrize("m,k", [(1, 256), (5, 1024), (13, 768)])
@pytest.mark.parametrize("glu", [False, True])
def test_x_split_into_two_f16_terms_per_block(rng, m, k, glu):
    """Every word written; x rebuilt from its terms within 2^-21 of each block's largest magnitude
    (22 bits where one f16 keeps 11), each block's scale a power of two putting that magnitude in
    [2^14, 2^15), and the sums of 32 values numpy's (of silu(g) * u with ``glu``)."""
    if glu:
        g, u = (rng.standard_normal((m, k)) * 3).astype(np.float32), _x(rng, m, k)
        x = (g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u).astype(np.float32)
        b = _split(x, (g, u))
    else:
        x = _x(rng, m, k)
        b = _split(x)
    halves = np.concatenate([b["xh"], b["xl"]]).view(np.float16)
    assert np.isfinite(halves).all() and np.isfinite(b["xds"]).all(), "a word was never written"
    big = np.abs(x.astype(np.float64)).reshape(m, k // 256, 256).max(axis=2)
    ds = b["xds"].reshape(m, k // 256, XDS_BLOCK).astype(np.float64)
    scaled = big / ds[:, :, 8]
    assert ((scaled >= 2**14 * (1 - 1e-6)) & (scaled < 2**15)).all() and (np.log2(ds[:, :, 8]) % 1 == 0).all()
    err = np.abs(_rebuilt(b, m, k) - x).reshape(m, k // 256, 256).max(axis=2)
    assert (err <= big * 2**-21).all(), f"x rebuilt is off by up to {(err / big).max():.3g} of a block's largest"
    sums = x.astype(np.float64).reshape(m, k // 32, 32).sum(axis=2).reshape(m, k // 256, 8)
    scale = np.abs(x.astype(np.float64)).reshape(m, k // 32, 32).sum(axis=2).reshape(m, k // 256, 8)
    assert (np.abs(ds[:, :, :8] - sums) <= 1e-5 * scale + 1e-30).all(), "a sub-block's sum is off"


def _q4_k(rng, n: int, k: int) -> np.ndarray:
    return quantization("q4_k").quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))


def _check(y: np.ndarray, raw: np.ndarray, x: np.ndarray) -> None:
    """Every output written, and within the f32-summation bound of the exact product of x with
    gguf's dequantization (the weights are exact, x is within 2^-21 of its blocks' largest)."""
    n, k = y.shape[1], x.shape[1]
    assert np.isfinite(y).all(), "an output element was never written"
    w = quantization("q4_k").dequantize(raw).reshape(n, k).astype(np.float64)
    x64 = x.astype(np.float64)
    want, scale = x64 @ w.T, np.abs(x64) @ np.abs(w).T
    bad = np.abs(y - want) > 1e-5 * scale + 1e-6
    assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off, worst {(np.abs(y - want) / scale).max():.3g} of |x| |w|"


def _product(kern, grid, b, w, m, n, ks):  # type: ignore[no-untyped-def]
    """The GEMM's output, K-split parts added by ``sum_parts``."""
    parts = poisoned((ks, m, n))
    _run(kern, grid, {**b, "w": w, "y": parts}, {"m": m, "n": n})
    if ks == 1:
        return parts[0]
    y = poisoned((m, n))
    _run(sum_parts(ks), (-(-m * n // 4 // 256),), {"p": parts, "y": y}, {"count": m * n})
    return y


# (k, ft, rt, wf, wr, ksplit, pipelined, m, n): through the interpreter small ones, each shape of
# warps, K split and not, rows and features past the last tile; on the device Llama-3-8B's too
_SMALL = [
    (512, 1, 1, 2, 1, 1, False, 5, 40),
    (1024, 2, 4, 2, 2, 2, True, 37, 64),
    (768, 2, 2, 1, 2, 3, True, 30, 70),
    (512, 2, 4, 4, 2, 1, True, 64, 128),
]
_DEVICE = [
    (4096, 2, 4, 4, 2, 1, True, 64, 14336),
    (4096, 2, 4, 4, 2, 2, True, 48, 6144),
    (14336, 2, 4, 4, 2, 4, True, 64, 4096),
    (4096, 1, 8, 8, 1, 1, False, 33, 2000),
]


@pytest.mark.parametrize("k,ft,rt,wf,wr,ks,pipe,m,n", _SMALL + (_DEVICE if ON_DEVICE else []), ids=str)
def test_hmma_gemm_matches_the_exact_product(rng, k, ft, rt, wf, wr, ks, pipe, m, n):
    """``gemm_hmma_q4_k_xs`` on ``split_f16x2``'s x: ``_check``; with K split, its parts added by
    ``sum_parts``; ``pipe``: each block's weights loaded during the block before."""
    raw, x = _q4_k(rng, n, k), _x(rng, m, k)
    grid = (-(-m // (8 * rt * wr)), -(-n // (16 * ft * wf)), ks)
    y = _product(gemm_hmma_q4_k_xs(k, ft, rt, wf, wr, ks, pipe), grid, _split(x), raw.view(np.int32).reshape(-1), m, n, ks)
    _check(y, raw, x)


@pytest.mark.parametrize("ks", [1, 2])
def test_hmma_gemm_of_several_weights_gives_each_alones_bits(rng, ks):
    """With ``parts`` (q, k and v; gate and up): each weight's product is the same bits as its own
    launch's, K split (``sum_parts(S, sizes)`` dividing the sums) or not."""
    k, ft, rt, wf, wr, m, sizes = 512, 1, 2, 2, 2, 29, (64, 32, 32)
    raws, x = [_q4_k(rng, n, k) for n in sizes], _x(rng, m, k)
    b, total, width = _split(x), sum(sizes), 16 * ft * wf
    words = [raw.view(np.int32).reshape(-1) for raw in raws]
    ys = [poisoned((m, n)) for n in sizes]
    grid = (-(-m // (8 * rt * wr)), total // width, ks)
    kern = gemm_hmma_q4_k_xs(k, ft, rt, wf, wr, ks, True, parts=sizes)
    ws = {f"w{i}": w for i, w in enumerate(words)}
    if ks == 1:
        _run(kern, grid, {**b, **ws, **{f"y{i}": y for i, y in enumerate(ys)}}, {"m": m, "n": total})
    else:
        scratch = poisoned((ks, m, total))
        _run(kern, grid, {**b, **ws, "y": scratch}, {"m": m, "n": total})
        _run(sum_parts(ks, sizes), (-(-m * total // 4 // 256),), {"p": scratch, **{f"y{i}": y for i, y in enumerate(ys)}}, {"count": m * total})
    for raw, w, y, n in zip(raws, words, ys, sizes, strict=True):
        _check(y, raw, x)
        one = _product(gemm_hmma_q4_k_xs(k, ft, rt, wf, wr, ks, True), (grid[0], n // width, ks), b, w, m, n, ks)
        assert np.array_equal(y.view(np.int32), one.view(np.int32)), "a weight's product differs from its own launch's"


@pytest.mark.parametrize("args", [(4096, 2, 4, 4, 2, 1, True), (14336, 2, 4, 4, 2, 4, True), (4096, 1, 8, 8, 1, 2, True)], ids=str)
@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_hmma_gemm_compiles_to_f16_products(args):
    """Four f16 products a 32-value sub-block for each tile (two steps of 16, two terms of x), the
    weights' pairs built by f16x2 fused multiply-adds, x's copies asynchronous; with ptxas, no
    spills and a launchable workgroup."""
    kern = gemm_hmma_q4_k_xs(*args)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    ft, rt = args[1], args[2]
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 8 * 4 * ft * rt
    assert "fma.rn.f16x2" in ptx and "cp.async.cg.shared.global" in ptx and "m16n8k32" not in ptx
    if find_ptxas():
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90a")
        assert spills == 0, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"


# (k, rows, warpgroups, ksplit, pipelined, m, n, stages) of the warpgroup kernel (sm_90a): through
# the interpreter small ones; on the device Llama-3-8B's too
_WG_SMALL = [
    (512, 16, 1, 1, True, 13, 64, 2),
    (1024, 64, 2, 2, True, 37, 200, 2),
    (768, 32, 1, 3, False, 40, 64, 2),
    (2048, 16, 1, 1, True, 9, 64, 3),
    (1536, 8, 1, 2, True, 5, 64, 4),
    (512, 24, 1, 1, True, 21, 64, 2),
]
_WG_DEVICE = [
    (4096, 64, 2, 1, True, 64, 14336, 2),
    (4096, 64, 2, 2, True, 50, 6144, 2),
    (14336, 64, 2, 4, True, 64, 4096, 2),
    (4096, 32, 2, 2, True, 17, 4096, 2),
    (4096, 64, 2, 1, True, 61, 4096, 3),
]
WGMMA = ON_DEVICE and "wgmma" in MATRIX


@pytest.mark.parametrize("k,rows,wg,ks,pipe,m,n,stages", _WG_SMALL + (_WG_DEVICE if WGMMA else []), ids=str)
def test_wgmma_f16_gemm_matches_the_exact_product(rng, k, rows, wg, ks, pipe, m, n, stages):
    """``gemm_wgmma_q4_k_f16`` on ``split_f16x2(order="wgmma")``'s x: ``_check`` (through the
    interpreter where the device under test has no wgmma); ``stages`` buffers of x in the ring."""
    from poot_ptx.kernels.wgmma_f16 import gemm_wgmma_q4_k_f16

    raw, x = _q4_k(rng, n, k), _x(rng, m, k)
    b = {"xh": _halves_poisoned(m * k // 2), "xl": _halves_poisoned(m * k // 2), "xds": poisoned((m * k // 16,))}
    run = run_host if WGMMA else run_simt
    run(split_f16x2(k, order="wgmma"), (-(-m * k // 256 // (SPLIT_F16_THREADS // 32)),), {"x": x, **b}, {"m": m})
    parts = poisoned((ks, m, n))
    run(
        gemm_wgmma_q4_k_f16(k, rows, wg, ks, pipe, stages=stages),
        (-(-m // rows), -(-n // (64 * wg)), ks),
        {**b, "w": raw.view(np.int32).reshape(-1), "y": parts},
        {"m": m, "n": n},
    )
    y = parts[0] if ks == 1 else parts.sum(axis=0, dtype=np.float64)
    _check(y, raw, x)


def test_wgmma_f16_gemm_of_x_first_term_matches_x_rounded(rng):
    """``terms`` 1 (matmul precision "medium"): the product of x as its first f16 term alone (the
    ``xl`` plane is not read) within the f32-summation bound."""
    from poot_ptx.kernels.wgmma_f16 import gemm_wgmma_q4_k_f16

    k, rows, m, n = 512, 16, 13, 64
    raw, x = _q4_k(rng, n, k), _x(rng, m, k)
    b = {"xh": _halves_poisoned(m * k // 2), "xl": _halves_poisoned(m * k // 2), "xds": poisoned((m * k // 16,))}
    run = run_host if WGMMA else run_simt
    run(split_f16x2(k, order="wgmma"), (-(-m * k // 256 // (SPLIT_F16_THREADS // 32)),), {"x": x, **b}, {"m": m})
    y = poisoned((m, n))
    kern = gemm_wgmma_q4_k_f16(k, rows, 1, terms=1)
    assert "xl" not in {p.name for p in kern.params}
    run(kern, (1, 1, 1), {"xh": b["xh"], "xds": b["xds"], "w": raw.view(np.int32).reshape(-1), "y": y}, {"m": m, "n": n})
    first = np.empty((m, k))
    first[:, np.arange(k).reshape(-1, 32)[:, _WG_ORDER].reshape(-1)] = b["xh"].view(np.float16).reshape(m, k)
    first *= b["xds"].reshape(m, k // 256, XDS_BLOCK)[:, :, 8].astype(np.float64).repeat(256, axis=1)
    w = quantization("q4_k").dequantize(raw).reshape(n, k).astype(np.float64)
    zero = raw.copy().reshape(n, -1, 144)
    zero[:, :, 16:] = 0  # quants 0: what is left is -dmin m a value, which meets x's exact sums
    w0 = quantization("q4_k").dequantize(zero.reshape(raw.shape)).reshape(n, k).astype(np.float64)
    want = first @ (w - w0).T + x.astype(np.float64) @ w0.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T
    assert np.isfinite(y).all() and (np.abs(y - want) <= 1e-5 * scale + 1e-6).all()


# the wgmma order of a sub-block's 32 values: stored position 16 h + 8 e + 2 t + p holds value 8 t + 4 h + e + 2 p
_WG_ORDER = [8 * t + 4 * h + e + 2 * p for h in (0, 1) for e in (0, 1) for t in range(4) for p in (0, 1)]


@pytest.mark.parametrize("ks", [1, 2])
def test_wgmma_f16_gemm_of_several_weights_gives_each_alones_bits(rng, ks):
    """``gemm_wgmma_q4_k_f16`` with ``parts``: each weight's product the same bits as its own launch's."""
    from poot_ptx.kernels.wgmma_f16 import gemm_wgmma_q4_k_f16

    k, rows, wg, m, sizes = 512, 16, 1, 11, (128, 64, 64)
    raws, x = [_q4_k(rng, n, k) for n in sizes], _x(rng, m, k)
    b = {"xh": _halves_poisoned(m * k // 2), "xl": _halves_poisoned(m * k // 2), "xds": poisoned((m * k // 16,))}
    run = run_host if WGMMA else run_simt
    run(split_f16x2(k, order="wgmma"), (-(-m * k // 256 // (SPLIT_F16_THREADS // 32)),), {"x": x, **b}, {"m": m})
    total = sum(sizes)
    words = [raw.view(np.int32).reshape(-1) for raw in raws]
    ys = [poisoned((m, n)) for n in sizes]
    grid = (-(-m // rows), total // (64 * wg), ks)
    kern = gemm_wgmma_q4_k_f16(k, rows, wg, ks, True, parts=sizes)
    ws = {f"w{i}": w for i, w in enumerate(words)}
    if ks == 1:
        run(kern, grid, {**b, **ws, **{f"y{i}": y for i, y in enumerate(ys)}}, {"m": m, "n": total})
    else:
        scratch = poisoned((ks, m, total))
        run(kern, grid, {**b, **ws, "y": scratch}, {"m": m, "n": total})
        run(sum_parts(ks, sizes), (-(-m * total // 4 // 256),), {"p": scratch, **{f"y{i}": y for i, y in enumerate(ys)}}, {"count": m * total})
    for raw, w, y, n in zip(raws, words, ys, sizes, strict=True):
        _check(y, raw, x)
        alone = poisoned((ks, m, n))
        run(gemm_wgmma_q4_k_f16(k, rows, wg, ks, True), (grid[0], n // (64 * wg), ks), {**b, "w": w, "y": alone}, {"m": m, "n": n})
        one = alone[0]
        if ks > 1:
            one = poisoned((m, n))
            run(sum_parts(ks), (-(-m * n // 4 // 256),), {"p": alone, "y": one}, {"count": m * n})
        assert np.array_equal(y.view(np.int32), one.view(np.int32)), "a weight's product differs from its own launch's"


@pytest.mark.parametrize("args", [(4096, 64, 2, 1, True), (14336, 64, 2, 4, True), (4096, 32, 2, 2, True)], ids=str)
@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_wgmma_f16_gemm_compiles_to_warpgroup_products(args):
    """Four warpgroup products a sub-block (two steps of 16, two terms of x) with the weights'
    fragment in registers; with ptxas, no spills, no products serialized, a launchable workgroup."""
    from poot_ptx.kernels.wgmma_f16 import gemm_wgmma_q4_k_f16

    kern = gemm_wgmma_q4_k_f16(*args)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n") == 32 and "fma.rn.f16x2" in ptx and "mma.sync" not in ptx
    if find_ptxas():
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90a")
        assert spills == 0 and "serializ" not in out, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"
