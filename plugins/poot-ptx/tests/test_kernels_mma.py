"""NVIDIA's own kernels (poot-ptx): x split into bf16 terms, the tensor-core GEMMs (``mma.sync``:
``gemm_mma``, ``gemm_warp``), prefill attention on tensor cores (``attention_mma``), and what the
GPU schedules compile to in PTX. The GEMMs and attention run where ``POOT_TEST_DEVICE`` names a
device with mma.sync (``cuda:0`` through ``scripts/gpu-check``; ``null:sm_90a``, compiled and
assembled by ptxas); the elementwise kernels run everywhere (on the host too); everywhere the
kernels are compiled to PTX and their instructions checked."""

from __future__ import annotations

import numpy as np
import pytest

from poot.backend import kir as K
from poot.codegen import compile_kernel
from poot.codegen.targets import target
from poot.eval import evaluate
from poot.graph import GraphBuilder
from poot.graph.dtypes import i32
from poot.kernel.library.attention_gpu import attention_decode
from poot.kernel.library.linear_gpu import gemv_warp, gemv_warp_packed, gemv_warp_q6_k
from poot.plan.schedules import LUTS
from poot.quant import quantization
from poot.testing.kernels import assert_f32_sum_close as _close
from poot.testing.kernels import bf16_round, features_under_test, paged_block_tables, poisoned, pools_as, run_host, split_reference
from poot.testing.kernels import random_bf16 as _bf16
from poot_ptx.assembler import find_ptxas, ptxas_usage
from poot_ptx.kernels._q6_k import q6_k_bf16_pairs, q6_k_lane_loads, q6_k_lane_words
from poot_ptx.kernels.attention_mma import MMA_QROWS, attention_mma
from poot_ptx.kernels.mma import SPLIT_THREADS, gemm_mma, gemm_warp, glu_split, split_bf16x2, sum_parts
from poot_ptx.simt import run_simt

SUBGROUP, MATRIX = features_under_test()
ON_DEVICE = SUBGROUP == 32 and "mma.sync.bf16" in MATRIX
mma_only = pytest.mark.skipif(not ON_DEVICE, reason="needs mma.sync: set POOT_TEST_DEVICE=cuda:0 on an NVIDIA GPU")


def _mma_run(kern, grid, bufs, scalars) -> None:  # type: ignore[no-untyped-def]
    """A tensor-core kernel on the device under test where it has mma.sync, else through the Kernel
    IR interpreter (``poot_ptx.simt``: the fragment layouts and indexing, not the hardware)."""
    (run_host if ON_DEVICE else run_simt)(kern, grid, bufs, scalars)


def _small_off_device(m: int, n: int, k: int) -> None:
    """Through the interpreter, the smaller cases only."""
    if not ON_DEVICE and (k > 1024 or m * n > 6000):
        pytest.skip("through the interpreter the smaller cases only")


@pytest.mark.parametrize(
    "kern",
    [
        gemv_warp("bf16", 4096, 4),
        gemv_warp("q4_k", 14336, 1),
        gemv_warp_q6_k(14336, 1),
        gemv_warp_q6_k(4096, 4),
        gemv_warp_q6_k(14336, 1, wide=True),
        gemv_warp_q6_k(4096, 4, wide=True),
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
        gemm_warp(4096, 1, 4, 8, xsplit=True, qtype="q6_k"),
        gemm_warp(14336, 2, 4, 8, xsplit=True, qtype="q6_k"),
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
    elif not kern.name.startswith("gemv_warp_packed") and "q6_k" not in kern.name:  # (those read packed bytes and straddling words)
        assert "ld.global.nc.v4.b32" in ptx  # 16-byte weight loads through the read-only path
    if kern.name.startswith(("gemm_", "attention_")):
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    else:
        assert "shfl.sync.bfly" in ptx
    if kern.name.startswith("gemv_") and ("q4_k" in kern.name or "warp_q6_k" in kern.name):
        assert "dp4a.s32.s32" in ptx  # int8 activations against the quants
    if find_ptxas():  # registers and spills, where NVIDIA's assembler is installed
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90")
        assert spills == 0, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("mr,m,k", [(1, 1, 2048), (4, 3, 4096)])
def test_q6_k_gemv_at_32_lanes(rng, wide, mr, m, k):
    """The Q6_K GEMV at NVIDIA's 32 lanes a subgroup (elsewhere tested at the CPU Vulkan device's
    width; ``wide``: 32 values a lane, even and odd blocks apart): every output written, within the
    f32-summation bound of gguf's dequantization against x rebuilt from its two int8 terms. On the
    device under test where it has 32-lane subgroups, else through the interpreter."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    from poot.testing.kernels import q8x2_reference

    if not ON_DEVICE and k > 2048:
        pytest.skip("through the interpreter the smaller cases only")
    n = 20
    raw = quantization("q6_k").quantize((rng.standard_normal((n, k)) * np.exp2(rng.integers(-4, 4, (n, 1)))).astype(np.float32))
    w = gq.dequantize(raw, GGMLQuantizationType.Q6_K).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    xq, xr, xds = q8x2_reference(x)
    d = np.repeat(xds.reshape(-1, 2)[:, 0].astype(np.float64), 32).reshape(x.shape)
    xh = d * sum(t.view(np.int8).reshape(x.shape).astype(np.float64) * f for t, f in ((xq, 1.0), (xr, 1 / 254)))
    y = poisoned((m, n))
    kern = gemv_warp_q6_k(k, mr, 32, wide)
    _mma_run(
        kern,
        (-(-n // 16), -(-m // mr)),
        {"x": x, "w": np.ascontiguousarray(raw).view(np.int32).reshape(-1), "y": y},
        {"m": m, "n": n, "row_bytes": raw.shape[1]},
    )
    _close(y, xh @ w.T, np.abs(x) @ np.abs(w).T, slack=d.max() * np.abs(w).max() * 1.01)


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


@pytest.mark.parametrize("parts", [2, 8])
@pytest.mark.parametrize("m,n,k", [(17, 72, 512), (64, 136, 4096), (40, 24, 14336)])
def test_gemm_mma_split_along_k_then_summed(rng, parts, m, n, k):
    """Few rows: K split among workgroups, each part stored apart and added by ``sum_parts``."""
    _small_off_device(m, n, k)
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    part = poisoned((parts, m, n))
    _mma_run(
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


@pytest.mark.parametrize("shape", [(2, 2, 2, 4), (1, 4, 1, 1), (2, 4, 4, 4), (2, 2, 4, 8), (2, 4, 4, 8)])
@pytest.mark.parametrize("xsplit", [False, True])
@pytest.mark.parametrize("m,n,k", [(5, 37, 96), (70, 72, 128), (16, 64, 4096), (200, 300, 256)])
def test_gemm_mma_keeps_about_16_bits_of_each_activation(rng, shape, xsplit, m, n, k):
    _small_off_device(m, n, k)
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    wm, wn, tm, tn = shape
    xb = {"xs": split_reference(x)} if xsplit else {"x": x}
    _mma_run(gemm_mma(k, *shape, xsplit=xsplit), (-(-n // (8 * wn * tn)), -(-m // (16 * wm * tm))), {**xb, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)
    # rounding the activations to bf16 instead would be ~100x further off: the split is what holds the bound
    rounded = bf16_round(x).astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(rounded - want).max() > 10 * np.abs(y - want).max()


@pytest.mark.parametrize("gemm", ["mma 2x2 4x8", "mma 2x4 4x8", "mma 2x2 2x4", "warp 1x4 W8", "warp 2x4 W8", "warp 1x4 W16"])
@pytest.mark.parametrize("m,n,k", [(5, 37, 512), (70, 72, 1024), (16, 64, 4096), (200, 300, 512)])
def test_gemms_on_x_rounded_to_bf16(rng, gemm, m, n, k):
    """Matmul precision "medium": x rounded to bf16 once, one tensor-core product. Every product of
    bf16 values is exact in f32, so the result is the f32 sum of x rounded times w (tested at the
    f32-summation bound), and further from the exact product than the split one would be."""
    _small_off_device(m, n, k)
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    xs = split_reference(x)[: m * k // 2].copy()
    kind, a, b = gemm.split()
    if kind == "mma":
        (wm, wn), (tm, tn) = (tuple(map(int, v.split("x"))) for v in (a, b))
        grid = (-(-n // (8 * wn * tn)), -(-m // (16 * wm * tm)))
        _mma_run(gemm_mma(k, wm, wn, tm, tn, split=False, xsplit=True), grid, {"xs": xs, "w": bits, "y": y}, {"m": m, "n": n})
    else:
        mt, tn = map(int, a.split("x"))
        _mma_run(
            gemm_warp(k, mt, tn, int(b[1:]), split=False, xsplit=True), (-(-m // (16 * mt)), -(-n // (8 * tn))), {"xs": xs, "w": bits, "y": y}, {"m": m, "n": n}
        )
    rounded = bf16_round(x).astype(np.float64) @ w.T.astype(np.float64)
    _close(y, rounded, np.abs(x) @ np.abs(w).T)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(y - exact).max() > 10 * np.abs(y - rounded).max()  # it did round x


@pytest.mark.parametrize("mt,tn,wk", [(1, 4, 8), (2, 4, 8), (1, 2, 2)])
@pytest.mark.parametrize("xsplit", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 37, 512), (9, 64, 1024), (16, 40, 2048), (23, 33, 512)])
def test_gemm_warp_streams_weights_through_tensor_cores(rng, mt, tn, wk, xsplit, m, n, k):
    _small_off_device(m, n, k)
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    xb = {"xs": split_reference(x)} if xsplit else {"x": x}
    _mma_run(gemm_warp(k, mt, tn, wk, xsplit=xsplit), (-(-m // (16 * mt)), -(-n // (8 * tn))), {**xb, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)


@pytest.mark.parametrize("mt,tn,wk,k", [(1, 4, 8, 1024), (2, 4, 8, 2048), (1, 2, 2, 1024), (1, 4, 16, 14336)])  # 16 warps: the planner's for long rows
@pytest.mark.parametrize("split,xsplit", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("m,n", [(1, 37), (9, 64), (23, 33)])
def test_gemm_warp_dequantizes_q4_k_weights_in_registers(rng, mt, tn, wk, k, split, xsplit, m, n):
    """Q4_K weights streamed and dequantized to bf16 in registers: the same bits as the bf16 GEMM on
    the weights ``dequantize_bf16`` writes, and within the f32-summation bound of x (as two bf16
    terms, or rounded) times the nearest bf16 of gguf's dequantization."""
    _small_off_device(m, n, k)
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    from poot.kernel.library.dequant_gpu import dequant_groups, dequantize_bf16

    raw = quantization("q4_k").quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    w = bf16_round(gq.dequantize(raw, GGMLQuantizationType.Q4_K).reshape(n, k).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    xb = {"xs": split_reference(x) if split else split_reference(x)[: m * k // 2].copy()} if xsplit else {"x": x}
    grid = (-(-m // (16 * mt)), -(-n // (8 * tn)))
    y = poisoned((m, n))
    _mma_run(gemm_warp(k, mt, tn, wk, split=split, xsplit=xsplit, qtype="q4_k"), grid, {**xb, "w": raw.view(np.int32).reshape(-1), "y": y}, {"m": m, "n": n})
    wd = poisoned((n * k // 2,), np.int32)
    run_host(dequantize_bf16("q4_k", k), (dequant_groups("q4_k", n, k),), {"w": raw.view(np.int32).reshape(-1), "wd": wd}, {"n": n})
    same = poisoned((m, n))
    _mma_run(gemm_warp(k, mt, tn, wk, split=split, xsplit=xsplit), grid, {**xb, "w": wd, "y": same}, {"m": m, "n": n})
    assert (y.view(np.int32) == same.view(np.int32)).all(), f"{(y != same).sum()} outputs differ from the bf16 GEMM on the dequantized weights"
    xr = x if split else bf16_round(x)
    _close(y, xr.astype(np.float64) @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T)


def _q6_k_case(rng, n, k):
    """Q6_K weights [n, k] as stored, with their bf16 dequantization (``dequantize_bf16``'s words)."""
    from poot.kernel.library.dequant_gpu import dequant_groups, dequantize_bf16

    raw = quantization("q6_k").quantize((rng.standard_normal((n, k)) * rng.uniform(0.01, 1.0, (n, 1))).astype(np.float32))
    wd = poisoned((n * k // 2,), np.int32)
    lut = LUTS.get("q6_k", np.zeros(1, np.float32))
    run_host(dequantize_bf16("q6_k", k), (dequant_groups("q6_k", n, k),), {"w": raw, "wd": wd, "lut": lut}, {"n": n, "row_bytes": raw.shape[1]})
    return raw, wd


@pytest.mark.parametrize("n,k", [(3, 512), (5, 1536)])
def test_q6_k_lanes_dequantize_to_the_bf16_copy(rng, n, k):
    """What a tensor-core lane makes of its Q6_K words (``_q6_k``: loads straddling an odd block's
    words, joined, scaled, rounded to bf16 pairs), every lane of every chunk of every row written
    where the value lies: the words ``dequantize_bf16`` writes, bit for bit, and those the nearest bf16
    of gguf's dequantization. Generic Kernel IR: it runs on every device."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    raw, wd = _q6_k_case(rng, n, k)
    chunks = k // 64
    body: list = [
        K.Let("t", K.Bin("add", K.Bin("mul", K.Builtin("group_id", 0), K.Const(64, i32)), K.Builtin("thread_id", 0))),
        K.Let("t4", K.Bin("rem", K.Ref("t", i32), K.Const(4, i32))),
        K.Let("ch", K.Bin("rem", K.Bin("div", K.Ref("t", i32), K.Const(4, i32)), K.Const(chunks, i32))),
        K.Let("row", K.Bin("div", K.Ref("t", i32), K.Const(4 * chunks, i32))),
    ]
    ch, t4 = K.Ref("ch", i32), K.Ref("t4", i32)
    div = lambda a, c: K.Bin("div", a, K.Const(c, i32))  # noqa: E731
    ob = K.Bin("add", K.Bin("mul", K.Ref("row", i32), K.Const(raw.shape[1], i32)), K.Bin("mul", div(ch, 4), K.Const(210, i32)))
    pp = K.Bin("rem", ch, K.Const(2, i32))
    inner = q6_k_lane_loads("", 0, ob, K.Bin("rem", div(ch, 2), K.Const(2, i32)), pp) + q6_k_lane_words("", "", 0)
    for u in range(2):
        inner += q6_k_bf16_pairs("w0", u, pp, [f"p{u}_{q}" for q in range(4)])
        at = div(
            K.Bin(
                "add",
                K.Bin("mul", K.Ref("row", i32), K.Const(k, i32)),
                K.Bin("add", K.Bin("mul", ch, K.Const(64, i32)), K.Bin("add", K.Const(32 * u, i32), K.Bin("mul", t4, K.Const(8, i32)))),
            ),
            2,
        )
        inner += [K.Store("out", K.Bin("add", at, K.Const(q, i32)), K.Ref(f"p{u}_{q}", i32)) for q in range(4)]
    body.append(K.If(K.Bin("lt", K.Ref("t", i32), K.Const(n * chunks * 4, i32)), tuple(inner)))
    kern = K.Kernel(f"q6_k_lanes_{n}x{k}", (K.Buffer("w", i32), K.Buffer("out", i32, readonly=False)), tuple(body), (64, 1, 1), ())
    out = poisoned((n * k // 2,), np.int32)
    run_host(kern, (-(-n * chunks * 4 // 64),), {"w": raw.view(np.int32).reshape(-1), "out": out}, {})
    assert (out == wd).all(), f"{(out != wd).sum()} of {out.size} words differ from dequantize_bf16's"
    want = bf16_round(gq.dequantize(raw, GGMLQuantizationType.Q6_K).reshape(n, k).astype(np.float32))
    got = (out.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(n, k)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mt,tn,wk,k", [(1, 4, 8, 1024), (2, 4, 8, 2048), (1, 2, 2, 1024), (1, 4, 8, 14336)])
@pytest.mark.parametrize("split,xsplit", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("m,n", [(1, 37), (9, 64), (23, 33)])
def test_gemm_warp_dequantizes_q6_k_weights_in_registers(rng, mt, tn, wk, k, split, xsplit, m, n):
    """Q6_K weights read as stored (odd blocks straddling words) and dequantized to bf16 in registers:
    the same bits as the bf16 GEMM on the weights ``dequantize_bf16`` writes."""
    _small_off_device(m, n, k)
    raw, wd = _q6_k_case(rng, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    xb = {"xs": split_reference(x) if split else split_reference(x)[: m * k // 2].copy()} if xsplit else {"x": x}
    grid = (-(-m // (16 * mt)), -(-n // (8 * tn)))
    y = poisoned((m, n))
    _mma_run(gemm_warp(k, mt, tn, wk, split=split, xsplit=xsplit, qtype="q6_k"), grid, {**xb, "w": raw.view(np.int32).reshape(-1), "y": y}, {"m": m, "n": n})
    same = poisoned((m, n))
    _mma_run(gemm_warp(k, mt, tn, wk, split=split, xsplit=xsplit), grid, {**xb, "w": wd, "y": same}, {"m": m, "n": n})
    assert (y.view(np.int32) == same.view(np.int32)).all(), f"{(y != same).sum()} outputs differ from the bf16 GEMM on the dequantized weights"


def _prefill_case(rng, hq, hkv, d, bs=16):
    """Three sequences' prompts (some long, some resuming a context) over shuffled blocks of KV
    pools; the tokens are shuffled too, so blocks of 64 query tokens mix sequences."""
    ctx = np.array([150, 37, 90])
    new = np.array([150, 5, 70])
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(new)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, new)]).astype(np.int32)
    perm = rng.permutation(len(seq_ids))
    nb, mb, tables = paged_block_tables(rng, ctx, bs)
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


@pytest.mark.parametrize("mask", ["causal", "window+softcap", "full"])
@pytest.mark.parametrize("d,hq,hkv", [(128, 4, 1), (64, 6, 2)])
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("pt", ["f32", "f16"])
def test_prefill_attention_on_tensor_cores(rng, mask, d, hq, hkv, bs, pt):
    """``attention_mma`` (q k^T and P v on tensor cores, both sides split into two bf16 terms) against
    the graph evaluator's attention, over paged pools of f32 or f16 (halves widened as read),
    several sequences a block. Through the interpreter two of the cases."""
    if not ON_DEVICE and (mask, d, bs, pt) not in (("window+softcap", 64, 16, "f32"), ("causal", 128, 64, "f16")):
        pytest.skip("through the interpreter two cases only")

    data, bs, mb = _prefill_case(rng, hq, hkv, d, bs)
    pools, data = pools_as(data, pt)
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
    _mma_run(attention_mma(d, causal, pt=pt), (-(-t // MMA_QROWS), hq), bufs, scalars)
    # as plans build it: the pools' block size fixed in the kernel (tiles read the table once a block), soft-capping only where the model has it
    fixed = poisoned((t, hq, d))
    _mma_run(attention_mma(d, causal, block=bs, softcap=softcap > 0, pt=pt), (-(-t // MMA_QROWS), hq), {**bufs, "out": fixed}, scalars)

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
    _mma_run(attention_mma(d, causal, split=False, block=bs, softcap=softcap > 0, pt=pt), (-(-t // MMA_QROWS), hq), {**bufs, "out": out1}, scalars)
    assert np.isfinite(out1).all(), "an output element was never written"
    want1 = reference({**data, **{n: bf16_round(data[n]) for n in ("q", "k", "v")}})
    err1 = np.abs(out1 - want1)
    assert err1.max() < 8e-3 and err1.mean() < 5e-4, f"max error {err1.max():.3g}, mean {err1.mean():.3g}"


@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
@pytest.mark.parametrize(
    "kern",
    [
        attention_decode(128, True, 1, "f16"),
        attention_decode(64, True, 8, "f16"),
        *(attention_decode(128, True, 1, "f16", warps, softcap=False, group=4) for warps in (4, 8, 16)),
        attention_mma(128, pt="f16"),
        attention_mma(64, True, False, pt="f16"),
    ],
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
        regs, spills, out = ptxas_usage(ptx.encode(), "sm_90")
        assert spills == 0, out
        assert regs * kern.threads <= 65536, f"{regs} registers a thread: a workgroup of {kern.threads} cannot launch"
    with pytest.raises(ValueError, match="f32 or f16"):
        attention_decode(128, pt="bf16")


@pytest.mark.parametrize("splits", [1, 8])
def test_grouped_decode_attention_gives_each_head_its_own_bits(rng, splits):
    """``attention_decode(group=4)`` (a workgroup scoring the four query heads of one key/value
    head, eight warps, as planned for Llama-3-8B at 65-128 tokens): each head's output, and with the
    context split its partial maxima and sums, the bits the one-head kernel writes."""
    hq, hkv, d, bs = 8, 2, 128, 16
    ctx = np.array([1, 37, 150])
    nb, mb, tables = paged_block_tables(rng, ctx, bs)
    t = len(ctx)
    k, v = (rng.standard_normal((nb, bs, hkv, d)).astype(np.float16) for _ in "kv")
    ins = dict(
        q=rng.standard_normal((t, hq, d)).astype(np.float32),
        k_pool=k,
        v_pool=v,
        ks_pool=np.zeros(1, np.float16),
        positions=(ctx - 1).astype(np.int32),
        seq_ids=np.arange(t, dtype=np.int32),
        ctx_lens=ctx.astype(np.int32),
        block_tables=tables,
    )
    sc = {"hq": hq, "hkv": hkv, "dk": d, "dv": d, "dr": 0, "bs": bs, "mb": mb, "scale": 0.2, "window": 0, "softcap": 0.0}
    outs = []
    for group in (4, 1):
        bufs = {**ins, "out": poisoned((t, hq, splits * d)), "part_m": poisoned((t * hq * splits,)), "part_l": poisoned((t * hq * splits,))}
        _mma_run(attention_decode(d, True, splits, "f16", 8, softcap=False, group=group), (t, hq // group, splits), bufs, sc)
        assert np.isfinite(bufs["out"]).all(), f"group {group}: an output element was never written"
        outs.append(bufs)
    for name in ("out", "part_m", "part_l") if splits > 1 else ("out",):
        np.testing.assert_array_equal(outs[0][name], outs[1][name], err_msg=name)


def _llama3_8b_one_row_gemvs() -> list:
    """The one-row Q4_K GEMVs the planner launches for Llama-3-8B's decode on Hopper (its launch
    shapes, ``NvidiaSchedules.gemv``; q/k/v in one launch, the gated MLP writing down's x
    quantized): (the kernel's maker, workgroups an SM it is capped for, 0 where it is not)."""
    from functools import partial

    from poot.plan.common import Limits
    from poot.plan.fused_gemv import GLU_Q8_WARPS, PARTS_ONE_ROW_GROUPS
    from poot_ptx.schedules import NvidiaSchedules

    out = [
        (partial(gemv_warp, "q4_k", 4096, 1, parts=(4096, 1024, 1024), staged=True, min_groups=PARTS_ONE_ROW_GROUPS), PARTS_ONE_ROW_GROUPS),
        (partial(gemv_warp, "q4_k", 4096, 1, GLU_Q8_WARPS, glu=True, staged=True, per_warp=32 // GLU_Q8_WARPS, q8=True), 0),
    ]
    for k, n in ((4096, 4096), (14336, 4096), (4096, 128256)):  # o, down, the output head
        choice = NvidiaSchedules(None, Limits(matrix=frozenset({"mma.sync.bf16", "wgmma"}))).gemv("q4_k", k, n, 1)  # type: ignore[arg-type]
        assert choice.staged
        shape = choice.shape
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
