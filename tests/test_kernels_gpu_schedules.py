"""The GPU schedules every GPU backend shares (warp-per-feature GEMVs with 16-byte loads, decode
attention a warp a position) and the norms that sum by subgroup reductions. The GEMVs need 32-lane
subgroups, the norms subgroup operations of any width: each runs where ``POOT_TEST_DEVICE`` names a
device that has what it needs (``cuda:0`` through ``scripts/gpu-check``; ``vulkan:0`` on an NVIDIA GPU
through ``scripts/vulkan-check``, or on lavapipe for the norms; ``null:sm_90a``, compiled and
assembled). NVIDIA's own kernels (tensor-core GEMMs and attention) are tested with poot-ptx."""

from __future__ import annotations

import numpy as np
import pytest

from poot.eval import evaluate
from poot.eval.attention import attention_reference
from poot.graph import GraphBuilder
from poot.graph.attention import AttentionSpec
from poot.kernel.library import attention as attn_lib
from poot.kernel.library.attention_gpu import attention_decode
from poot.kernel.library.linear_gpu import Q8_THREADS, gemv_warp, gemv_warp_packed, gemv_warp_q6_k, quantize_q8x2
from poot.quant import quantization
from poot.quant.bodies import BODIES, LUTS
from poot.testing.kernels import assert_f32_sum_close as _close
from poot.testing.kernels import features_under_test, paged_block_tables, poisoned, pools_as, q8x2_reference, run_host, split_reference
from poot.testing.kernels import random_bf16 as _bf16

SUBGROUP, MATRIX = features_under_test()
gpu_only = pytest.mark.skipif(SUBGROUP != 32, reason="needs 32-lane subgroups: set POOT_TEST_DEVICE=cuda:0 (or vulkan:0) on an NVIDIA GPU")
mma_only = pytest.mark.skipif(SUBGROUP != 32 or "mma.sync.bf16" not in MATRIX, reason="needs mma.sync: set POOT_TEST_DEVICE=cuda:0 on an NVIDIA GPU")
subgroups_only = pytest.mark.skipif(SUBGROUP < 2, reason="needs subgroup operations: set POOT_TEST_DEVICE to a GPU (or vulkan:0 on lavapipe)")
eight_lanes = pytest.mark.skipif(SUBGROUP < 8, reason="needs subgroups of 8 lanes or more: set POOT_TEST_DEVICE to a GPU (or vulkan:0 on lavapipe)")


def _q8_rows(x):
    """x as the Q4_K GEMV quantizes it (``q8x2_reference``: numpy, independently of the kernel):
    returns (x rebuilt as d (q1 + q2 / 254), the step of q2 per value)."""
    xq, xr, xds = q8x2_reference(x)
    d = np.repeat(xds.reshape(-1, 2)[:, 0].astype(np.float64), 32).reshape(x.shape)
    q1, q2 = (w.view(np.int8).reshape(x.shape).astype(np.float64) for w in (xq, xr))
    return d * (q1 + q2 / 254), d / 254


def _copies_refused(copied, wide, k, unroll=1, **kw):
    """Weights copied ahead (``gemv_warp``'s ``copied``) are built for wide lanes and whole steps
    (eight blocks a lane's ``unroll``): elsewhere the kernel is refused with a ValueError."""
    if copied and (not wide or copied * 8 * unroll > k // 256):
        with pytest.raises(ValueError, match="copied ahead"):
            gemv_warp("q4_k", k, 1, wide=wide, unroll=unroll, copied=copied, **kw)
        return True
    return False


def _q4_k_products(x, raw):
    """What the Q4_K warp GEMV computes for x and packed rows ``raw``: the quant sums against x
    as two int8 terms (``_q8_rows``) and the sub-block minimums against the exact x; the largest
    effect one value's second term rounding the other way could have; and the bound to the exact
    product (half a step of the second term per value)."""
    q = quantization("q4_k")
    w = q.dequantize(raw).astype(np.float64)
    zero = raw.copy().reshape(raw.shape[0], -1, 144)
    zero[:, :, 16:] = 0  # quants 0: what is left is -dmin * m per value
    w0 = q.dequantize(zero.reshape(raw.shape)).astype(np.float64)
    x64 = x.astype(np.float64)
    xh, d = _q8_rows(x)
    got = xh @ w.T - (xh - x64) @ w0.T  # = xh . (w - w0) + x . w0
    flip = d.max() * np.abs(w - w0).max() * 1.01
    bound = (d / 2) @ np.abs(w - w0).T * 1.01 + 1e-5 * (np.abs(x64) @ np.abs(w).T)
    return got, flip, bound, x64 @ w.T


@eight_lanes
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("k", [512, 1024 * 3, 2048])
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 3), (4, 6), (2, 2)])
def test_gemv_warp_q6_k_on_x_as_two_int8_terms(rng, k, mr, m, wide):
    """Q6_K rows (odd blocks straddling words) against x quantized to two int8 terms in workgroup
    memory, quants summed by dp4a (``wide``: 32 values a lane, even and odd blocks apart): what x
    rebuilt from its terms gives against gguf's dequantization (up to one second term rounding the
    other way), and within half a step of the second term per value of the exact product."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    step = (64 if wide else 16) * SUBGROUP
    if k % step:
        pytest.skip(f"a step of {SUBGROUP} lanes takes {step} values of K: not a divisor of {k}")
    n = 37
    raw = quantization("q6_k").quantize((rng.standard_normal((n, k)) * np.exp2(rng.integers(-4, 4, (n, 1)))).astype(np.float32))
    w = gq.dequantize(raw, GGMLQuantizationType.Q6_K).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, 32:64] = 0  # a block of zeros: scale 0, nothing divided by it
    y = poisoned((m, n))
    kern = gemv_warp_q6_k(k, mr, SUBGROUP, wide)
    run_host(
        kern,
        (-(-n // (kern.threads // SUBGROUP)), -(-m // mr)),
        {"x": x, "w": np.ascontiguousarray(raw).view(np.int32).reshape(-1), "y": y},
        {"m": m, "n": n, "row_bytes": raw.shape[1]},
    )
    xh, d = _q8_rows(x)
    _close(y, xh @ w.T, np.abs(x) @ np.abs(w).T, slack=d.max() * np.abs(w).max() * 1.01)
    bound = (d / 2) @ np.abs(w).T * 1.01 + 1e-5 * (np.abs(x) @ np.abs(w).T)
    assert (np.abs(y - x.astype(np.float64) @ w.T) <= bound).all(), "further from the exact product than two int8 terms allow"


@eight_lanes
@pytest.mark.parametrize("qtype", sorted(q for q in BODIES if BODIES[q][0] > 1))
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 3), (4, 6)])
def test_gemv_warp_for_every_packed_type(rng, qtype, mr, m):
    """A subgroup a feature over any packed type's rows (the type's dequantization body, eight
    values a lane), against float64 numpy on gguf's dequantization; for types of 32-value blocks K
    is not a multiple of a step's 8 x lanes values (the last step partial: the lanes past K add
    nothing); 256-value blocks fill whole steps up to 32 lanes."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    n, k = 37, (2 * 8 * SUBGROUP + 32 if BODIES[qtype][0] == 32 else 1280)
    raw = quantization(qtype).quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    w = gq.dequantize(raw, GGMLQuantizationType[qtype.upper()]).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    kern = gemv_warp_packed(qtype, k, mr, SUBGROUP)
    run_host(
        kern,
        (-(-n // (256 // SUBGROUP)), -(-m // mr)),
        {"x": x, "w": raw.reshape(-1), "lut": LUTS.get(qtype, np.zeros(1, np.float32)), "y": y},
        {"m": m, "n": n, "row_bytes": raw.shape[1]},
    )
    _close(y, x.astype(np.float64) @ w.T, np.abs(x) @ np.abs(w).T)


@gpu_only
@pytest.mark.parametrize("k", [256, 512, 1024 * 3])
@pytest.mark.parametrize(
    "mr,m,per_warp,prefetch",
    [(1, 1, 1, False), (4, 2, 1, False), (4, 4, 1, False), (4, 7, 1, False), (1, 1, 2, False), (4, 7, 3, False), (1, 1, 1, True), (4, 7, 3, True)],
)
def test_gemv_warp_bf16(rng, k, mr, m, per_warp, prefetch):
    n = 37  # not a multiple of the eight warps of a workgroup
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(
        gemv_warp("bf16", k, mr, per_warp=per_warp, prefetch=prefetch), (-(-n // (8 * per_warp)), -(-m // mr)), {"x": x, "w": bits, "y": y}, {"m": m, "n": n}
    )
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)


@gpu_only
@pytest.mark.parametrize("k", [512, 1024, 256 * 7])  # two blocks a row (guarded), four, seven
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 3)])
@pytest.mark.parametrize(
    "unroll,per_warp,wide,prefetch",
    [
        (None, 1, True, False),
        (2, 1, True, False),
        (None, 3, True, False),
        (1, 2, True, False),
        (2, 1, False, False),
        (4, 1, False, False),
        (1, 2, False, False),
        (None, 1, True, True),
        (2, 2, False, True),
    ],
)
def test_gemv_warp_q4_k(rng, k, mr, m, unroll, per_warp, wide, prefetch):
    """Lanes of 32 quant bytes a block (``wide``) or 16, ``unroll`` blocks a lane a step; with
    ``prefetch`` the rows asked for into the L2 first (21 rows: the last workgroup's warps past n
    ask for nothing)."""
    n = 21
    raw = quantization("q4_k").quantize(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :32] = 0  # a block of zeros: scale 0, nothing divided by it
    y = poisoned((m, n))
    kern = gemv_warp("q4_k", k, mr, unroll=unroll, per_warp=per_warp, wide=wide, prefetch=prefetch)
    run_host(kern, (-(-n // (kern.threads // 32 * per_warp)), -(-m // mr)), {"x": x, "w": np.ascontiguousarray(raw).view(np.int32), "y": y}, {"m": m, "n": n})
    want, flip, bound, exact = _q4_k_products(x, raw)
    _close(y, want, np.abs(x) @ np.abs(quantization("q4_k").dequantize(raw)).T, slack=flip)
    assert (np.abs(y - exact) <= bound).all(), "further from the exact product than two int8 terms allow"


@subgroups_only
@pytest.mark.parametrize("block,cols,add", [(1024, 4096, True), (1024, 4096, False), (256, 1000, True), (64, 77, False)])
def test_norms_sum_by_subgroup_reductions(rng, block, cols, add):
    """RMSNorm (and the residual add before it) with the sum of squares by subgroup reductions."""
    from poot.graph.compose import rms_norm as g_rms_norm
    from poot.kernel.library import norms

    rows = 3
    a, b = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(cols).astype(np.float32)
    y = poisoned((rows, cols))
    if add:
        h = poisoned((rows, cols))
        run_host(norms.add_rms_norm.instantiate(BLOCK=block, SUBGROUP=SUBGROUP), (rows,), {"a": a, "b": b, "w": w, "h": h, "y": y}, {"cols": cols, "eps": 1e-5})
        np.testing.assert_array_equal(h, a + b)
        x = a + b
    else:
        run_host(norms.rms_norm.instantiate(BLOCK=block, SUBGROUP=SUBGROUP), (rows,), {"x": a, "w": w, "y": y}, {"cols": cols, "eps": 1e-5})
        x = a
    g = GraphBuilder()
    want = evaluate(g.build({"y": g_rms_norm(g, g.input("x", "f32", [rows, cols]), g.weight("w", "f32", [cols]), 1e-5, False)}), {"x": x}, {"w": w})["y"]
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)


def check_q8x2(x, xq, xr, xds):
    """The quantizer's words against numpy's (``q8x2_reference``): q1 exact; q2 exact but where the
    device fused x - q1 d into one FMA and the product fell on a rounding tie (one step, rarely);
    each block's d close, and its sum of 32 values within what adding them in another order can
    change (31 roundings of partial sums at most the block's sum of |x|)."""
    wq, wr, wds = q8x2_reference(x)
    np.testing.assert_array_equal(xq.view(np.int8), wq.view(np.int8))
    off = np.abs(xr.view(np.int8).astype(np.int32) - wr.view(np.int8))
    assert off.max() <= 1 and (off > 0).mean() < 0.01, f"{(off > 0).sum()} second terms off, by up to {off.max()}"
    (d, sums), (wd, wsums) = xds.reshape(-1, 2).T, wds.reshape(-1, 2).T
    np.testing.assert_allclose(d, wd, rtol=1e-5, atol=1e-5)
    bound = 31 * 2.0**-24 * np.abs(x.astype(np.float64)).reshape(-1, 32).sum(axis=1) * 2  # both orders' roundings
    worst = np.abs(sums.astype(np.float64) - wsums)
    assert (worst <= bound).all(), f"block sums off by up to {worst.max():.3g} (bound {bound[worst.argmax()]:.3g})"


@eight_lanes
@pytest.mark.parametrize("k,add,unit_offset", [(4096, True, False), (4096, False, False), (256 * 5 * 4, True, True), (256, False, True)])
def test_norm_writes_its_output_quantized_for_the_gemvs(rng, k, add, unit_offset):
    """``rms_norm_q8``: the RMSNorm (the residual add before it, Gemma's 1 + w) against the graph
    evaluator's, and its output's two int8 terms against numpy's quantization of that output
    (``check_q8x2``), every word written; rows of 1,024 threads and of several words a thread."""
    from poot.graph.compose import rms_norm as g_rms_norm
    from poot.kernel.library.norms_gpu import rms_norm_q8

    rows = 3
    a, b = (rng.standard_normal((rows, k)).astype(np.float32) * 3 for _ in range(2))
    a[1, 64:96] = b[1, 64:96] = 0  # a block of zeros: scale 0
    w = rng.standard_normal(k).astype(np.float32)
    y, h = poisoned((rows, k)), poisoned((rows, k))
    xq, xr, xds = poisoned((rows * k // 4,), np.int32), poisoned((rows * k // 4,), np.int32), poisoned((rows * k // 16,))
    kern = rms_norm_q8(k, add, unit_offset, SUBGROUP)
    bufs = {"a": a, "b": b, "h": h} if add else {"x": a}
    run_host(kern, (rows,), {**bufs, "w": w, "y": y, "xq": xq, "xr": xr, "xds": xds}, {"eps": 1e-5})
    x = a + b if add else a
    if add:
        np.testing.assert_array_equal(h, x)
    g = GraphBuilder()
    want = evaluate(g.build({"y": g_rms_norm(g, g.input("x", "f32", [rows, k]), g.weight("w", "f32", [k]), 1e-5, unit_offset)}), {"x": x}, {"w": w})["y"]
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)
    assert np.isfinite(xds).all() and (xq != np.iinfo(np.int32).min).all() and (xr != np.iinfo(np.int32).min).all(), "a word was never written"
    check_q8x2(y, xq, xr, xds)


@eight_lanes
@pytest.mark.parametrize("m,k", [(1, 4096), (3, 256 * 7)])
def test_x_quantized_once_as_two_int8_terms(rng, m, k):
    """quantize_q8x2 (eight lanes a block of 32, sharing max and sum by shuffles) against numpy, with
    a block of zeros (scale 0) and values that are not small multiples of the scale."""
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, k // 32)).repeat(32, axis=1)).astype(np.float32)
    x[0, 32:64] = 0
    xq, xr, xds = poisoned((m * k // 4,), np.int32), poisoned((m * k // 4,), np.int32), poisoned((m * k // 16,))
    run_host(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, "xq": xq, "xr": xr, "xds": xds}, {"m": m})
    check_q8x2(x, xq, xr, xds)


def _x_for(x, staged):
    """The GEMV's x buffers: x itself, or (``staged``) x quantized once by ``quantize_q8x2``."""
    if not staged:
        return {"x": x}
    m, k = x.shape
    out = {"xq_in": poisoned((m * k // 4,), np.int32), "xr_in": poisoned((m * k // 4,), np.int32), "xds_in": poisoned((m * k // 16,))}
    run_host(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, "xq": out["xq_in"], "xr": out["xr_in"], "xds": out["xds_in"]}, {"m": m})
    return out


@gpu_only
@pytest.mark.parametrize("k", [512, 4096, 256 * 7])
@pytest.mark.parametrize("mr,m,warps,unroll", [(1, 1, 4, 2), (1, 1, 16, 4), (4, 3, 8, 2), (2, 5, 4, 1)])
@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("staged", [False, True, "early", "ahead", "pipelined", "copied"])
def test_gemv_warp_q4_k_on_x_quantized_once(rng, k, mr, m, warps, unroll, wide, staged):
    """x quantized once by its own kernel into global buffers, then the GEMV reading them from
    there (or, ``staged``, copying its rows into workgroup memory first; "early": its first step's
    weights loaded before the wait for the launch before, "ahead": after it, before x is staged,
    "pipelined": each step's loads issued before the step before is summed, "copied": its first
    step's weights copied into workgroup memory before the wait):
    the same values as the workgroup-memory version computes (numpy emulation) and the same bound;
    staged, bit for bit the sums of the GEMV that quantizes x itself."""
    early, ahead, pipelined, copied, staged = staged == "early", staged == "ahead", staged == "pipelined", int(staged == "copied"), bool(staged)
    if _copies_refused(copied, wide, k, unroll, staged=True):
        return
    n = 21
    raw = quantization("q4_k").quantize(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :32] = 0
    xq, xr, xds = poisoned((m * k // 4,), np.int32), poisoned((m * k // 4,), np.int32), poisoned((m * k // 16,))
    run_host(quantize_q8x2(k), (-(-m * k // 4 // Q8_THREADS),), {"x": x, "xq": xq, "xr": xr, "xds": xds}, {"m": m})
    assert np.isfinite(xds).all() and (xq != np.iinfo(np.int32).min).all(), "a quantized word was never written"
    y = poisoned((m, n))
    kern = gemv_warp(
        "q4_k", k, mr, warps, unroll=unroll, xglobal=not staged, staged=staged, wide=wide, early=early, ahead=ahead, pipelined=pipelined, copied=copied
    )
    sfx = "_in" if staged else ""
    w = np.ascontiguousarray(raw).view(np.int32)
    run_host(kern, (-(-n // warps), -(-m // mr)), {f"xq{sfx}": xq, f"xr{sfx}": xr, f"xds{sfx}": xds, "w": w, "y": y}, {"m": m, "n": n})
    if staged:
        itself = poisoned((m, n))
        run_host(gemv_warp("q4_k", k, mr, warps, unroll=unroll, wide=wide), (-(-n // warps), -(-m // mr)), {"x": x, "w": w, "y": itself}, {"m": m, "n": n})
        np.testing.assert_array_equal(y, itself)
    want, flip, bound, exact = _q4_k_products(x, raw)
    _close(y, want, np.abs(x) @ np.abs(quantization("q4_k").dequantize(raw)).T, slack=flip)
    assert (np.abs(y - exact) <= bound).all(), "further from the exact product than two int8 terms allow"


@gpu_only
@pytest.mark.parametrize(
    "k,n,shape",
    [
        (4096, 200, {"per_warp": 4, "min_groups": 2}),
        (4096, 600, {"per_warp": 16, "min_groups": 2}),
        (256 * 56, 40, {"pipelined": True, "min_groups": 2}),
        (4096, 70, {"min_groups": 3}),
        (4096, 200, {"per_warp": 4, "min_groups": 2, "copied": 2}),
        (256 * 56, 40, {"copied": 3, "min_groups": 2}),
        (4096, 70, {"min_groups": 3, "copied": 2}),
    ],
)
def test_the_planned_one_row_gemv_shapes_give_the_plain_kernels_sums(rng, k, n, shape):
    """The shapes the planner launches one-row staged Q4_K GEMVs in on Hopper (the output head's
    sixteen features a warp, and four as before; the down projection's pipelined steps; registers
    capped), and the same with the first steps' weights copied into workgroup memory before the
    wait (``copied``: not planned): bit for bit the sums of the plain staged kernel, every feature
    written (n not a multiple of a workgroup's features)."""
    x = rng.standard_normal((1, k)).astype(np.float32)
    w = np.ascontiguousarray(quantization("q4_k").quantize(rng.standard_normal((n, k)).astype(np.float32))).view(np.int32)
    xs = _x_for(x, True)
    kern = gemv_warp("q4_k", k, 1, staged=True, **shape)
    plain = gemv_warp("q4_k", k, 1, staged=True)
    y, want = poisoned((1, n)), poisoned((1, n))
    run_host(kern, (-(-n // (kern.threads // 32 * shape.get("per_warp", 1))), 1), {**xs, "w": w, "y": y}, {"m": 1, "n": n})
    run_host(plain, (-(-n // (plain.threads // 32)), 1), {**xs, "w": w, "y": want}, {"m": 1, "n": n})
    assert np.isfinite(y).all(), "a feature was never written"
    np.testing.assert_array_equal(y, want)


@gpu_only
@pytest.mark.parametrize(
    "k,n,warps,unit_offset,shape", [(4096, 256, 32, False, {"min_groups": 1}), (256 * 56, 160, 16, True, {"pipelined": True, "min_groups": 2})]
)
def test_a_gemv_that_adds_the_residual_quantizes_the_next_norms_input(rng, k, n, warps, unit_offset, shape):
    """``gemv_warp(..., q8=True, norm_next=True)`` (the RMSNorm after the product folded into it):
    y = res + the plain kernel's y, bit for bit; y * nw (Gemma's 1 + nw) quantized as
    ``quantize_q8x2`` writes it (``check_q8x2``); ``ss`` each workgroup's sum of y^2 over its 32
    features (within the order of 32 additions); every word written, in rows after the first too."""
    rows = 2
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = np.ascontiguousarray(quantization("q4_k").quantize(rng.standard_normal((n, k)).astype(np.float32))).view(np.int32)
    xs = _x_for(x, True)
    res, nw = (rng.standard_normal((rows, n)) * 3).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    kern = gemv_warp("q4_k", k, 1, warps, per_warp=32 // warps, staged=True, q8=True, norm_next=True, unit_offset=unit_offset, **shape)
    grid = (n // 32, rows)
    y, ss = poisoned((rows, n)), poisoned((rows, n // 32))
    yq, yr, yds = poisoned((rows * n // 4,), np.int32), poisoned((rows * n // 4,), np.int32), poisoned((rows * n // 16,))
    run_host(kern, grid, {**xs, "w": w, "y": y, "yq": yq, "yr": yr, "yds": yds, "res": res, "nw": nw, "ss": ss}, {"m": rows, "n": n})
    want = poisoned((rows, n))
    run_host(gemv_warp("q4_k", k, 1, staged=True), (n // 16, rows), {**xs, "w": w, "y": want}, {"m": rows, "n": n})
    np.testing.assert_array_equal(y, res + want)
    assert np.isfinite(yds).all() and (yq != np.iinfo(np.int32).min).all() and (yr != np.iinfo(np.int32).min).all(), "a word was never written"
    check_q8x2(y * ((1 + nw) if unit_offset else nw), yq, yr, yds)
    sq = (y.astype(np.float64) ** 2).reshape(rows, n // 32, 32).sum(axis=2)
    np.testing.assert_allclose(ss, sq, rtol=32 * 2.0**-23)


@gpu_only
@pytest.mark.parametrize("k,kind", [(4096, "one"), (4096, "parts"), (256 * 7, "glu"), (4096, "glu_q8"), (256 * 7, "one")])
def test_a_gemv_scales_its_sums_by_the_norm_of_x_from_partial_sums(rng, k, kind):
    """``gemv_warp(..., rms_in=G)``: x is the norm's input times its weights, quantized (what a
    ``norm_next`` product writes), and ``ss`` the row's G partial sums of squares; the sums are
    the plain kernel's scaled by rsqrt(sum(ss) / K + eps) (x's staged block scales are: before
    silu for a gated pair, checked against the two plain products), in rows after the first too; G
    of 128 and of 56 (not a multiple of the warp's 32 lanes). Refused for x read from global memory."""
    rows, n, eps = 2, 96, 1e-5
    groups = k // 32
    x = rng.standard_normal((rows, k)).astype(np.float32)
    ss = (rng.random((rows, groups)) * 40 + 1).astype(np.float32)
    scale = (1 / np.sqrt(ss.astype(np.float64).sum(axis=1) / k + eps))[:, None]
    raw = lambda: np.ascontiguousarray(quantization("q4_k").quantize(rng.standard_normal((n, k)).astype(np.float32))).view(np.int32)  # noqa: E731
    xs = _x_for(x, True)
    plain = lambda w, y: run_host(gemv_warp("q4_k", k, 1, staged=True), (n // 16, rows), {**xs, "w": w, "y": y}, {"m": rows, "n": n})  # noqa: E731
    got = poisoned((rows, n))
    with pytest.raises(ValueError, match="rms_in"):
        gemv_warp("q4_k", k, 1, xglobal=True, rms_in=groups)
    if kind == "one":
        w, want = raw(), poisoned((rows, n))
        plain(w, want)
        run_host(gemv_warp("q4_k", k, 1, staged=True, rms_in=groups), (n // 16, rows), {**xs, "ss": ss, "w": w, "y": got}, {"m": rows, "n": n, "eps": eps})
        np.testing.assert_allclose(got, want * scale, rtol=1e-5, atol=1e-5 * np.abs(want).max())  # (the scale applied to each block, not to the sum)
    elif kind == "parts":
        ws, wants = [raw() for _ in range(3)], [poisoned((rows, n)) for _ in range(3)]
        for w, want in zip(ws, wants):
            plain(w, want)
        gots = [poisoned((rows, n)) for _ in range(3)]
        run_host(
            gemv_warp("q4_k", k, 1, parts=(n, n, n), staged=True, rms_in=groups),
            (3 * n // 16, rows),
            {**xs, "ss": ss, **{f"w{i}": w for i, w in enumerate(ws)}, **{f"y{i}": g for i, g in enumerate(gots)}},
            {"m": rows, "n": 3 * n, "eps": eps},
        )
        for g, want in zip(gots, wants):
            np.testing.assert_allclose(g, want * scale, rtol=1e-5, atol=1e-5 * np.abs(want).max())  # (the scale applied to each block, not to the sum)
        got = np.concatenate(gots)
    else:
        wg, wu, yg, yu = raw(), raw(), poisoned((rows, n)), poisoned((rows, n))
        plain(wg, yg)
        plain(wu, yu)
        g, u = yg * scale, yu * scale
        want = g / (1 + np.exp(-g)) * u
        bufs, extra, grid = {**xs, "ss": ss, "wg": wg, "wu": wu, "y": got}, {}, (n // 16, rows)
        if kind == "glu_q8":
            yq, yr, yds = poisoned((rows * n // 4,), np.int32), poisoned((rows * n // 4,), np.int32), poisoned((rows * n // 16,))
            extra, grid = {"per_warp": 4, "q8": True}, (n // 32, rows)
            bufs.update(yq=yq, yr=yr, yds=yds)
        run_host(gemv_warp("q4_k", k, 1, 8 if extra else None, glu=True, staged=True, rms_in=groups, **extra), grid, bufs, {"m": rows, "n": n, "eps": eps})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        if extra:
            check_q8x2(got, yq, yr, yds)
    assert np.isfinite(got).all(), "a feature was never written"


@gpu_only
@pytest.mark.parametrize("k,n", [(4096, 64), (256 * 7, 96)])
@pytest.mark.parametrize("glu", [True, False])
@pytest.mark.parametrize("warps", [16, 8])
@pytest.mark.parametrize("ahead", [False, True, "pipelined", "copied"])
def test_gemv_also_writes_its_output_quantized_for_the_next_product(rng, k, n, glu, warps, ahead):
    """``gemv_warp(..., q8=True)`` (a workgroup a block of 32 features, ``per_warp`` of them a warp):
    y bit for bit the plain kernel's, and y's two int8 terms as ``quantize_q8x2`` writes them for
    that y (``check_q8x2``), every word written: what the down projection reads after the gated MLP;
    ``ahead``: the first feature's first weights loaded before x is staged, the same bits; or the
    steps pipelined, or the first feature's first step copied into workgroup memory before the wait:
    the same bits."""
    pipelined, copied, ahead = ahead == "pipelined", int(ahead == "copied"), ahead is True
    if _copies_refused(copied, True, k, glu=glu, staged=True):
        return
    x = rng.standard_normal((1, k)).astype(np.float32)
    raws = [quantization("q4_k").quantize(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(2 if glu else 1)]
    ws = {nm: np.ascontiguousarray(r).view(np.int32) for nm, r in zip(("wg", "wu") if glu else ("w",), raws)}
    per_warp = 32 // warps
    grid = (n // 32, 1)
    xs = _x_for(x, True)
    y, want = poisoned((1, n)), poisoned((1, n))
    yq, yr, yds = poisoned((n // 4,), np.int32), poisoned((n // 4,), np.int32), poisoned((n // 16,))
    run_host(
        gemv_warp("q4_k", k, 1, warps, glu=glu, per_warp=per_warp, staged=True, q8=True, ahead=ahead, pipelined=pipelined, copied=copied),
        grid,
        {**xs, **ws, "y": y, "yq": yq, "yr": yr, "yds": yds},
        {"m": 1, "n": n},
    )
    run_host(gemv_warp("q4_k", k, 1, warps, glu=glu, per_warp=per_warp, staged=True), grid, {**xs, **ws, "y": want}, {"m": 1, "n": n})
    np.testing.assert_array_equal(y, want)
    assert np.isfinite(yds).all() and (yq != np.iinfo(np.int32).min).all() and (yr != np.iinfo(np.int32).min).all(), "a word was never written"
    check_q8x2(y, yq, yr, yds)
    with pytest.raises(ValueError, match="warps x per_warp = 32"):
        gemv_warp("q4_k", k, 1, warps, glu=glu, staged=True, q8=True)


def test_two_values_rounded_to_bf16_and_packed(rng):
    """``PackBf16x2`` (one cvt.rn.bf16x2.f32 on NVIDIA, integer arithmetic elsewhere) gives numpy's
    nearest-even bf16 of each value, the first in the low half: ties, subnormals, large values."""
    from poot.graph import dtypes as dt
    from poot.kernel import ir as K

    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-130, 120, 4096))).astype(np.float32)
    x[:8] = np.array([0x3F808000, 0x3F818000, 0x00008000, 0x80018000, 0x7F7F0000, 0x3F80FFFF, 0, 0x80000000], np.uint32).view(
        np.float32
    )  # ties to even, subnormals, signed zero
    i = K.Ref("i", dt.i32)
    body = (
        K.Let("i", K.Bin("add", K.Bin("mul", K.Builtin("group_id", 0), K.Const(256, dt.i32)), K.Builtin("thread_id", 0))),
        K.If(
            K.Bin("lt", i, K.Const(1024, dt.i32)),
            (
                K.VecLoad(("a", "b", "c", "d"), "x", K.Bin("mul", i, K.Const(4, dt.i32)), dt.f32),
                K.Store("y", K.Bin("mul", i, K.Const(2, dt.i32)), K.PackBf16x2(K.Ref("a", dt.f32), K.Ref("b", dt.f32))),
                K.Store("y", K.Bin("add", K.Bin("mul", i, K.Const(2, dt.i32)), K.Const(1, dt.i32)), K.PackBf16x2(K.Ref("c", dt.f32), K.Ref("d", dt.f32))),
            ),
        ),
    )
    kern = K.Kernel("pack_bf16x2_test", (K.Buffer("x", dt.f32), K.Buffer("y", dt.i32, readonly=False)), body, (256, 1, 1), ())
    y = poisoned((2048,), np.int32)
    run_host(kern, (4,), {"x": x, "y": y})
    want = split_reference(x.reshape(1, -1))[:2048]
    assert (y == want).all(), f"{(y != want).sum()} words differ"


@gpu_only
@pytest.mark.parametrize("qtype", ["bf16", "q4_k"])
@pytest.mark.parametrize(
    "mr,m,per_warp,wide,flags",
    [
        (1, 1, 1, True, ""),
        (4, 3, 1, True, ""),
        (1, 1, 3, True, ""),
        (4, 3, 2, False, ""),
        (1, 1, 1, False, ""),
        (1, 1, 3, False, ""),
        (1, 1, 1, True, "pf"),
        (4, 3, 2, False, "pf"),
        (1, 1, 1, True, "pf xs"),
        (4, 3, 2, False, "xs"),
        (1, 1, 1, True, "xs early"),
        (4, 3, 1, False, "early"),
        (1, 1, 2, True, "xs ahead"),
        (4, 3, 3, False, "ahead"),
        (1, 1, 4, True, "xs pipe"),
        (1, 1, 2, False, "pipe"),
        (1, 1, 2, True, "xs copied"),
        (1, 1, 2, True, "copied"),
        (1, 1, 1, True, "xs copied"),
        (1, 1, 1, False, "copied"),
    ],
)
@pytest.mark.parametrize("k", [1024, 256 * 11])  # Q4_K: one step of a warp's blocks, or two (the second partial)
def test_gated_gemv_computes_silu_of_one_product_times_the_other(rng, qtype, mr, m, per_warp, wide, flags, k):
    """``flags``: "pf" the rows asked for first, "xs" x quantized once by its own kernel and staged,
    "early" the first step's weights loaded before the wait for the launch before, "ahead" after it,
    before x is staged or quantized (a warp's first feature's), "pipe" each step's loads issued
    before the step before is summed, "copied" a warp's first feature's first step copied into
    workgroup memory before the wait."""
    if (not wide or "xs" in flags or "early" in flags or "ahead" in flags or "pipe" in flags or "copied" in flags) and qtype != "q4_k":
        pytest.skip("lanes of 16 or 32 bytes, x quantized once and weights loaded early, ahead, pipelined or copied are Q4_K's")
    if _copies_refused(int("copied" in flags), wide, k, glu=True):
        return
    n = 29
    if qtype == "bf16":
        (wg, bg), (wu, bu) = _bf16(rng, (n, k)), _bf16(rng, (n, k))
    else:
        q = quantization("q4_k")
        rg, ru = (q.quantize(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(2))
        bg, bu = np.ascontiguousarray(rg).view(np.int32), np.ascontiguousarray(ru).view(np.int32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    kern = gemv_warp(
        qtype,
        k,
        mr,
        glu=True,
        per_warp=per_warp,
        wide=wide,
        prefetch="pf" in flags,
        staged="xs" in flags,
        early="early" in flags,
        ahead="ahead" in flags,
        pipelined="pipe" in flags,
        copied=int("copied" in flags),
    )
    run_host(kern, (-(-n // (kern.threads // 32 * per_warp)), -(-m // mr)), {**_x_for(x, "xs" in flags), "wg": bg, "wu": bu, "y": y}, {"m": m, "n": n})
    if qtype == "bf16":
        g, u = x.astype(np.float64) @ wg.T.astype(np.float64), x.astype(np.float64) @ wu.T.astype(np.float64)
    else:  # against x quantized to int8 as the kernel does (test_gemv_warp_q4_k bounds that)
        g, u = _q4_k_products(x, rg)[0], _q4_k_products(x, ru)[0]
    want = g / (1 + np.exp(-g)) * u
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@gpu_only
@pytest.mark.parametrize("qtype", ["bf16", "q4_k"])
@pytest.mark.parametrize(
    "mr,m,per_warp,wide,flags",
    [
        (1, 1, 1, True, ""),
        (4, 2, 1, True, ""),
        (1, 1, 2, True, ""),
        (4, 2, 3, True, ""),
        (1, 1, 1, False, ""),
        (4, 2, 3, False, ""),
        (1, 1, 1, True, "pf"),
        (4, 2, 3, True, "pf"),
        (1, 1, 1, True, "pf xs"),
        (4, 2, 3, True, "xs"),
        (1, 1, 1, True, "xs ahead"),
        (1, 1, 2, True, "xs ahead"),
        (4, 2, 3, False, "ahead"),
        (1, 1, 1, True, "xs pipe"),
        (4, 2, 3, False, "pipe"),
        (1, 1, 1, True, "xs copied"),
        (1, 1, 2, True, "xs copied"),
        (1, 1, 3, True, "copied"),
    ],
)
@pytest.mark.parametrize("k", [512, 256 * 11])
def test_one_gemv_launch_for_several_products_of_one_x(rng, qtype, mr, m, per_warp, wide, flags, k):
    """Parts of 24, 8 and 13 features: with several features a warp, one warp's features span parts.
    ``flags``: "pf" each warp asks for its rows (in whichever part) first; "xs" x quantized once and
    staged; "ahead" a warp's first feature's first weights loaded before x is staged or quantized;
    "pipe" each step's loads issued before the step before is summed; "copied" a warp's first
    feature's first step copied into workgroup memory before the wait."""
    if (not wide or "xs" in flags or "ahead" in flags or "pipe" in flags or "copied" in flags) and qtype != "q4_k":
        pytest.skip("lanes of 16 or 32 bytes, x quantized once and weights loaded early, ahead, pipelined or copied are Q4_K's")
    parts = (24, 8, 13)
    if _copies_refused(int("copied" in flags), wide, k, parts=parts):
        return
    q = quantization("q4_k")
    ws, bufs = [], {}
    for i, n in enumerate(parts):
        if qtype == "bf16":
            w, bits = _bf16(rng, (n, k))
        else:
            raw = q.quantize(rng.standard_normal((n, k)).astype(np.float32))
            w, bits = raw, np.ascontiguousarray(raw).view(np.int32)
        ws.append(w)
        bufs[f"w{i}"], bufs[f"y{i}"] = bits, poisoned((m, n))
    x = rng.standard_normal((m, k)).astype(np.float32)
    kern = gemv_warp(
        qtype,
        k,
        mr,
        parts=parts,
        per_warp=per_warp,
        wide=wide,
        prefetch="pf" in flags,
        staged="xs" in flags,
        ahead="ahead" in flags,
        pipelined="pipe" in flags,
        copied=int("copied" in flags),
    )
    run_host(kern, (-(-sum(parts) // (kern.threads // 32 * per_warp)), -(-m // mr)), {**_x_for(x, "xs" in flags), **bufs}, {"m": m, "n": sum(parts)})
    for i, w in enumerate(ws):
        if qtype == "bf16":
            _close(bufs[f"y{i}"], x.astype(np.float64) @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T)
        else:
            want, flip, _, _ = _q4_k_products(x, w)
            _close(bufs[f"y{i}"], want, np.abs(x) @ np.abs(q.dequantize(w)).T, slack=flip)


def _decode_case(rng, hq, hkv, d, bs=16):
    """Five sequences, one new token each, over contexts from 1 to 1,100 positions in shuffled blocks."""
    ctx = np.array([1, 37, 300, 1100, 64])
    nb, mb, tables = paged_block_tables(rng, ctx, bs)
    perm = rng.permutation(len(ctx))
    return (
        dict(
            q=rng.standard_normal((len(ctx), hq, d)).astype(np.float32),
            k=rng.standard_normal((nb, bs, hkv, d)).astype(np.float32),
            v=rng.standard_normal((nb, bs, hkv, d)).astype(np.float32),
            positions=(ctx - 1)[perm].astype(np.int32),
            seq_ids=perm.astype(np.int32),
            ctx_lens=ctx.astype(np.int32),
            block_tables=tables,
        ),
        bs,
        mb,
    )


def _merged(out, pm, pl, t, hq, d, splits):  # type: ignore[no-untyped-def]
    """The decode kernel's output: as written with one share, else its shares merged by ``attention_merge``."""
    if splits == 1:
        return out
    final = poisoned((t, hq, d))
    run_host(
        attn_lib.attention_merge.instantiate(SPLITS=splits, BLOCK=min(d, 128)),
        (t * hq,),
        {"part_acc": out, "part_m": pm, "part_l": pl, "out": final},
        {"dv": d},
    )
    return final


def _decode_reference(data, causal, window, softcap, scale):  # type: ignore[no-untyped-def]
    """The oracle's attention (``attention_reference``, which the graph evaluator runs) of a ``_decode_case``."""
    spec = AttentionSpec(paged=True, causal=causal, window=window or None, softcap=softcap or None, scale=scale)
    keys = ("q", "k", "v", "positions", "seq_ids", "ctx_lens", "block_tables")
    return attention_reference(spec, *(data[n] for n in keys))


@gpu_only
@pytest.mark.parametrize("splits", [1, 8])
@pytest.mark.parametrize("mask", ["causal", "window+softcap", "full"])
@pytest.mark.parametrize("d,hq,hkv", [(128, 8, 2), (64, 3, 3)])
@pytest.mark.parametrize("pt", ["f32", "f16"])
@pytest.mark.parametrize("warps", [4, 16])
def test_decode_attention_a_warp_per_position(rng, splits, mask, d, hq, hkv, pt, warps):
    """``attention_decode`` (one pass, or the context split in 8 and merged by ``attention_merge``;
    four warps a workgroup or sixteen) against the graph evaluator's attention over paged pools of
    f32 or f16 (halves widened as read), contexts of 1 to 1,100 positions; in one pass, the output
    also quantized for the dp4a GEMVs (``q8``)."""
    data, bs, mb = _decode_case(rng, hq, hkv, d)
    pools, data = pools_as(data, pt)
    t = len(data["seq_ids"])
    causal, window, softcap, scale = mask != "full", 300 if "window" in mask else 0, 2.5 if "softcap" in mask else 0.0, 0.3
    out = poisoned((t, hq, splits * d))
    pm, pl = poisoned((t * hq * splits,)), poisoned((t * hq * splits,))
    bufs = {
        "q": data["q"],
        **pools,
        "positions": data["positions"],
        "seq_ids": data["seq_ids"],
        "ctx_lens": data["ctx_lens"],
        "block_tables": data["block_tables"],
        "out": out,
        "part_m": pm,
        "part_l": pl,
    }
    run_host(
        attention_decode(d, causal, splits, pt, warps, softcap=softcap > 0),
        (t, hq, splits),
        bufs,
        {"hq": hq, "hkv": hkv, "dk": d, "dv": d, "dr": 0, "bs": bs, "mb": mb, "scale": scale, "window": window, "softcap": softcap},
    )
    out = _merged(out, pm, pl, t, hq, d, splits)
    want = _decode_reference(data, causal, window, softcap, scale)
    assert np.isfinite(out).all(), "an output element was never written"
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    if splits == 1:  # the output also as the dp4a GEMVs' two int8 terms: those of its own f32 output
        out8 = poisoned((t, hq, d))
        xq, xr, xds = poisoned((t * hq * d // 4,), np.int32), poisoned((t * hq * d // 4,), np.int32), poisoned((t * hq * d // 16,))
        run_host(
            attention_decode(d, causal, 1, pt, warps, q8=True, softcap=softcap > 0),
            (t, hq, 1),
            {**bufs, "out": out8, "xq": xq, "xr": xr, "xds": xds},
            {"hq": hq, "hkv": hkv, "dk": d, "dv": d, "dr": 0, "bs": bs, "mb": mb, "scale": scale, "window": window, "softcap": softcap},
        )
        np.testing.assert_array_equal(out8, out)
        assert np.isfinite(xds).all() and (xq != np.iinfo(np.int32).min).all() and (xr != np.iinfo(np.int32).min).all(), "a word was never written"
        check_q8x2(out8.reshape(t, hq * d), xq, xr, xds)


@gpu_only
@pytest.mark.parametrize("splits", [1, 8])
@pytest.mark.parametrize("mask", ["causal", "window+softcap"])
@pytest.mark.parametrize("d,hq,hkv,group", [(128, 8, 2, 4), (64, 12, 3, 2)])
@pytest.mark.parametrize("warps", [4, 16])
def test_decode_attention_grouped_heads(rng, splits, mask, d, hq, hkv, group, warps):
    """``attention_decode(group=G)``: a workgroup scores G query heads of one key/value head, each
    row loaded once for them, and gives each head the bits the one-head kernel gives it (the same
    sums in the same order), which match the graph evaluator's attention over paged f16 pools."""
    data, bs, mb = _decode_case(rng, hq, hkv, d)
    pools, data = pools_as(data, "f16")
    t = len(data["seq_ids"])
    causal, window, softcap = True, 300 if "window" in mask else 0, 2.5 if "softcap" in mask else 0.0
    sc = {"hq": hq, "hkv": hkv, "dk": d, "dv": d, "dr": 0, "bs": bs, "mb": mb, "scale": 0.3, "window": window, "softcap": softcap}
    ins = {"q": data["q"], **pools, **{n: data[n] for n in ("positions", "seq_ids", "ctx_lens", "block_tables")}}
    outs = []
    for g, heads in ((group, hq // group), (1, hq)):
        out, pm, pl = poisoned((t, hq, splits * d)), poisoned((t * hq * splits,)), poisoned((t * hq * splits,))
        run_host(
            attention_decode(d, causal, splits, "f16", warps, softcap=softcap > 0, group=g),
            (t, heads, splits),
            {**ins, "out": out, "part_m": pm, "part_l": pl},
            sc,
        )
        written = (out, pm, pl) if splits > 1 else (out,)  # (one share: no partial maxima or sums)
        assert all(np.isfinite(a).all() for a in written), f"group {g}: an output element was never written"
        outs.append((out, pm, pl))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
    out = _merged(*outs[0], t, hq, d, splits)
    np.testing.assert_allclose(out, _decode_reference(data, causal, window, softcap, 0.3), rtol=1e-4, atol=1e-5)


def test_decode_attention_group_refusals():
    """A group of heads other than 1, 2 or 4, or beside the quantized output, is refused by name."""
    with pytest.raises(ValueError, match="group of 1, 2 or 4"):
        attention_decode(128, group=3)
    with pytest.raises(ValueError, match="group of 1, 2 or 4"):
        attention_decode(128, group=8)
    with pytest.raises(ValueError, match="one head a workgroup"):
        attention_decode(128, q8=True, group=2)
