"""The Q4_K GEMM on integer tensor cores (``gemm_imma_q4_k``, ``mma.sync`` m16n8k32 s8) against
numpy: x quantized once by ``quantize_q8x2``, then the weights' quants against its two int8 terms.
The products run where ``POOT_TEST_DEVICE`` names a device with mma.sync (``cuda:0`` through
``scripts/gpu-check``); everywhere the kernel is compiled to PTX and its instructions checked."""

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

SUBGROUP, MATRIX = features_under_test()
mma_only = pytest.mark.skipif(SUBGROUP != 32 or "mma.sync.bf16" not in MATRIX, reason="needs mma.sync: set POOT_TEST_DEVICE=cuda:0 on an NVIDIA GPU")


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


def _terms(xq: np.ndarray, xr: np.ndarray, xds: np.ndarray, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """x rebuilt from ``quantize_q8x2``'s buffers (d (q1 + q2 / Q8_SPLIT), float64), and each value's
    second-term step d / Q8_SPLIT."""
    q1 = xq.view(np.int8).reshape(m, k).astype(np.float64)
    q2 = xr.view(np.int8).reshape(m, k).astype(np.float64)
    d = xds.reshape(m, k // 32, 2)[:, :, 0].astype(np.float64).repeat(32, axis=1)
    return d * (q1 + q2 / Q8_SPLIT), d / Q8_SPLIT


@mma_only
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
    """Every output written; within the f32-summation bound of what x rebuilt from its two int8
    terms gives against gguf's dequantization (the sub-block minimums against x's exact sums), and
    within half a second-term step per value of the exact product (``pipe``: each chunk's loads
    issued before the chunk before is summed)."""
    if k % (64 * wk):
        pytest.skip("K is not whole chunks for every warp")
    q = quantization("q4_k")
    raw = q.quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    x = (rng.standard_normal((m, k)) * rng.uniform(0.2, 5, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)
    xq, xr, xds = poisoned((m * k // 4,), np.int32), poisoned((m * k // 4,), np.int32), poisoned((m * k // 16,))
    run_host(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, "xq": xq, "xr": xr, "xds": xds}, {"m": m})
    y = poisoned((m, n))
    grid = (-(-m // (8 * rt)), -(-n // (16 * ft)))
    run_host(gemm_imma_q4_k(k, ft, rt, wk, un, pipe), grid, {"xq": xq, "xr": xr, "xds": xds, "w": raw.view(np.int32).reshape(-1), "y": y}, {"m": m, "n": n})
    assert np.isfinite(y).all(), "an output element was never written"
    w = q.dequantize(raw).reshape(n, k).astype(np.float64)
    zero = raw.copy().reshape(n, -1, 144)
    zero[:, :, 16:] = 0  # quants 0: what is left is -dmin m a value
    w0 = q.dequantize(zero.reshape(raw.shape)).reshape(n, k).astype(np.float64)
    xh, step = _terms(xq, xr, xds, m, k)
    x64 = x.astype(np.float64)
    want = xh @ (w - w0).T + x64 @ w0.T
    scale = np.abs(x64) @ np.abs(w).T
    bad = np.abs(y - want) > 1e-5 * scale + 1e-6
    assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off, worst {np.abs(y - want).max():.3g}"
    bound = (step / 2) @ np.abs(w - w0).T * 1.01 + 1e-5 * scale + 1e-6
    assert (np.abs(y - x64 @ w.T) <= bound).all(), "further from the exact product than two int8 terms allow"


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
