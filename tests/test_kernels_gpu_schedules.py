"""The GPU matrix schedules (warp-per-feature GEMVs with 16-byte loads; tensor-core GEMMs) and the
norms that sum by subgroup reductions. The GEMVs need 32-lane subgroups, the GEMMs mma.sync, the
norms subgroup operations of any width: each runs where ``POOT_TEST_DEVICE`` names a device that has
what it needs (``cuda:0`` through ``scripts/gpu-check``; ``vulkan:0`` on an NVIDIA GPU through
``scripts/vulkan-check``, or on lavapipe for the norms); everywhere they are compiled to PTX and their
instructions checked."""

from __future__ import annotations

import numpy as np
import pytest

from poot.codegen import compile_kernel
from poot.codegen.targets import target
from poot.eval import evaluate
from poot.graph import GraphBuilder
from poot.kernel.library import attention as attn_lib
from poot.kernel.library.attention_gpu import MMA_QROWS, attention_decode, attention_mma
from poot.kernel.library.linear_gpu import Q8_THREADS, gemv_warp, gemv_warp_packed, gemv_warp_q6_k, quantize_q8x2
from poot.kernel.library.linear_mma import SPLIT_THREADS, gemm_mma, gemm_warp, glu_split, split_bf16x2, sum_parts
from poot.quant import quantization
from poot.quant.bodies import BODIES, LUTS
from poot.testing.kernels import assert_f32_sum_close as _close
from poot.testing.kernels import bf16_round, features_under_test, find_ptxas, poisoned, ptxas_usage, q8x2_reference, run_host, split_reference
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


@pytest.mark.parametrize(
    "kern",
    [
        gemv_warp("bf16", 4096, 4),
        gemv_warp("q4_k", 14336, 1),
        gemv_warp_q6_k(14336, 1),
        gemv_warp_q6_k(4096, 4),
        gemv_warp_packed("q6_k", 4096, 1),
        gemv_warp_packed("q4_1", 576, 4),
        gemm_mma(4096),
        gemm_mma(4096, 1, 4, 1, 1),
        gemm_mma(4096, xsplit=True),
        gemm_mma(4096, 2, 4, 4, 4, xsplit=True),
        gemm_warp(4096),
        gemm_warp(14336, 2, 4, 8),
        gemm_warp(4096, xsplit=True),
        gemm_warp(14336, 2, 4, 8, xsplit=True),
        gemm_mma(4096, 2, 2, 4, 8, split=False, xsplit=True),
        gemm_warp(14336, 2, 4, 8, split=False, xsplit=True),
        attention_mma(128),
        attention_mma(64, False),
        attention_mma(128, True, False),
    ],
    ids=lambda k: k.name,
)
@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_schedules_compile_to_the_instructions_they_are_for(kern):
    ptx = compile_kernel(kern, target("nvptx:sm_90"), use_cache=False).data.decode()
    if kern.name.startswith("attention_"):
        assert "ld.global.nc.v4.b32" in ptx and "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx  # 16-byte key/value loads; tensor cores
    elif not kern.name.startswith(("gemv_warp_packed", "gemv_warp_q6_k")):  # (those read packed bytes and straddling words)
        assert "ld.global.nc.v4.b32" in ptx  # 16-byte weight loads through the read-only path
    if kern.name.startswith(("gemm_", "attention_")):
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    else:
        assert "shfl.sync.bfly" in ptx
    if "q4_k" in kern.name or "warp_q6_k" in kern.name:
        assert "dp4a.s32.s32" in ptx  # int8 activations against the quants
    if find_ptxas():  # registers and spills, where NVIDIA's assembler is installed
        _, spills, out = ptxas_usage(ptx.encode(), "sm_90")
        assert spills == 0, out


@eight_lanes
@pytest.mark.parametrize("k", [512, 1024 * 3])
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 3), (4, 6), (2, 2)])
def test_gemv_warp_q6_k_on_x_as_two_int8_terms(rng, k, mr, m):
    """Q6_K rows (odd blocks straddling words) against x quantized to two int8 terms in workgroup
    memory, quants summed by dp4a: what x rebuilt from its terms gives against gguf's dequantization
    (up to one second term rounding the other way), and within half a step of the second term per
    value of the exact product."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    n = 37
    raw = quantization("q6_k").quantize((rng.standard_normal((n, k)) * np.exp2(rng.integers(-4, 4, (n, 1)))).astype(np.float32))
    w = gq.dequantize(raw, GGMLQuantizationType.Q6_K).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, 32:64] = 0  # a block of zeros: scale 0, nothing divided by it
    y = poisoned((m, n))
    kern = gemv_warp_q6_k(k, mr, SUBGROUP)
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
    from poot.eval import evaluate
    from poot.graph import GraphBuilder
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
    from poot.eval import evaluate
    from poot.graph import GraphBuilder
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


@pytest.mark.parametrize("m,k", [(1, 8), (3, 96), (7, 4096), (130, 512)])
def test_x_split_once_into_two_bf16_terms(rng, m, k):
    """``split_bf16x2`` writes the nearest bf16 of each value and of its remainder, bit for bit as
    numpy rounds them, every word of both planes (runs everywhere: no subgroups needed)."""
    x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, k)))).astype(np.float32)
    xs = poisoned((m * k,), np.int32)
    run_host(split_bf16x2(k), (-(-m * k // 8 // SPLIT_THREADS),), {"x": x, "xs": xs}, {"m": m})
    want = split_reference(x)
    assert (xs == want).all(), f"{(xs != want).sum()} of {xs.size} words differ"
    hi, lo = (p.view(np.uint16).astype(np.uint32) << 16 for p in np.split(xs, 2))
    assert np.abs(hi.view(np.float32) + lo.view(np.float32) - x.reshape(-1)).max() <= np.abs(x).max() * 2.0**-16


@pytest.mark.parametrize("terms", [1, 2])
@pytest.mark.parametrize("m,n", [(1, 8), (5, 768), (70, 14336)])
def test_gated_product_written_as_its_bf16_terms(rng, terms, m, n):
    """``glu_split``: silu(g) * u straight into the planes a tensor-core GEMM reads (runs everywhere).
    Against numpy's product: the hi plane within bf16's rounding of it, hi + lo within 2^-16 (two
    terms), every word written and nothing past the planes."""
    g = (rng.standard_normal((m, n)) * 3).astype(np.float32)
    u = rng.standard_normal((m, n)).astype(np.float32)
    xs = poisoned((m * n,), np.int32)
    guard = xs[m * n * terms // 2 :].copy()
    run_host(glu_split(n, terms), (-(-m * n // 8 // SPLIT_THREADS),), {"g": g, "u": u, "xs": xs}, {"m": m})
    want = (g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u).reshape(-1)
    hi = (xs[: m * n // 2].view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert (np.abs(hi - want) <= np.abs(want) * 2.0**-8 + 1e-30).all()
    if terms == 2:
        lo = (xs[m * n // 2 :].view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        assert (np.abs(hi + lo - want) <= np.abs(want) * 2.0**-16 + 1e-30).all()
    else:
        assert (xs[m * n // 2 :] == guard).all(), "wrote past the hi plane"


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


@pytest.mark.parametrize("m,k", [(1, 8), (7, 4096), (130, 512)])
def test_x_rounded_once_to_bf16(rng, m, k):
    """``split_bf16x2(k, 1)`` (matmul precision "medium") writes the hi plane only: numpy's nearest
    bf16 of each value, every word, and nothing past the plane."""
    x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, k)))).astype(np.float32)
    xs = poisoned((m * k,), np.int32)
    guard = xs[m * k // 2 :].copy()
    run_host(split_bf16x2(k, 1), (-(-m * k // 8 // SPLIT_THREADS),), {"x": x, "xs": xs}, {"m": m})
    want = split_reference(x)[: m * k // 2]
    assert (xs[: m * k // 2] == want).all(), f"{(xs[: m * k // 2] != want).sum()} of {want.size} words differ"
    assert (xs[m * k // 2 :] == guard).all(), "wrote past the hi plane"


@pytest.mark.parametrize("parts,count", [(2, 4), (4, 1000), (8, 4096 * 3 + 4)])
def test_sum_parts_adds_a_split_products_parts(rng, parts, count):
    p = rng.standard_normal(parts * count).astype(np.float32)
    y = poisoned((count,))
    run_host(sum_parts(parts), (-(-count // 4 // SPLIT_THREADS),), {"p": p, "y": y}, {"count": count})
    want = p[:count].copy()
    for s in range(1, parts):  # in the kernel's order: bit for bit
        want += p[s * count : (s + 1) * count]
    assert (y == want).all()


@mma_only
@pytest.mark.parametrize("parts", [2, 8])
@pytest.mark.parametrize("m,n,k", [(17, 72, 512), (64, 136, 4096), (40, 24, 14336)])
def test_gemm_mma_split_along_k_then_summed(rng, parts, m, n, k):
    """Few rows: K split among workgroups, each part stored apart and added by ``sum_parts``."""
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    part = poisoned((parts, m, n))
    run_host(
        gemm_mma(k, 2, 4, 2, 4, xsplit=True, ksplit=parts),
        (-(-n // 128), -(-m // 64), parts),
        {"xs": split_reference(x), "w": bits, "y": part},
        {"m": m, "n": n},
    )
    y = poisoned((m, n))
    run_host(sum_parts(parts), (-(-m * n // 4 // SPLIT_THREADS),), {"p": part, "y": y}, {"count": m * n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)
    kp = k // parts  # each part is its own slice of K
    _close(part[1], x[:, kp : 2 * kp].astype(np.float64) @ w[:, kp : 2 * kp].T.astype(np.float64), np.abs(x[:, kp : 2 * kp]) @ np.abs(w[:, kp : 2 * kp]).T)


@mma_only
@pytest.mark.parametrize("shape", [(2, 2, 2, 4), (1, 4, 1, 1), (2, 4, 4, 4), (2, 2, 4, 8), (2, 4, 4, 8)])
@pytest.mark.parametrize("xsplit", [False, True])
@pytest.mark.parametrize("m,n,k", [(5, 37, 96), (70, 72, 128), (16, 64, 4096), (200, 300, 256)])
def test_gemm_mma_keeps_about_16_bits_of_each_activation(rng, shape, xsplit, m, n, k):
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    wm, wn, tm, tn = shape
    xb = {"xs": split_reference(x)} if xsplit else {"x": x}
    run_host(gemm_mma(k, *shape, xsplit=xsplit), (-(-n // (8 * wn * tn)), -(-m // (16 * wm * tm))), {**xb, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)
    # rounding the activations to bf16 instead would be ~100x further off: the split is what holds the bound
    rounded = bf16_round(x).astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(rounded - want).max() > 10 * np.abs(y - want).max()


@mma_only
@pytest.mark.parametrize("gemm", ["mma 2x2 4x8", "mma 2x4 4x8", "mma 2x2 2x4", "warp 1x4 W8", "warp 2x4 W8", "warp 1x4 W16"])
@pytest.mark.parametrize("m,n,k", [(5, 37, 512), (70, 72, 1024), (16, 64, 4096), (200, 300, 512)])
def test_gemms_on_x_rounded_to_bf16(rng, gemm, m, n, k):
    """Matmul precision "medium": x rounded to bf16 once, one tensor-core product. Every product of
    bf16 values is exact in f32, so the result is the f32 sum of x rounded times w (tested at the
    f32-summation bound), and further from the exact product than the split one would be."""
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    xs = split_reference(x)[: m * k // 2].copy()
    kind, a, b = gemm.split()
    if kind == "mma":
        (wm, wn), (tm, tn) = (tuple(map(int, v.split("x"))) for v in (a, b))
        grid = (-(-n // (8 * wn * tn)), -(-m // (16 * wm * tm)))
        run_host(gemm_mma(k, wm, wn, tm, tn, split=False, xsplit=True), grid, {"xs": xs, "w": bits, "y": y}, {"m": m, "n": n})
    else:
        mt, tn = map(int, a.split("x"))
        run_host(
            gemm_warp(k, mt, tn, int(b[1:]), split=False, xsplit=True), (-(-m // (16 * mt)), -(-n // (8 * tn))), {"xs": xs, "w": bits, "y": y}, {"m": m, "n": n}
        )
    rounded = bf16_round(x).astype(np.float64) @ w.T.astype(np.float64)
    _close(y, rounded, np.abs(x) @ np.abs(w).T)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(y - exact).max() > 10 * np.abs(y - rounded).max()  # it did round x


@mma_only
@pytest.mark.parametrize("mt,tn,wk", [(1, 4, 8), (2, 4, 8), (1, 2, 2)])
@pytest.mark.parametrize("xsplit", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 37, 512), (9, 64, 1024), (16, 40, 2048), (23, 33, 512)])
def test_gemm_warp_streams_weights_through_tensor_cores(rng, mt, tn, wk, xsplit, m, n, k):
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    xb = {"xs": split_reference(x)} if xsplit else {"x": x}
    run_host(gemm_warp(k, mt, tn, wk, xsplit=xsplit), (-(-m // (16 * mt)), -(-n // (8 * tn))), {**xb, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)


@mma_only
@pytest.mark.parametrize("mt,tn,wk,k", [(1, 4, 8, 1024), (2, 4, 8, 2048), (1, 2, 2, 1024), (1, 4, 16, 14336)])  # 16 warps: the planner's for long rows
@pytest.mark.parametrize("split,xsplit", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("m,n", [(1, 37), (9, 64), (23, 33)])
def test_gemm_warp_dequantizes_q4_k_weights_in_registers(rng, mt, tn, wk, k, split, xsplit, m, n):
    """Q4_K weights streamed and dequantized to bf16 in registers: the same bits as the bf16 GEMM on
    the weights ``dequantize_bf16`` writes, and within the f32-summation bound of x (as two bf16
    terms, or rounded) times the nearest bf16 of gguf's dequantization."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    from poot.kernel.library.dequant_gpu import dequant_groups, dequantize_bf16

    raw = quantization("q4_k").quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    w = bf16_round(gq.dequantize(raw, GGMLQuantizationType.Q4_K).reshape(n, k).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    xb = {"xs": split_reference(x) if split else split_reference(x)[: m * k // 2].copy()} if xsplit else {"x": x}
    grid = (-(-m // (16 * mt)), -(-n // (8 * tn)))
    y = poisoned((m, n))
    run_host(gemm_warp(k, mt, tn, wk, split=split, xsplit=xsplit, qtype="q4_k"), grid, {**xb, "w": raw.view(np.int32).reshape(-1), "y": y}, {"m": m, "n": n})
    wd = poisoned((n * k // 2,), np.int32)
    run_host(dequantize_bf16("q4_k", k), (dequant_groups("q4_k", n, k),), {"w": raw.view(np.int32).reshape(-1), "wd": wd}, {"n": n})
    same = poisoned((m, n))
    run_host(gemm_warp(k, mt, tn, wk, split=split, xsplit=xsplit), grid, {**xb, "w": wd, "y": same}, {"m": m, "n": n})
    assert (y.view(np.int32) == same.view(np.int32)).all(), f"{(y != same).sum()} outputs differ from the bf16 GEMM on the dequantized weights"
    xr = x if split else bf16_round(x)
    _close(y, xr.astype(np.float64) @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T)


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


def _block_tables(rng, ctx, bs):
    """Block tables for contexts ``ctx`` over shuffled blocks of ``bs`` (two spare): (blocks, table width, tables)."""
    nblk = [(c + bs - 1) // bs for c in ctx]
    nb, mb = sum(nblk) + 2, max(nblk) + 1
    order, tables, at = rng.permutation(nb), np.zeros((len(ctx), mb), np.int32), 0
    for s in range(len(ctx)):
        tables[s, : nblk[s]] = order[at : at + nblk[s]]
        at += nblk[s]
    return nb, mb, tables


def _prefill_case(rng, hq, hkv, d, bs=16):
    """Three sequences' prompts (some long, some resuming a context) over shuffled blocks of KV
    pools; the tokens are shuffled too, so blocks of 64 query tokens mix sequences."""
    ctx = np.array([150, 37, 90])
    new = np.array([150, 5, 70])
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(new)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, new)]).astype(np.int32)
    perm = rng.permutation(len(seq_ids))
    nb, mb, tables = _block_tables(rng, ctx, bs)
    t = len(seq_ids)
    return (
        dict(
            q=rng.standard_normal((t, hq, d)).astype(np.float32),
            k=rng.standard_normal((nb, bs, hkv, d)).astype(np.float32),
            v=rng.standard_normal((nb, bs, hkv, d)).astype(np.float32),
            positions=positions[perm],
            seq_ids=seq_ids[perm],
            ctx_lens=ctx.astype(np.int32),
            block_tables=tables,
        ),
        bs,
        mb,
    )


def _pools_as(data: dict, pt: str) -> tuple[dict, dict]:
    """(the kernel's pools, the case with its pools as the kernel reads them, widened to f32): f16
    pools hold the case's values rounded to halves, which the reference then takes exactly."""
    if pt == "f32":
        return {"k_pool": data["k"], "v_pool": data["v"], "ks_pool": np.zeros(1, np.float32)}, data
    k, v = data["k"].astype(np.float16), data["v"].astype(np.float16)
    return {"k_pool": k, "v_pool": v, "ks_pool": np.zeros(1, np.float16)}, {**data, "k": k.astype(np.float32), "v": v.astype(np.float32)}


@mma_only
@pytest.mark.parametrize("mask", ["causal", "window+softcap", "full"])
@pytest.mark.parametrize("d,hq,hkv", [(128, 4, 1), (64, 6, 2)])
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("pt", ["f32", "f16"])
def test_prefill_attention_on_tensor_cores(rng, mask, d, hq, hkv, bs, pt):
    """``attention_mma`` (q k^T and P v on tensor cores, both sides split into two bf16 terms) against
    the graph evaluator's attention, over paged pools of f32 or f16 (halves widened as read),
    several sequences a block."""

    data, bs, mb = _prefill_case(rng, hq, hkv, d, bs)
    pools, data = _pools_as(data, pt)
    t = len(data["seq_ids"])
    causal, window, softcap, scale = mask != "full", 40 if "window" in mask else 0, 2.5 if "softcap" in mask else 0.0, 0.3
    out = poisoned((t, hq, d))
    bufs = {
        "q": data["q"],
        **pools,
        "positions": data["positions"],
        "seq_ids": data["seq_ids"],
        "ctx_lens": data["ctx_lens"],
        "block_tables": data["block_tables"],
        "out": out,
    }
    scalars = {"ntok": t, "hq": hq, "hkv": hkv, "dk": d, "dv": d, "dr": 0, "bs": bs, "mb": mb, "scale": scale, "window": window, "softcap": softcap}
    run_host(attention_mma(d, causal, pt=pt), (-(-t // MMA_QROWS), hq), bufs, scalars)
    # as plans build it: the pools' block size fixed in the kernel (tiles read the table once a block), soft-capping only where the model has it
    fixed = poisoned((t, hq, d))
    run_host(attention_mma(d, causal, block=bs, softcap=softcap > 0, pt=pt), (-(-t // MMA_QROWS), hq), {**bufs, "out": fixed}, scalars)

    def reference(d_):  # type: ignore[no-untyped-def]
        b = GraphBuilder()
        ins = {n: b.input(n, "f32" if a.dtype == np.float32 else "i32", list(a.shape)) for n, a in d_.items()}
        y = b.attention(
            ins["q"],
            ins["k"],
            ins["v"],
            positions=ins["positions"],
            seq_ids=ins["seq_ids"],
            ctx_lens=ins["ctx_lens"],
            block_tables=ins["block_tables"],
            causal=causal,
            window=window or None,
            softcap=softcap or None,
            scale=scale,
        )
        return evaluate(b.build({"y": y}), d_)["y"].astype(np.float64)

    want = reference(data)
    assert np.isfinite(out).all() and np.isfinite(fixed).all(), "an output element was never written"
    assert np.abs(fixed - want).max() < 3e-4, f"fixed block size: max error {np.abs(fixed - want).max():.3g}"
    err = np.abs(out - want)
    # about 16 bits of each operand: a score is off by ~1e-5 (the dropped lo x lo terms), an output by a few times that
    assert err.max() < 3e-4 and err.mean() < 5e-6, f"max error {err.max():.3g}, mean {err.mean():.3g}"
    # q and k rounded to bf16 instead (one product) would be far off: the split is what holds the bound
    rounded = {**data, **{n: bf16_round(data[n]) for n in ("q", "k")}}
    assert np.abs(reference(rounded) - want).max() > 10 * err.max()

    # matmul precision "medium": q, k, v and P rounded to bf16, one product each. Against attention
    # over q, k and v rounded: what is left is P's rounding (2^-9 of each weight) and f32 order
    out1 = poisoned((t, hq, d))
    run_host(attention_mma(d, causal, split=False, block=bs, softcap=softcap > 0, pt=pt), (-(-t // MMA_QROWS), hq), {**bufs, "out": out1}, scalars)
    assert np.isfinite(out1).all(), "an output element was never written"
    want1 = reference({**data, **{n: bf16_round(data[n]) for n in ("q", "k", "v")}})
    err1 = np.abs(out1 - want1)
    assert err1.max() < 8e-3 and err1.mean() < 5e-4, f"max error {err1.max():.3g}, mean {err1.mean():.3g}"


@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
@pytest.mark.parametrize(
    "kern",
    [attention_decode(128, True, 1, "f16"), attention_decode(64, True, 8, "f16"), attention_mma(128, pt="f16"), attention_mma(64, True, False, pt="f16")],
    ids=lambda k: k.name,
)
def test_gpu_attention_reads_f16_pools_as_halves(kern):
    """The warp decode attention and the tensor-core prefill attention over f16 pools: keys and values
    loaded as halves (four a load) and widened, within ptxas's registers (no spills); a pool type
    other than f32 or f16 is refused by name."""
    ptx = compile_kernel(kern, target("nvptx:sm_90"), use_cache=False).data.decode()
    assert "ld.global.nc.v4.b16" in ptx or "ld.global.nc.v2.b16" in ptx
    assert "cvt.f32.f16" in ptx
    if find_ptxas():
        _, spills, out = ptxas_usage(ptx.encode(), "sm_90")
        assert spills == 0, out
    with pytest.raises(ValueError, match="f32 or f16"):
        attention_decode(128, pt="bf16")


def _decode_case(rng, hq, hkv, d, bs=16):
    """Five sequences, one new token each, over contexts from 1 to 1,100 positions in shuffled blocks."""
    ctx = np.array([1, 37, 300, 1100, 64])
    nb, mb, tables = _block_tables(rng, ctx, bs)
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
    pools, data = _pools_as(data, pt)
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
    if splits > 1:
        final = poisoned((t, hq, d))
        run_host(
            attn_lib.attention_merge.instantiate(SPLITS=splits, BLOCK=min(d, 128)),
            (t * hq,),
            {"part_acc": out, "part_m": pm, "part_l": pl, "out": final},
            {"dv": d},
        )
        out = final
    b = GraphBuilder()
    ins = {n: b.input(n, "f32" if a.dtype == np.float32 else "i32", list(a.shape)) for n, a in data.items()}
    y = b.attention(
        ins["q"],
        ins["k"],
        ins["v"],
        positions=ins["positions"],
        seq_ids=ins["seq_ids"],
        ctx_lens=ins["ctx_lens"],
        block_tables=ins["block_tables"],
        causal=causal,
        window=window or None,
        softcap=softcap or None,
        scale=scale,
    )
    want = evaluate(b.build({"y": y}), data)["y"]
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


def _llama3_8b_one_row_gemvs() -> list:
    """The one-row Q4_K GEMVs the planner launches for Llama-3-8B's decode on Hopper (its launch
    shapes, ``matmul._one_row_shape``; q/k/v in one launch, the gated MLP writing down's x
    quantized): (the kernel's maker, workgroups an SM it is capped for, 0 where it is not)."""
    from functools import partial

    from poot.plan.fused_gemv import GLU_Q8_WARPS, PARTS_ONE_ROW_GROUPS
    from poot.plan.matmul import _one_row_shape

    out = [
        (partial(gemv_warp, "q4_k", 4096, 1, parts=(4096, 1024, 1024), staged=True, min_groups=PARTS_ONE_ROW_GROUPS), PARTS_ONE_ROW_GROUPS),
        (partial(gemv_warp, "q4_k", 4096, 1, GLU_Q8_WARPS, glu=True, staged=True, per_warp=32 // GLU_Q8_WARPS, q8=True), 0),
    ]
    for k, n in ((4096, 4096), (14336, 4096), (4096, 128256)):  # o, down, the output head
        shape = _one_row_shape({"xq_in": 0}, k, n)
        out.append((partial(gemv_warp, "q4_k", k, 1, staged=True, **shape), shape["min_groups"]))
    return out


@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas is not installed here (pip install nvidia-cuda-nvcc-cu12, or the CUDA toolkit)")
def test_the_batch_1_gemvs_fit_the_workgroups_an_sm_they_are_shaped_for():
    """Llama-3-8B's one-row Q4_K GEMVs as planned on Hopper, assembled by ptxas for sm_90a: no
    spills, and registers within what their cap allows (65,536 a multiprocessor); the gated MLP's,
    uncapped, within 64 (four of its 256-thread workgroups an SM: its 448 workgroups in one wave).
    The products that would read a folded norm (q/k/v's, the gated MLP's, with ``rms_in``; not
    planned) take no more registers than as planned: taking more (72 for the gated MLP's) is what
    made the fold slower on the H200."""
    report = []

    def usage(kern):  # type: ignore[no-untyped-def]
        return ptxas_usage(compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data, "sm_90a")

    for make, groups in _llama3_8b_one_row_gemvs():
        kern = make()
        regs, spills, out = usage(kern)
        report.append(f"{kern.name}: {regs} registers, {spills} bytes spilled")
        assert spills == 0, out
        assert regs * kern.threads * max(groups, 1) <= 65536 and (groups or regs <= 64), report[-1]
        if kern.name.startswith(("gemv_warp_3x", "gemv_warp_glu")):
            reader = make(rms_in=128)
            regs2, _, out2 = usage(reader)
            report.append(f"{reader.name}: {regs2} registers")
            assert regs2 <= regs, f"{reader.name}: {regs2} registers against {regs}: {out2}"
    print("\n".join(report))
