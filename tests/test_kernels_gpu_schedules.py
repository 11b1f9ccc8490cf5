"""The GPU matrix schedules (warp-per-feature GEMVs with 16-byte loads; tensor-core GEMMs). They need
32-lane subgroups and mma.sync, so they run where ``POOT_TEST_DEVICE`` names an NVIDIA GPU
(``scripts/gpu-check``); everywhere they are compiled to PTX and their instructions checked."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from poot.codegen import compile_kernel
from poot.codegen.targets import target
from poot.kernel.library.linear_gpu import gemm_mma, gemm_warp, gemv_warp
from poot.quant import quantization
from poot.testing.kernels import poisoned, run_host

ON_GPU = os.environ.get("POOT_TEST_DEVICE", "").startswith("cuda")
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs 32-lane subgroups and mma.sync: set POOT_TEST_DEVICE=cuda:0 on an NVIDIA GPU")


def _bf16(rng, shape):
    """Random bf16 values as (float32 values, their bits as int32 pairs)."""
    bits = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32), bits.view(np.int32)


def _close(got, want, scale):
    assert np.isfinite(got).all(), "an output element was never written"
    bad = np.abs(got - want) > 1e-5 * scale + 1e-6
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.abs(got - want).max():.3g}"


@pytest.mark.parametrize("kern", [gemv_warp("bf16", 4096, 4), gemv_warp("q4_k", 14336, 4), gemm_mma(4096), gemm_mma(4096, 1, 4, 1, 1),
                                  gemm_warp(4096), gemm_warp(14336, 2, 4, 8)],
                         ids=lambda k: k.name)
def test_schedules_compile_to_the_instructions_they_are_for(kern):
    ptx = compile_kernel(kern, target("nvptx:sm_90"), use_cache=False).data.decode()
    assert "ld.global.nc.v4.b32" in ptx  # 16-byte weight loads through the read-only path
    if kern.name.startswith("gemm_"):
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    else:
        assert "shfl.sync.bfly" in ptx
    ptxas = shutil.which("ptxas")
    if ptxas:  # registers and spills, where CUDA's assembler is installed
        out = subprocess.run([ptxas, "-arch=sm_90", "-v", "-o", os.devnull, "-"], input=ptx.encode(), capture_output=True, check=True).stderr.decode()
        assert " 0 bytes spill stores" in out, out


@gpu_only
@pytest.mark.parametrize("k", [256, 512, 1024 * 3])
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 2), (4, 4), (4, 7)])
def test_gemv_warp_bf16(rng, k, mr, m):
    n = 37  # not a multiple of the eight warps of a workgroup
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(gemv_warp("bf16", k, mr), (-(-n // 8), -(-m // mr)), {"x": x, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)


@gpu_only
@pytest.mark.parametrize("k", [512, 1024, 256 * 7])  # two blocks a row (guarded), four, seven
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 3)])
def test_gemv_warp_q4_k(rng, k, mr, m):
    n = 21
    q = quantization("q4_k")
    raw = q.quantize(rng.standard_normal((n, k)).astype(np.float32))
    w = q.dequantize(raw)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(gemv_warp("q4_k", k, mr), (-(-n // 8), -(-m // mr)), {"x": x, "w": np.ascontiguousarray(raw).view(np.int32), "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)


@gpu_only
@pytest.mark.parametrize("shape", [(2, 2, 2, 4), (1, 4, 1, 1)])
@pytest.mark.parametrize("m,n,k", [(5, 37, 96), (70, 72, 128), (16, 64, 4096)])
def test_gemm_mma_keeps_about_16_bits_of_each_activation(rng, shape, m, n, k):
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    wm, wn, tm, tn = shape
    run_host(gemm_mma(k, *shape), (-(-n // (8 * wn * tn)), -(-m // (16 * wm * tm))), {"x": x, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)
    # rounding the activations to bf16 instead would be ~100x further off: the split is what holds the bound
    xr = (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) & 0xFFFF0000
    rounded = xr.view(np.float32).astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(rounded - want).max() > 10 * np.abs(y - want).max()


@gpu_only
@pytest.mark.parametrize("mt,tn,wk", [(1, 4, 8), (2, 4, 8), (1, 2, 2)])
@pytest.mark.parametrize("m,n,k", [(1, 37, 512), (9, 64, 1024), (16, 40, 2048), (23, 33, 512)])
def test_gemm_warp_streams_weights_through_tensor_cores(rng, mt, tn, wk, m, n, k):
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(gemm_warp(k, mt, tn, wk), (-(-m // (16 * mt)), -(-n // (8 * tn))), {"x": x, "w": bits, "y": y}, {"m": m, "n": n})
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    _close(y, want, np.abs(x) @ np.abs(w).T)


@gpu_only
@pytest.mark.parametrize("qtype", ["bf16", "q4_k"])
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 3)])
def test_gated_gemv_computes_silu_of_one_product_times_the_other(rng, qtype, mr, m):
    n, k = 29, 1024
    if qtype == "bf16":
        (wg, bg), (wu, bu) = _bf16(rng, (n, k)), _bf16(rng, (n, k))
    else:
        q = quantization("q4_k")
        rg, ru = (q.quantize(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(2))
        wg, wu, bg, bu = q.dequantize(rg), q.dequantize(ru), np.ascontiguousarray(rg).view(np.int32), np.ascontiguousarray(ru).view(np.int32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(gemv_warp(qtype, k, mr, glu=True), (-(-n // 8), -(-m // mr)), {"x": x, "wg": bg, "wu": bu, "y": y}, {"m": m, "n": n})
    g, u = x.astype(np.float64) @ wg.T.astype(np.float64), x.astype(np.float64) @ wu.T.astype(np.float64)
    want = g / (1 + np.exp(-g)) * u
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@gpu_only
@pytest.mark.parametrize("qtype", ["bf16", "q4_k"])
@pytest.mark.parametrize("mr,m", [(1, 1), (4, 2)])
def test_one_gemv_launch_for_several_products_of_one_x(rng, qtype, mr, m):
    parts, k = (24, 8, 13), 512
    q = quantization("q4_k")
    ws, bufs = [], {}
    for i, n in enumerate(parts):
        if qtype == "bf16":
            w, bits = _bf16(rng, (n, k))
        else:
            raw = q.quantize(rng.standard_normal((n, k)).astype(np.float32))
            w, bits = q.dequantize(raw), np.ascontiguousarray(raw).view(np.int32)
        ws.append(w)
        bufs[f"w{i}"], bufs[f"y{i}"] = bits, poisoned((m, n))
    x = rng.standard_normal((m, k)).astype(np.float32)
    run_host(gemv_warp(qtype, k, mr, parts=parts), (-(-sum(parts) // 8), -(-m // mr)), {"x": x, **bufs}, {"m": m, "n": sum(parts)})
    for i, w in enumerate(ws):
        _close(bufs[f"y{i}"], x.astype(np.float64) @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T)
