"""Hopper's warpgroup GEMM (``poot_ptx.kernels.wgmma.gemm_wgmma``: wgmma on operands in workgroup memory,
fed by cp.async through a ring of stages, K optionally split among workgroups): its PTX and its
refusal off sm_90a everywhere; its sums against float64 numpy where ``POOT_TEST_DEVICE`` names a
GPU with wgmma (``cuda:0`` on an H100 or H200, through ``scripts/gpu-check``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from poot.codegen import compile_kernel
from poot.codegen.targets import target
from poot.testing.kernels import assert_f32_sum_close as _close
from poot.testing.kernels import bf16_round, features_under_test, poisoned, run_host, split_reference
from poot.testing.kernels import random_bf16 as _bf16
from poot_ptx.kernels.mma import SPLIT_THREADS, sum_parts
from poot_ptx.kernels.wgmma import Q4_K_WGMMA_BN, WGMMA_BM, gemm_wgmma, gemm_wgmma_q4_k, wgmma_config

SUBGROUP, MATRIX = features_under_test()
wgmma_only = pytest.mark.skipif(
    SUBGROUP != 32 or "wgmma" not in MATRIX, reason="needs wgmma: set POOT_TEST_DEVICE=cuda:0 on a Hopper GPU (compute capability 9.0)"
)


WGMMA_VARIANTS = [
    (True, 128, 4, 32, 64),
    (False, 256, 4, 32, 64),
    (False, 128, 3, 32, 0),
    (True, 64, 6, 32, 0),
    (True, 128, 3, 64, 128),
    (False, 256, 4, 64, 128),
    (True, 128, 4, 64, 0),
]  # x's terms two?, features, stages, K a step, swizzle bytes


@pytest.mark.parametrize("split,bn,stages,bk,swizzle", WGMMA_VARIANTS)
def test_wgmma_gemm_compiles_for_sm_90a_only(split, bn, stages, bk, swizzle):
    """The warpgroup GEMM is Hopper's own code: for sm_90a, PTX of wgmma products (both operands by
    descriptor) fenced and waited for, fed by asynchronous copies into dynamic workgroup memory past
    48 KiB; for sm_90, whose LLVM backend would abort on wgmma, a typed refusal."""
    from poot.codegen import shared_layout
    from poot.errors import Refusal

    kern = gemm_wgmma(4096, split, bn, stages, bk, swizzle)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16" in ptx
    per_step = bk // 16 * (2 if split else 1)  # 16-wide slices of K a step, a product per term of x (LLVM may copy the loop)
    assert ptx.count("wgmma.mma_async") % per_step == 0 and ptx.count("wgmma.mma_async") >= per_step
    for sync in (
        "wgmma.fence.sync.aligned",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned 1",
        "fence.proxy.async.shared::cta",
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        f"cp.async.wait_group {stages - 3};",
    ):
        assert sync in " ".join(ptx.split()), sync
    assert "ld.global" not in ptx  # every operand byte arrives by cp.async
    _, dynamic = shared_layout(kern, target("nvptx:sm_90a"))
    total = sum(4 * sh.size for sh in kern.shared)
    if total > 48 * 1024:
        assert dynamic == total and ".extern .shared .align 1024" in ptx
    else:  # declared statically: swizzle atoms still at addresses aligned to their size
        assert dynamic == 0 and (".shared .align 1024" in ptx) == bool(swizzle)
    with pytest.raises(Refusal):
        compile_kernel(kern, target("nvptx:sm_90"), use_cache=False)
    ptxas = shutil.which("ptxas")
    if ptxas:
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", "-o", os.devnull, "-"], input=ptx.encode(), capture_output=True, check=True).stderr.decode()
        assert " 0 bytes spill stores" in out and "serialized" not in out, out


@wgmma_only
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("groups,parts", [(1, 1), (1, 4), (2, 2), (2, 8)])
@pytest.mark.parametrize("m,n,k", [(5, 44, 512), (64, 136, 4096), (40, 24, 14336), (200, 300, 4096)])  # (m n a multiple of 4, as sum_parts reads)
def test_wgmma_gemm_with_k_split(rng, split, groups, parts, m, n, k):
    """K split among workgroups (one warpgroup's 64 rows or two warpgroups' 128 a workgroup, in the
    configurations the planner takes), each part stored apart and added by ``sum_parts`` (in order,
    as the planner runs them)."""
    bn, stages, bk, sw = (128, 4, 32, 64) if groups == 1 else wgmma_config(split)
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    xs = split_reference(x) if split else split_reference(x)[: m * k // 2].copy()
    part = poisoned((parts, m, n))
    run_host(
        gemm_wgmma(k, split, bn, stages, bk, sw, warpgroups=groups, ksplit=parts),
        (-(-n // bn), -(-m // (64 * groups)), parts),
        {"xs": xs, "w": bits, "y": part},
        {"m": m, "n": n},
    )
    y = part[0]
    if parts > 1:
        y = poisoned((m, n))
        run_host(sum_parts(parts), (-(-m * n // 4 // SPLIT_THREADS),), {"p": part, "y": y}, {"count": m * n})
    xv = x if split else bf16_round(x)
    _close(y, xv.astype(np.float64) @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T)
    kp = k // parts  # each part is its own slice of K
    _close(part[-1], xv[:, k - kp :].astype(np.float64) @ w[:, k - kp :].T.astype(np.float64), np.abs(x[:, k - kp :]) @ np.abs(w[:, k - kp :]).T)


def test_wgmma_is_refused_by_name_off_sm_90a():
    from poot.errors import Refusal

    small = gemm_wgmma(512, False, 64, 3, 32, 64)  # 36 KiB of workgroup memory: within every target's static limit
    for name in ("nvptx:sm_90", "nvptx:sm_80"):
        with pytest.raises(Refusal, match="sm_90a"):
            compile_kernel(small, target(name), use_cache=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        gemm_wgmma(48)
    with pytest.raises(ValueError, match="stages"):
        gemm_wgmma(512, stages=2)
    with pytest.raises(ValueError, match="swizzled"):
        gemm_wgmma(512, bk=32, swizzle=128)


@wgmma_only
@pytest.mark.parametrize("split,bn,stages,bk,swizzle", WGMMA_VARIANTS)
@pytest.mark.parametrize("m,n,k", [(5, 37, 192), (70, 72, 128), (200, 300, 256), (130, 520, 4096), (257, 64, 64)])
def test_wgmma_gemm_matches_the_exact_product(rng, split, bn, stages, bk, swizzle, m, n, k):
    """Hopper's warpgroup GEMM on x as ``split_bf16x2`` writes it: with both terms within the f32
    bound of the exact product (and far nearer than x rounded would be), with one term the f32 sum of
    x rounded to bf16 times w. Shapes past the 128-row and bn-feature tiles; K of one step, of fewer
    steps than the ring's copies run ahead, and of many; operands in core matrices and swizzled."""
    w, bits = _bf16(rng, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    xs = split_reference(x) if split else split_reference(x)[: m * k // 2].copy()
    run_host(gemm_wgmma(k, split, bn, stages, bk, swizzle), (-(-n // bn), -(-m // WGMMA_BM)), {"xs": xs, "w": bits, "y": y}, {"m": m, "n": n})
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    rounded = bf16_round(x).astype(np.float64) @ w.T.astype(np.float64)
    if split:
        _close(y, exact, np.abs(x) @ np.abs(w).T)
        assert np.abs(rounded - exact).max() > 10 * np.abs(y - exact).max()
    else:
        _close(y, rounded, np.abs(x) @ np.abs(w).T)
        assert np.abs(y - exact).max() > 10 * np.abs(y - rounded).max()


def test_swizzled_operands_declared_statically_are_aligned_to_their_atoms():
    """A warpgroup GEMM within PTX's 48 KiB of static workgroup memory (the planner's one-warpgroup
    kernel with x rounded: exactly 48 KiB) still has its arrays at addresses aligned to 1024 bytes:
    the tensor cores undo a swizzle from address bits, so an atom must not straddle its alignment."""
    from poot.codegen import shared_layout

    kern = gemm_wgmma(4096, False, 128, 4, 32, 64, warpgroups=1)
    assert sum(4 * sh.size for sh in kern.shared) == 48 * 1024 and shared_layout(kern, target("nvptx:sm_90a")) == ({}, 0)
    ptx = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    assert ptx.count(".shared .align 1024") == len(kern.shared) == 2


@pytest.mark.parametrize("split,parts", [(True, 1), (False, 4)])
def test_q4_k_wgmma_compiles_for_sm_90a(split, parts):
    """The Q4_K warpgroup GEMM: wgmma on the bf16 tiles its threads write from Q4_K blocks that
    cp.async brought in (no global load outside the copies), within 96 registers' reach of three
    workgroups an SM (no spills) and a refusal for K that is not whole blocks."""
    kern = gemm_wgmma_q4_k(4096, split, parts)
    text = compile_kernel(kern, target("nvptx:sm_90a"), use_cache=False).data.decode()
    ptx = " ".join(text.split())
    assert f"wgmma.mma_async.sync.aligned.m64n{Q4_K_WGMMA_BN}k16.f32.bf16.bf16" in ptx
    assert "ld.global" not in ptx and "cp.async.cg.shared.global" in ptx and "st.shared.v4" in ptx and "fence.proxy.async.shared::cta" in ptx
    assert sum(4 * sh.size for sh in kern.shared) <= 76 * 1024  # three workgroups an SM
    ptxas = shutil.which("ptxas")
    if ptxas:
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", "-o", os.devnull, "-"], input=text.encode(), capture_output=True, check=True).stderr.decode()
        assert " 0 bytes spill stores" in out and "serialized" not in out, out
    with pytest.raises(ValueError, match="multiple of 256"):
        gemm_wgmma_q4_k(4160)
    with pytest.raises(ValueError, match="K split"):
        gemm_wgmma_q4_k(512, ksplit=16)


@wgmma_only
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("parts", [1, 2, 8])
@pytest.mark.parametrize("m,n,k", [(5, 44, 512), (64, 136, 4096), (40, 24, 14336), (17, 300, 2048), (64, 128, 256)])
def test_q4_k_wgmma_matches_the_product_of_the_dequantized_weights(rng, split, parts, m, n, k):
    """Q4_K blocks dequantized to bf16 in workgroup memory, K summed in the order the quant bytes
    hold it: within the f32-summation bound of x (two bf16 terms, or rounded) times the nearest
    bf16 of gguf's dequantization, every output written; each K part its own slice."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    from poot.quant import quantization

    if k % (64 * parts):
        pytest.skip(f"K {k} does not split in {parts} parts of whole chunks")
    raw = quantization("q4_k").quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32))
    w = bf16_round(gq.dequantize(raw, GGMLQuantizationType.Q4_K).reshape(n, k).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    xs = split_reference(x) if split else split_reference(x)[: m * k // 2].copy()
    part = poisoned((parts, m, n))
    run_host(
        gemm_wgmma_q4_k(k, split, parts),
        (-(-n // Q4_K_WGMMA_BN), -(-m // 64), parts),
        {"xs": xs, "w": raw.view(np.int32).reshape(-1), "y": part},
        {"m": m, "n": n},
    )
    xv = (x if split else bf16_round(x)).astype(np.float64)
    _close(part.astype(np.float64).sum(axis=0), xv @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T)
    kp = k // parts
    _close(part[-1], xv[:, k - kp :] @ w[:, k - kp :].T.astype(np.float64), np.abs(x[:, k - kp :]) @ np.abs(w[:, k - kp :]).T)
