"""The GEMMs on integer tensor cores (``gemm_imma_q4_k``, ``gemm_imma_q4_k_xs``,
``gemm_imma_q6_k_xs``; ``mma.sync`` m16n8k32 s8) against numpy: x quantized once by
``quantize_q8x2``, then the weights' quants against its two int8 terms. The products run where ``POOT_TEST_DEVICE`` names a device with mma.sync
(``cuda:0`` through ``scripts/gpu-check``); elsewhere small cases run through the Kernel IR
interpreter (``simt``: the kernels' fragment layouts and indexing, not the hardware), and every
kernel is compiled to PTX and its instructions checked."""

from __future__ import annotations

import numpy as np
import pytest

from poot.codegen import compile_kernel
from poot.codegen.targets import target
from poot.kernel.build import Q8_SPLIT, Q8_THREADS, quantize_q8x2
from poot.quant import quantization
from poot.testing.kernels import features_under_test, poisoned, run_host
from poot_ptx.assembler import find_ptxas, ptxas_usage
from poot_ptx.kernels.imma import gemm_imma_q4_k
from poot_ptx.kernels.imma_xs import gemm_imma_q4_k_xs, gemm_imma_q6_k_xs
from poot_ptx.kernels.mma import sum_parts
from poot_ptx.simt import run_simt

SUBGROUP, MATRIX = features_under_test()
ON_DEVICE = SUBGROUP == 32 and "mma.sync.bf16" in MATRIX
mma_only = pytest.mark.skipif(not ON_DEVICE, reason="needs mma.sync: set POOT_TEST_DEVICE=cuda:0 on an NVIDIA GPU")


@pytest.mark.parametrize(
    "args", [(4096, 2, 1, 8, 2), (4096, 2, 2, 8, 2), (14336, 2, 2, 8, 2), (4096, 2, 4, 8, 1), (4096, 2, 2, 8, 1, True), (14336, 1, 2, 16, 1, True)], ids=str
)
@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_imma_gemm_compiles_to_integer_products(args):
    kern = gemm_imma_q4_k(*args)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    ft, rt = args[1], args[2]
    # two products (x's two terms) a sub-block, two sub-blocks a chunk, for each of a warp's tiles;
    # no bf16 products, and no integer-to-float conversion but one an output a sub-block
    n = ptx.count("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32")
    assert n > 0 and n % (4 * ft * rt) == 0 and "m16n8k16" not in ptx
    assert ptx.count("cvt.rn.f32.s32") == n // 2 * 4
    if find_ptxas():
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90a")
        assert spills == 0, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"


def _terms(xq: np.ndarray, xr: np.ndarray, xds: np.ndarray, m: int, k: int, terms: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """x rebuilt from ``quantize_q8x2``'s buffers (d (q1 + q2 / Q8_SPLIT), float64; ``terms`` 1: d q1),
    and each value's step in the last term kept (d / Q8_SPLIT; d)."""
    q1 = xq.view(np.int8).reshape(m, k).astype(np.float64)
    d = xds.reshape(m, k // 32, 2)[:, :, 0].astype(np.float64).repeat(32, axis=1)
    if terms == 1:
        return d * q1, d
    q2 = xr.view(np.int8).reshape(m, k).astype(np.float64)
    return d * (q1 + q2 / Q8_SPLIT), d / Q8_SPLIT


def _run(kern, grid, bufs, scalars) -> None:  # type: ignore[no-untyped-def]
    """On the device under test where it has mma.sync, else through the interpreter."""
    (run_host if ON_DEVICE else run_simt)(kern, grid, bufs, scalars)


def _q4_k_case(rng, m: int, n: int, k: int):  # type: ignore[no-untyped-def]
    """Random Q4_K weights [n, k] and x [m, k] (blocks of 32 at scales 0.2-5) quantized by
    ``quantize_q8x2``: (raw weights, x, {xq, xr, xds})."""
    raw = quantization("q4_k").quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    x = (rng.standard_normal((m, k)) * rng.uniform(0.2, 5, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)
    xq, xr, xds = poisoned((m * k // 4,), np.int32), poisoned((m * k // 4,), np.int32), poisoned((m * k // 16,))
    _run(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, "xq": xq, "xr": xr, "xds": xds}, {"m": m})
    return raw, x, {"xq": xq, "xr": xr, "xds": xds}


def _check_q4_k_product(y: np.ndarray, raw: np.ndarray, x: np.ndarray, xb: dict, terms: int = 2) -> None:
    """Every output written; within the f32-summation bound of what x rebuilt from its two int8
    terms (or its first, ``terms`` 1) gives against gguf's dequantization (the sub-block minimums
    against x's exact sums), and within half a last-term step per value of the exact product."""
    (m, k), n = x.shape, y.shape[1]
    q = quantization("q4_k")
    assert np.isfinite(y).all(), "an output element was never written"
    w = q.dequantize(raw).reshape(n, k).astype(np.float64)
    zero = raw.copy().reshape(n, -1, 144)
    zero[:, :, 16:] = 0  # quants 0: what is left is -dmin m a value
    w0 = q.dequantize(zero.reshape(raw.shape)).reshape(n, k).astype(np.float64)
    xh, step = _terms(xb["xq"], xb["xr"], xb["xds"], m, k, terms)
    x64 = x.astype(np.float64)
    want = xh @ (w - w0).T + x64 @ w0.T
    scale = np.abs(x64) @ np.abs(w).T
    bad = np.abs(y - want) > 1e-5 * scale + 1e-6
    assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off, worst {np.abs(y - want).max():.3g}"
    bound = (step / 2) @ np.abs(w - w0).T * 1.01 + 1e-5 * scale + 1e-6
    assert (np.abs(y - x64 @ w.T) <= bound).all(), f"further from the exact product than {terms} int8 terms allow"


@pytest.mark.parametrize(
    "k,ft,rt,wk,un,pipe",
    [
        (1024, 2, 1, 4, 2, False),
        (2048, 2, 2, 8, 2, False),
        (256 * 7, 1, 2, 1, 1, False),
        (256 * 56, 2, 2, 8, 2, False),
        (1024, 2, 4, 4, 1, False),
        (2048, 2, 2, 8, 1, True),
        (256 * 56, 1, 1, 16, 1, True),
    ],
)
@pytest.mark.parametrize("m,n", [(1, 37), (5, 64), (16, 33), (13, 100)])
def test_imma_gemm_sums_q4_k_quants_against_x_in_two_int8_terms(rng, k, ft, rt, wk, un, pipe, m, n):
    """``_check_q4_k_product`` (``pipe``: each chunk's loads issued before the chunk before is summed)."""
    if k % (64 * wk):
        pytest.skip("K is not whole chunks for every warp")
    if not ON_DEVICE and k > 2048:
        pytest.skip("through the interpreter the smaller cases only")
    raw, x, xb = _q4_k_case(rng, m, n, k)
    y = poisoned((m, n))
    grid = (-(-m // (8 * rt)), -(-n // (16 * ft)))
    _run(gemm_imma_q4_k(k, ft, rt, wk, un, pipe), grid, {**xb, "w": raw.view(np.int32).reshape(-1), "y": y}, {"m": m, "n": n})
    _check_q4_k_product(y, raw, x, xb)


def _summed_gives_the_same_bits(kern, grid: tuple[int, int, int], bufs: dict, scalars: dict, want: dict) -> None:
    """``kern`` (a K-split GEMM with ``summed``: the last of a tile's workgroups adds the parts)
    writes outputs ``want`` (name -> the array ``sum_parts`` gave) bit for bit, twice over the same
    arrival counts, which it leaves at zero for the next launch."""
    assert kern.name.endswith("_R"), kern.name
    counts = np.zeros(grid[0] * grid[1], np.int32)
    for _ in range(2):
        ys = {name: poisoned(a.shape) for name, a in want.items()}
        _run(kern, grid, {**bufs, **ys, "p": poisoned((grid[2], *next(iter(want.values())).shape[:1], scalars["n"])), "counts": counts}, scalars)
        for name, a in want.items():
            assert np.array_equal(ys[name].view(np.int32), a.view(np.int32)), f"{name}: the kernel's own sums differ from sum_parts'"
        assert not counts.any(), "arrival counts left for the next launch"


# (k, ft, rt, wn, ksplit, pipelined, m, n): on the device the planner's shapes at Llama-3-8B's widths
# too; through the interpreter small ones (a few workgroups), each regime of row tiles, K split and not
_XS_SMALL = [
    (512, 2, 1, 2, 1, False, 5, 40),
    (256, 1, 1, 4, 1, True, 8, 70),
    (1024, 2, 2, 2, 2, False, 13, 64),
    (1024, 1, 2, 2, 2, True, 16, 64),
    (768, 1, 4, 2, 3, True, 30, 36),
    (512, 1, 8, 2, 2, False, 64, 32),
    (512, 2, 8, 1, 1, True, 37, 20),
]
_XS_DEVICE = [
    (4096, 2, 1, 4, 4, True, 7, 6144),
    (14336, 2, 1, 4, 8, True, 8, 4096),
    (4096, 1, 2, 8, 2, True, 16, 14336),
    (14336, 1, 2, 8, 8, True, 9, 4096),
    (4096, 1, 4, 8, 1, True, 32, 14336),
    (4096, 1, 8, 8, 2, True, 64, 6144),
    (4096, 1, 8, 8, 1, False, 45, 2000),
]


@pytest.mark.parametrize("k,ft,rt,wn,ks,pipe,m,n", _XS_SMALL + (_XS_DEVICE if ON_DEVICE else []), ids=str)
@pytest.mark.parametrize("tensor_mins", [True, False], ids=["tf32-mins", "fma-mins"])
def test_imma_gemm_with_x_in_workgroup_memory_matches(rng, k, ft, rt, wn, ks, pipe, m, n, tensor_mins):
    """``gemm_imma_q4_k_xs``: ``_check_q4_k_product``; with K split, its parts added by ``sum_parts``
    in order, and by the kernel itself (``summed``) to the same bits; ``pipe``: each block's weights loaded during the block before. The block's mins one
    tf32 product a tile (planned at 33-64 rows), or a multiply-add an output a sub-block."""
    raw, x, xb = _q4_k_case(rng, m, n, k)
    parts = poisoned((ks, m, n))
    grid = (-(-m // (8 * rt)), -(-n // (16 * ft * wn)), ks)
    kern = gemm_imma_q4_k_xs(k, ft, rt, wn, ks, pipe, tensor_mins=tensor_mins)
    _run(kern, grid, {**xb, "w": raw.view(np.int32).reshape(-1), "y": parts}, {"m": m, "n": n})
    if ks == 1:
        y = parts[0]
    else:
        y = poisoned((m, n))
        _run(sum_parts(ks), (-(-m * n // 4 // 256),), {"p": parts, "y": y}, {"count": m * n})
        summed = gemm_imma_q4_k_xs(k, ft, rt, wn, ks, pipe, tensor_mins=tensor_mins, summed=True)
        _summed_gives_the_same_bits(summed, grid, {**xb, "w": raw.view(np.int32).reshape(-1)}, {"m": m, "n": n}, {"y": y})
    _check_q4_k_product(y, raw, x, xb)


@pytest.mark.parametrize(
    "k,ft,rt,wn,ks,pipe,m,n,tensor_mins",
    [(512, 2, 1, 2, 1, False, 5, 40, False), (1024, 1, 2, 2, 2, True, 16, 64, False), (512, 1, 8, 2, 2, False, 64, 32, True)]
    + ([(4096, 1, 2, 8, 4, True, 16, 6144, False), (4096, 1, 8, 8, 2, False, 64, 6144, True)] if ON_DEVICE else []),
    ids=str,
)
def test_imma_gemm_of_x_first_term_alone_matches(rng, k, ft, rt, wn, ks, pipe, m, n, tensor_mins):
    """``gemm_imma_q4_k_xs(terms=1)`` (matmul precision "medium"): ``_check_q4_k_product`` against x's
    first int8 term alone, with random words where the second term would be (never read)."""
    raw, x, xb = _q4_k_case(rng, m, n, k)
    xb["xr"] = rng.integers(-(2**31), 2**31, xb["xr"].shape, dtype=np.int64).astype(np.int32)
    parts = poisoned((ks, m, n))
    grid = (-(-m // (8 * rt)), -(-n // (16 * ft * wn)), ks)
    kern = gemm_imma_q4_k_xs(k, ft, rt, wn, ks, pipe, tensor_mins=tensor_mins, terms=1)
    assert kern.name.endswith("_T1") and all(sh.name != "xr_s" for sh in kern.shared)
    _run(kern, grid, {**xb, "w": raw.view(np.int32).reshape(-1), "y": parts}, {"m": m, "n": n})
    y = parts.sum(axis=0, dtype=np.float64) if ks > 1 else parts[0]
    _check_q4_k_product(y, raw, x, xb, terms=1)


# (k, ft, rt, wn, ksplit, pipelined, m, sizes): several products of one x in one launch (q, k, v);
# on the device Llama-3-8B's q, k and v at the planner's shapes too
_PARTS_SMALL = [
    (512, 1, 2, 2, 1, True, 13, (64, 32, 32)),
    (1024, 1, 1, 2, 2, False, 6, (32, 64)),
    (512, 1, 8, 1, 2, True, 40, (16, 32, 16)),
]
_PARTS_DEVICE = [
    (4096, 1, 2, 8, 4, True, 16, (4096, 1024, 1024)),
    (4096, 1, 8, 8, 1, True, 64, (4096, 1024, 1024)),
]


@pytest.mark.parametrize("k,ft,rt,wn,ks,pipe,m,sizes", _PARTS_SMALL + (_PARTS_DEVICE if ON_DEVICE else []), ids=str)
@pytest.mark.parametrize("tensor_mins", [False, True], ids=["fma-mins", "tf32-mins"])
def test_imma_gemm_of_several_weights_matches_each_alone(rng, k, ft, rt, wn, ks, pipe, m, sizes, tensor_mins):
    """``gemm_imma_q4_k_xs`` with ``parts``: each weight's product is ``_check_q4_k_product``'s, and
    the same bits as that weight's own launch (K split: its parts added and divided among the
    outputs by ``sum_parts(S, sizes)``)."""
    raws = [quantization("q4_k").quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32)) for n in sizes]
    x = (rng.standard_normal((m, k)) * rng.uniform(0.2, 5, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)
    xb = {"xq": poisoned((m * k // 4,), np.int32), "xr": poisoned((m * k // 4,), np.int32), "xds": poisoned((m * k // 16,))}
    _run(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, **xb}, {"m": m})
    total = sum(sizes)
    ws = {f"w{i}": raw.view(np.int32).reshape(-1) for i, raw in enumerate(raws)}
    ys = [poisoned((m, n)) for n in sizes]
    grid = (-(-m // (8 * rt)), total // (16 * ft * wn), ks)
    kern = gemm_imma_q4_k_xs(k, ft, rt, wn, ks, pipe, parts=tuple(sizes), tensor_mins=tensor_mins)
    if ks == 1:
        _run(kern, grid, {**xb, **ws, **{f"y{i}": y for i, y in enumerate(ys)}}, {"m": m, "n": total})
    else:
        scratch = poisoned((ks, m, total))
        _run(kern, grid, {**xb, **ws, "y": scratch}, {"m": m, "n": total})
        _run(sum_parts(ks, tuple(sizes)), (-(-m * total // 4 // 256),), {"p": scratch, **{f"y{i}": y for i, y in enumerate(ys)}}, {"count": m * total})
        summed = gemm_imma_q4_k_xs(k, ft, rt, wn, ks, pipe, parts=tuple(sizes), tensor_mins=tensor_mins, summed=True)
        _summed_gives_the_same_bits(summed, grid, {**xb, **ws}, {"m": m, "n": total}, {f"y{i}": y for i, y in enumerate(ys)})
    for raw, y, n in zip(raws, ys, sizes, strict=True):
        _check_q4_k_product(y, raw, x, xb)
        alone = poisoned((ks, m, n))
        _run(
            gemm_imma_q4_k_xs(k, ft, rt, wn, ks, pipe, tensor_mins=tensor_mins),
            (grid[0], n // (16 * ft * wn), ks),
            {**xb, "w": raw.view(np.int32).reshape(-1), "y": alone},
            {"m": m, "n": n},
        )
        if ks > 1:
            one = poisoned((m, n))
            _run(sum_parts(ks), (-(-m * n // 4 // 256),), {"p": alone, "y": one}, {"count": m * n})
        else:
            one = alone[0]
        assert np.array_equal(y.view(np.int32), one.view(np.int32)), "a weight's product differs from its own launch's"


@pytest.mark.parametrize(
    "args",
    [
        (4096, 2, 1, 4, 4, True),
        (4096, 2, 2, 8, 8),
        (14336, 1, 2, 8, 8, True),
        (4096, 1, 4, 8, 4, True),
        (4096, 1, 8, 8, 1),
        (14336, 1, 8, 8, 8),
        (4096, 1, 8, 8, 2, True),
    ],
    ids=str,
)
@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
@pytest.mark.parametrize("tensor_mins,terms", [(True, 2), (False, 2), (True, 1)], ids=["tf32-mins", "fma-mins", "tf32-mins-one-term"])
def test_imma_gemm_with_x_in_workgroup_memory_compiles_to_integer_products(args, tensor_mins, terms):
    """A product a sub-block a term of x for each tile, x's copies asynchronous, its fragments from
    workgroup memory; with ``tensor_mins`` two tf32 products a tile a block (x's sums in two
    terms); with ptxas, no spills and a launchable workgroup."""
    kern = gemm_imma_q4_k_xs(*args, tensor_mins=tensor_mins, terms=terms)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    ft, rt = args[1], args[2]
    n = ptx.count("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32")
    assert n == 4 * 2 * terms * ft * rt, n  # a block's 4 chunks, 2 sub-blocks, each term
    assert "cp.async.cg.shared.global" in ptx and ptx.count("ld.shared") >= 4 * 2 * rt * terms
    assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == (2 * ft * rt if tensor_mins else 0)
    unloaded = len(args) < 6 or not args[5]  # no block's weights loaded ahead
    if find_ptxas():
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90a")
        assert spills == 0, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"
        if tensor_mins and rt == 8 and unloaded:  # (the planner gives an SM two of these at 33-64 rows: IMMA_Q4_K)
            assert 2 * regs * kern.threads <= 65536, f"{regs} registers a thread: two workgroups of {kern.threads} no longer fit an SM"


@mma_only
@pytest.mark.parametrize("m,n", [(1, 512), (7, 14336), (16, 96)])
def test_glu_written_as_x_in_two_int8_terms(rng, m, n):
    """silu(g) * u quantized in the same pass (``glu_q8``): every word written, each block's scale
    the largest |value| / 127 and its sum the values' sum, and x rebuilt from the terms within half
    a second-term step of numpy's product."""
    from poot_ptx.kernels.imma import GLU_Q8_THREADS, glu_q8

    g = (rng.standard_normal((m, n)) * 3).astype(np.float32)
    u = rng.standard_normal((m, n)).astype(np.float32)
    xq, xr, xds = poisoned((m * n // 4,), np.int32), poisoned((m * n // 4,), np.int32), poisoned((m * n // 16,))
    run_host(glu_q8(n), (-(-m * n // GLU_Q8_THREADS),), {"g": g, "u": u, "xq": xq, "xr": xr, "xds": xds}, {"m": m})
    assert np.isfinite(xds).all() and (xq != np.iinfo(np.int32).min).all() and (xr != np.iinfo(np.int32).min).all(), "a word was never written"
    h = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    blocks = np.abs(h).reshape(m, n // 32, 32).max(axis=2)
    ds = xds.reshape(m, n // 32, 2)
    np.testing.assert_allclose(ds[:, :, 0], blocks / 127, rtol=1e-5)
    np.testing.assert_allclose(ds[:, :, 1], h.reshape(m, n // 32, 32).sum(axis=2), rtol=1e-4, atol=1e-4 * blocks.max())
    xh, step = _terms(xq, xr, xds, m, n)
    assert (np.abs(xh - h) <= step * 0.5 + 1e-5 * np.abs(h) + 1e-6).all(), "x rebuilt from its terms is off"


# (k, ft, rt, wn, ksplit, pipelined, m, n) for Q6_K (K a multiple of 512): odd and even blocks, each regime
_Q6_SMALL = [
    (512, 1, 1, 2, 1, False, 5, 32),
    (1024, 1, 2, 1, 2, True, 13, 48),
    (512, 2, 4, 1, 1, False, 30, 40),
    (1024, 1, 8, 1, 2, True, 64, 16),
]
_Q6_DEVICE = [
    (4096, 1, 1, 8, 4, True, 8, 6144),
    (14336, 1, 2, 8, 4, True, 16, 4096),
    (4096, 1, 8, 8, 1, True, 64, 1024),
]


@pytest.mark.parametrize(
    "k,ft,rt,wn,ks,pipe,m,n,terms",
    [(*c, 2) for c in _Q6_SMALL + (_Q6_DEVICE if ON_DEVICE else [])] + [(1024, 1, 2, 1, 2, True, 13, 48, 1), (1024, 1, 8, 1, 1, True, 64, 16, 1)],
    ids=str,
)
def test_imma_q6_k_gemm_matches(rng, k, ft, rt, wn, ks, pipe, m, n, terms):
    """``gemm_imma_q6_k_xs``: every output written; within the f32-summation bound of x rebuilt from
    its two int8 terms (``terms`` 1: its first, the second's words random and never read) against
    gguf's Q6_K dequantization, and within half a last-term step per value of the exact product; K
    split or not."""
    q = quantization("q6_k")
    raw = q.quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    x = (rng.standard_normal((m, k)) * rng.uniform(0.2, 5, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)
    xb = {"xq": poisoned((m * k // 4,), np.int32), "xr": poisoned((m * k // 4,), np.int32), "xds": poisoned((m * k // 16,))}
    _run(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, **xb}, {"m": m})
    if terms == 1:
        xb["xr"] = rng.integers(-(2**31), 2**31, xb["xr"].shape, dtype=np.int64).astype(np.int32)
    parts = poisoned((ks, m, n))
    grid = (-(-m // (8 * rt)), -(-n // (16 * ft * wn)), ks)
    _run(
        gemm_imma_q6_k_xs(k, ft, rt, wn, ks, pipe, terms=terms),
        grid,
        {**xb, "w": np.ascontiguousarray(raw).view(np.int32).reshape(-1), "y": parts},
        {"m": m, "n": n},
    )
    y = parts.sum(axis=0, dtype=np.float64) if ks > 1 else parts[0]
    assert np.isfinite(y).all(), "an output element was never written"
    w = q.dequantize(raw).reshape(n, k).astype(np.float64)
    xh, step = _terms(xb["xq"], xb["xr"], xb["xds"], m, k, terms)
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T
    bad = np.abs(y - xh @ w.T) > 1e-5 * scale + 1e-6
    assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off, worst {np.abs(y - xh @ w.T).max():.3g}"
    bound = (step / 2) @ np.abs(w).T * 1.01 + 1e-5 * scale + 1e-6
    assert (np.abs(y - x.astype(np.float64) @ w.T) <= bound).all(), f"further from the exact product than {terms} int8 terms allow"


@pytest.mark.parametrize("ks", [1, 2])
def test_imma_q6_k_gemm_of_several_weights_gives_each_alones_bits(rng, ks):
    """``gemm_imma_q6_k_xs`` with ``parts`` (the planner fuses Q6_K siblings too): each weight's
    product is the same bits as that weight's own launch, K split (its parts divided among the
    outputs by ``sum_parts(S, sizes)``) or not."""
    k, ft, rt, wn, m, sizes = 1024, 1, 2, 1, 13, (32, 16, 16)
    q = quantization("q6_k")
    raws = [q.quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32)) for n in sizes]
    x = (rng.standard_normal((m, k)) * rng.uniform(0.2, 5, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)
    xb = {"xq": poisoned((m * k // 4,), np.int32), "xr": poisoned((m * k // 4,), np.int32), "xds": poisoned((m * k // 16,))}
    _run(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, **xb}, {"m": m})
    total, width = sum(sizes), 16 * ft * wn
    words = [np.ascontiguousarray(raw).view(np.int32).reshape(-1) for raw in raws]
    ys = [poisoned((m, n)) for n in sizes]
    grid = (-(-m // (8 * rt)), total // width, ks)
    kern = gemm_imma_q6_k_xs(k, ft, rt, wn, ks, True, parts=sizes)
    if ks == 1:
        _run(kern, grid, {**xb, **{f"w{i}": w for i, w in enumerate(words)}, **{f"y{i}": y for i, y in enumerate(ys)}}, {"m": m, "n": total})
    else:
        scratch = poisoned((ks, m, total))
        _run(kern, grid, {**xb, **{f"w{i}": w for i, w in enumerate(words)}, "y": scratch}, {"m": m, "n": total})
        _run(sum_parts(ks, sizes), (-(-m * total // 4 // 256),), {"p": scratch, **{f"y{i}": y for i, y in enumerate(ys)}}, {"count": m * total})
        summed = gemm_imma_q6_k_xs(k, ft, rt, wn, ks, True, parts=sizes, summed=True)
        _summed_gives_the_same_bits(
            summed, grid, {**xb, **{f"w{i}": w for i, w in enumerate(words)}}, {"m": m, "n": total}, {f"y{i}": y for i, y in enumerate(ys)}
        )
    for w, y, n in zip(words, ys, sizes, strict=True):
        alone = poisoned((ks, m, n))
        _run(gemm_imma_q6_k_xs(k, ft, rt, wn, ks, True), (grid[0], n // width, ks), {**xb, "w": w, "y": alone}, {"m": m, "n": n})
        if ks > 1:
            one = poisoned((m, n))
            _run(sum_parts(ks), (-(-m * n // 4 // 256),), {"p": alone, "y": one}, {"count": m * n})
        else:
            one = alone[0]
        assert np.isfinite(y).all(), "an output element was never written"
        assert np.array_equal(y.view(np.int32), one.view(np.int32)), "a weight's product differs from its own launch's"


@pytest.mark.parametrize("args", [(4096, 1, 1, 8, 4, True), (14336, 1, 2, 8, 4, True), (4096, 1, 4, 8, 2, True), (4096, 1, 8, 8, 1, True)], ids=str)
@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_imma_q6_k_gemm_compiles_to_integer_products(args):
    """Four products a 32-value quarter for each tile (two 16-value halves, two terms of x); with
    ptxas, no spills and a launchable workgroup."""
    kern = gemm_imma_q6_k_xs(*args)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    ft, rt = args[1], args[2]
    assert ptx.count("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32") == 8 * 4 * ft * rt and "cp.async.cg.shared.global" in ptx
    if find_ptxas():
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90a")
        assert spills == 0, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"
