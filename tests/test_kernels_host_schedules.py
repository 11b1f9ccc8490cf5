"""The CPU schedules (one workgroup per core-sized task, 16-lane inner loops) against numpy and the
CPU oracle: every packed type, batched per-expert weights, ragged sizes, poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

from poot.kernel.library import linear_host, movement
from poot.quant import quantization
from poot.quant.bodies import BODIES, LUTS
from poot.testing.kernels import poisoned, run_host


def _weights(rng, qtype, shape):
    q = quantization(qtype)
    w = rng.standard_normal(shape).astype(np.float32)
    raw = q.quantize(w.reshape(-1, shape[-1])).reshape(shape[:-1] + (-1,))
    return raw, q.dequantize(raw.reshape(-1, raw.shape[-1])).reshape(shape)


def _close(got, want):
    assert np.isfinite(got).all(), "an output element was never written"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max() * np.sqrt(want.size))


@pytest.mark.parametrize("qtype", linear_host.LANE_TYPES)
@pytest.mark.parametrize("experts,shared_x,nr", [(1, True, 1), (3, True, 1), (3, False, 1), (1, True, 4), (3, False, 4)])
def test_gemv_lanes(rng, qtype, experts, shared_x, nr):
    """``nr`` rows a workgroup: 23 rows leave the last workgroup three (its fourth repeats a row, unstored)."""
    m, n, k = 2, 23, 32 * 5
    raw, deq = _weights(rng, qtype, (experts, n, k))
    x = rng.standard_normal((1 if shared_x else experts, m, k)).astype(np.float32)
    y = poisoned((experts, m, n))
    sc = {"n": n, "k": k, "row_bytes": raw.shape[-1], "xs": 0 if shared_x else m * k, "ws": n * raw.shape[-1], "ys": m * n}
    run_host(linear_host.gemv_lanes.instantiate(QTYPE=qtype, NR=nr), (-(-n // nr), m, experts), {"x": x, "w": raw, "y": y}, sc)
    _close(y, np.matmul(x, np.swapaxes(deq, 1, 2)))


@pytest.mark.parametrize("k", [16, 37, 200])
def test_gemv_lanes_f32(rng, k):
    m, n, e = 3, 11, 2
    w = rng.standard_normal((e, n, k)).astype(np.float32)
    x = rng.standard_normal((e, m, k)).astype(np.float32)
    y = poisoned((e, m, n))
    run_host(linear_host.gemv_lanes_f32.instantiate(), (n, m, e), {"x": x, "w": w, "y": y}, {"n": n, "k": k, "xs": m * k, "ws": n * k, "ys": m * n})
    _close(y, np.matmul(x, np.swapaxes(w, 1, 2)))


@pytest.mark.parametrize("qtype", sorted(BODIES))
def test_gemm_rows_every_type(rng, qtype):
    bs, bb, _ = BODIES[qtype]
    k = bs * 2 if bs % 16 == 0 else 64
    if k % bs:
        pytest.skip(f"{qtype}: block of {bs}")
    m, n, e = 7, 10, 2  # ragged: 7 tokens in tiles of 4, 10 rows in groups of 4
    raw, deq = _weights(rng, qtype, (e, n, k))
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    c = poisoned((e, m, n))
    kern = linear_host.gemm_rows.instantiate(QTYPE=qtype, K=k, BS=bs, BB=bb, NR=4, TM=4)
    sc = {"m": m, "n": n, "row_bytes": raw.shape[-1], "xs": 0, "ws": n * raw.shape[-1], "ys": m * n}
    run_host(kern, (-(-n // 4), e), {"a": a, "w": raw, "lut": LUTS.get(qtype, np.zeros(1, np.float32)), "c": c}, sc)
    _close(c, np.matmul(a, np.swapaxes(deq, 1, 2)))


def test_gemm_rows_f32(rng):
    m, n, k = 9, 13, 48
    w = rng.standard_normal((n, k)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    c = poisoned((m, n))
    run_host(linear_host.gemm_rows_f32.instantiate(K=k, NR=4, TM=4), (-(-n // 4), 1), {"a": a, "w": w, "c": c}, {"m": m, "n": n, "xs": 0, "ws": 0, "ys": m * n})
    _close(c, a @ w.T)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("shape,axes", [((5, 7, 33), (0,)), ((4, 6, 3), (1,)), ((3, 4, 5, 2), (1, 2)), ((6, 40), (0,))])
def test_reduce_axis(rng, op, shape, axes):
    x = rng.standard_normal(shape).astype(np.float32)
    lo, hi = axes[0], axes[-1] + 1
    outer, length, inner = int(np.prod(shape[:lo])), int(np.prod(shape[lo:hi])), int(np.prod(shape[hi:]))
    y = poisoned((outer, inner))
    run_host(movement.reduce_axis.instantiate(OP=op), (outer, -(-inner // 16)), {"x": x, "y": y}, {"outer": outer, "length": length, "inner": inner})
    want = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op](x, axis=axes).reshape(outer, inner)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 6])
def test_topk_rows_is_a_stable_descending_sort(rng, k):
    rows, cols = 9, 13
    x = rng.integers(-3, 4, (rows, cols)).astype(np.float32)  # many ties
    x[0, :4] = -np.inf
    vals, idx = poisoned((rows, k)), poisoned((rows, k), np.int32)
    run_host(movement.topk_rows.instantiate(K=k), (rows,), {"x": x, "values": vals, "indices": idx}, {"cols": cols})
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, 1))


@pytest.mark.parametrize("qtype", sorted(q for q in BODIES if BODIES[q][0] % 16 == 0))
def test_gemv_and_gemm_give_a_row_the_same_bits(rng, qtype):
    """Batch invariance: a row computed alone (GEMV) equals the same row inside a prefill (GEMM)."""
    bs, bb, _ = BODIES[qtype]
    k, n, m = bs * (2 if bs > 32 else 6), 9, 5
    raw, _ = _weights(rng, qtype, (1, n, k))
    a = rng.standard_normal((m, k)).astype(np.float32)
    lut = LUTS.get(qtype, np.zeros(1, np.float32))
    c = poisoned((m, n))
    sc = {"xs": 0, "ws": 0, "ys": m * n}
    run_host(
        linear_host.gemm_rows.instantiate(QTYPE=qtype, K=k, BS=bs, BB=bb, NR=4, TM=4),
        (-(-n // 4), 1),
        {"a": a, "w": raw, "lut": lut, "c": c},
        {"m": m, "n": n, "row_bytes": raw.shape[-1], **sc},
    )
    for r in range(m):
        y = poisoned((1, n))
        x = a[r : r + 1].copy()
        if qtype in linear_host.LANE_TYPES:  # one row a workgroup, and four (what the planner takes)
            run_host(linear_host.gemv_lanes.instantiate(QTYPE=qtype), (n, 1, 1), {"x": x, "w": raw, "y": y}, {"n": n, "k": k, "row_bytes": raw.shape[-1], **sc})
            np.testing.assert_array_equal(y[0], c[r])
            y = poisoned((1, n))
            run_host(
                linear_host.gemv_lanes.instantiate(QTYPE=qtype, NR=4),
                (-(-n // 4), 1, 1),
                {"x": x, "w": raw, "y": y},
                {"n": n, "k": k, "row_bytes": raw.shape[-1], **sc},
            )
        else:
            run_host(
                linear_host.gemv_lanes_any.instantiate(QTYPE=qtype, BS=bs, BB=bb),
                (n, 1, 1),
                {"x": x, "w": raw, "lut": lut, "y": y},
                {"n": n, "k": k, "row_bytes": raw.shape[-1], **sc},
            )
        np.testing.assert_array_equal(y[0], c[r])


def test_gemv_and_gemm_f32_give_a_row_the_same_bits(rng):
    k, n, m = 96, 7, 6
    w = rng.standard_normal((n, k)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    c = poisoned((m, n))
    run_host(linear_host.gemm_rows_f32.instantiate(K=k, NR=4, TM=4), (2, 1), {"a": a, "w": w, "c": c}, {"m": m, "n": n, "xs": 0, "ws": 0, "ys": m * n})
    for r in range(m):
        y = poisoned((1, n))
        run_host(linear_host.gemv_lanes_f32.instantiate(), (n, 1, 1), {"x": a[r : r + 1].copy(), "w": w, "y": y}, {"n": n, "k": k, "xs": 0, "ws": 0, "ys": n})
        np.testing.assert_array_equal(y[0], c[r])


@pytest.mark.parametrize(
    "k,mr,m,glu,per_warp",
    [(256, 1, 1, False, 1), (1024, 4, 3, False, 1), (512, 4, 4, True, 1), (2048, 1, 1, True, 1), (256, 1, 1, False, 3), (512, 4, 3, True, 2)],
)
def test_gemv_warp_bf16_with_sums_through_workgroup_memory(rng, k, mr, m, glu, per_warp):
    """The bf16 warp GEMV for targets without subgroup operations (Vulkan, WebGPU): the lanes' sums
    finished through workgroup memory; n not a multiple of the eight warps of a workgroup (nor of
    their features, with ``per_warp`` features a warp, one after the other)."""
    from poot.kernel.library.linear_gpu import gemv_warp

    n = 37
    ws = [rng.standard_normal((n, k)).astype(np.float32) for _ in range(2 if glu else 1)]
    bits = [(w.view(np.uint32) >> 16).astype(np.uint16) for w in ws]
    vals = [(b.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for b in bits]
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    kern = gemv_warp("bf16", k, mr, glu=glu, shared_sums=True, per_warp=per_warp)
    names = ["wg", "wu"] if glu else ["w"]
    run_host(kern, (-(-n // (8 * per_warp)), -(-m // mr)), {"x": x, **{nm: b.view(np.int32) for nm, b in zip(names, bits)}, "y": y}, {"m": m, "n": n})
    prods = [x.astype(np.float64) @ v.T for v in vals]
    want = prods[0] / (1 + np.exp(-prods[0])) * prods[1] if glu else prods[0]
    assert np.isfinite(y).all(), "an output element was never written"
    scale = sum(np.abs(x) @ np.abs(v).T for v in vals) * (1 + np.abs(want))
    assert (np.abs(y - want) <= 1e-5 * scale + 1e-6).all(), np.abs(y - want).max()


@pytest.mark.parametrize("m,n,k,bk", [(5, 37, 256, 32), (64, 64, 512, 32), (70, 130, 256, 16), (1, 3, 512, 16)])
def test_gemm_simt_bf16_tiles(rng, m, n, k, bk):
    """The register-tiled GEMM for GPUs without matrix instructions: 64 x 64 tiles, 4 x 4 a thread,
    bf16 weights widened exactly, f32 sums; m and n not multiples of the tile (guarded rows and
    features), K in steps of 16 and 32."""
    from poot.kernel.library.linear_simt import SIMT_TILE, gemm_simt

    w = rng.standard_normal((n, k)).astype(np.float32)
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)
    wv = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(gemm_simt(k, bk), (-(-n // SIMT_TILE), -(-m // SIMT_TILE)), {"x": x, "w": bits.view(np.int32), "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ wv.T
    assert np.isfinite(y).all(), "an output element was never written"
    assert (np.abs(y - want) <= 1e-5 * (np.abs(x) @ np.abs(wv).T) + 1e-6).all(), np.abs(y - want).max()
