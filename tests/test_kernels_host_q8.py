"""The host's integer products (``linear_q8_host``): x quantized once to two int8 terms, weights
summed as stored. Against gguf's dequantized weights in float64, the bits shared by every schedule
(one token a workgroup or every token, one thread or two, alone or in a batch), the quantization
itself, and ``dot_bytes`` with and without VNNI."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from poot.codegen.compile import compile_kernel
from poot.codegen.host_jit import HostKernel
from poot.codegen.targets import host_target
from poot.graph.dtypes import i32
from poot.kernel.frontend import In, Out, kernel
from poot.kernel.library import linear_q8_host as L
from poot.quant import quantization
from poot.testing.kernels import poisoned, run_host


def _quantize_x(x: np.ndarray, threads: int = 2) -> np.ndarray:
    m, k = x.shape
    xq = poisoned((m * (k // 32) * L.XW,), np.int32)
    run_host(L.quantize_x_host.instantiate(), (m,), {"x": np.ascontiguousarray(x), "xq": xq}, {"k": k}, threads=threads)
    return xq


def _terms(xq: np.ndarray, m: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records' q1 and q2 as int values [m, k] and their scales d / 256 [m, k / 32]."""
    rec = xq.reshape(m, k // 32, L.XW)
    q1 = rec[:, :, 0:8].copy().view(np.int8).reshape(m, k).astype(np.int64)
    q2 = rec[:, :, 8:16].copy().view(np.int8).reshape(m, k).astype(np.int64)
    return q1, q2, rec[:, :, 16].copy().view(np.float32)


def test_x_is_quantized_to_two_terms_within_a_step_of_the_second(rng):
    m, k = 3, 32 * 6
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100, (m, 1))).astype(np.float32)
    x[1, 64:96] = 0.0  # a block of zeros: scale 0, every term 0
    xq = _quantize_x(x)
    q1, q2, xd = _terms(xq, m, k)
    rec = xq.reshape(m, k // 32, L.XW)
    blocks = x.reshape(m, k // 32, 32)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    np.testing.assert_array_equal(q1.reshape(m, -1, 32), np.rint(blocks * inv[..., None]).astype(np.int64))  # llama.cpp's Q8_1 quants
    np.testing.assert_array_equal(xd, (amax / np.float32(127) / np.float32(256)).astype(np.float32))
    assert np.abs(q2).max() <= 127 and np.abs(q1).max() <= 127
    big_x = (256 * q1 + q2).reshape(m, -1, 32)
    err = np.abs(blocks.astype(np.float64) - xd[..., None].astype(np.float64) * big_x)
    assert (err <= xd[..., None] * 1.0001 + 1e-30).all()  # within a step of the second term:
    assert (err <= xd[..., None] * 0.5001 + 1e-30).mean() > 0.97  # half a step but where q2 reached its clamp
    np.testing.assert_array_equal(rec[:, :, 18], big_x.sum(axis=2))  # the block's sum of X, exact
    np.testing.assert_array_equal(rec[:, :, 17].copy().view(np.float32), (xd * big_x.sum(axis=2).astype(np.float32)).astype(np.float32))
    assert (q1[1, 64:96] == 0).all() and (q2[1, 64:96] == 0).all() and xd[1, 2] == 0


def _run(qtype: str, x: np.ndarray, raw: np.ndarray, one: bool, threads: int = 2) -> np.ndarray:
    m, k = x.shape
    n = raw.shape[0]
    xq = _quantize_x(x, threads)
    y = poisoned((m, n))
    sup = 8 if qtype in L.Q8K_TYPES else 1
    kern = L.gemv_q8.instantiate(QTYPE=qtype, SUPER=sup) if one else L.gemm_q8.instantiate(QTYPE=qtype, K=k, TM=4, SUPER=sup)
    grid = (-(-n // 16), m) if one else (-(-n // 16),)
    run_host(kern, grid, {"xq": xq, "w": raw, "y": y}, {"m": m, "n": n, "k": k, "row_bytes": raw.shape[1]}, threads=threads)
    return y


@pytest.mark.parametrize("qtype", L.Q8_TYPES + L.Q8K_TYPES)
def test_products_are_within_the_two_terms_bound_and_one_schedule_to_the_bit(rng, qtype):
    """37 rows: the last workgroup's 16 repeat row 36 (unstored); 7 tokens: four, then three (the
    fourth repeats a token, unstored)."""
    m, n, k = 7, 37, 512 if qtype in L.Q8K_TYPES else 32 * 5
    q = quantization(qtype)
    raw = q.quantize(rng.standard_normal((n, k)).astype(np.float32))
    w = q.dequantize(raw).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    many = _run(qtype, x, raw, one=False)
    assert np.isfinite(many).all(), "an output element was never written"
    want = x.astype(np.float64) @ w.T
    bound = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert (np.abs(many - want) <= 3e-5 * bound).all()  # x keeps about 15 bits a value
    one = _run(qtype, x, raw, one=True)
    np.testing.assert_array_equal(one, many)  # a token alone or with six others: the same bits
    np.testing.assert_array_equal(_run(qtype, x[2:5], raw, one=False), many[2:5])  # three rows, in a batch of their own
    np.testing.assert_array_equal(_run(qtype, x[:1], raw, one=False, threads=1), many[:1])  # one thread


def test_q4_1_minimums_and_q8_0_extremes(rng):
    """Q4_1 rows whose minimum dominates, and Q8_0 quants at -128 and 127 against x at its scale's
    edge: the offsets and the minimums' second sum, checked with large values."""
    m, n, k = 2, 16, 64
    x = rng.standard_normal((m, k)).astype(np.float32) * 50
    for qtype, w in (("q4_1", 3.0 + rng.random((n, k), np.float32)), ("q8_0", np.where(rng.random((n, k)) < 0.5, -1.0, 1.0).astype(np.float32))):
        q = quantization(qtype)
        raw = q.quantize(w)
        deq = q.dequantize(raw).astype(np.float64)
        got = _run(qtype, x, raw, one=True)
        want = x.astype(np.float64) @ deq.T
        assert (np.abs(got - want) <= 3e-5 * (np.abs(x).astype(np.float64) @ np.abs(deq).T)).all(), qtype


@kernel(workgroup=(1, 1, 1), loop_vectorize=False)
def _dot(a: In[i32], b: In[i32], c: Out[i32]):
    acc = shared(i32, 48)
    xa = shared(i32, 48)
    xb = shared(i32, 48)
    for i in static_range(48):
        acc[i] = a[48 + i]
        xa[i] = a[i]
        xb[i] = b[i]
    dot_bytes(acc, 0, xa, 0, xb, 0, 48)
    dot_bytes(acc, 16, xa, 32, xb, 0, 16)
    for i in static_range(48):
        c[i] = acc[i]


@pytest.mark.parametrize("vnni", ["avx512vnni", "avxvnni", "none"])
def test_dot_bytes_is_exact_with_and_without_vnni(rng, vnni):
    """Unsigned bytes of a against signed bytes of b, extremes included: 16 lanes an instruction
    (AVX-512 VNNI), 8 (AVX-VNNI: the host's features without AVX-512), or byte arithmetic (without
    either: every other target's lowering)."""
    t = host_target()
    feats = t.features.split(",")
    if vnni != "none" and f"+{vnni}" not in feats:
        pytest.skip(f"this host has no {vnni}")
    drop = {"avx512vnni": (), "avxvnni": ("avx512",), "none": ("vnni",)}[vnni]
    t = dataclasses.replace(t, features=",".join(f.replace("+", "-") if any(d in f for d in drop) else f for f in feats))
    ua = rng.integers(0, 256, (48, 4), dtype=np.uint8)
    ua[0] = 255
    sb = rng.integers(-128, 128, (48, 4), dtype=np.int8)
    sb[0] = -128
    sb[1] = 127
    acc0 = rng.integers(-(2**20), 2**20, 48, dtype=np.int32)
    a = np.concatenate([ua.view(np.int32).ravel(), acc0])
    c = poisoned((48,), np.int32)
    HostKernel(_dot.instantiate(), compile_kernel(_dot.instantiate(), t)).run((1,), {"a": a, "b": sb.view(np.int32).ravel().copy(), "c": c})
    prod = (ua.astype(np.int64) * sb.astype(np.int64)).sum(axis=1)
    want = acc0.astype(np.int64) + prod
    want[16:32] += (ua[32:48].astype(np.int64) * sb[0:16].astype(np.int64)).sum(axis=1)
    np.testing.assert_array_equal(c, want)


@kernel(workgroup=(1, 1, 1), loop_vectorize=False)
def _spread(a: In[i32], c: Out[i32]):
    arr = shared(i32, 32)
    for i in static_range(32):
        arr[i] = a[i]
    spread_bits(arr, 0, a[32], a[33], 4)
    spread_bits(arr, 16, a[34], a[35], 0)
    for i in static_range(32):
        c[i] = arr[i]


@pytest.mark.parametrize("wide", [True, False])
def test_spread_bits_puts_each_bit_in_its_byte(rng, wide):
    """Bit 4l + b of the 64 into byte b of lane l at the given place, OR'ed with what is there; the
    AVX-512 BW mask path and the shifts of every other target."""
    t = host_target()
    if not wide:
        t = dataclasses.replace(t, features=",".join(f.replace("+", "-") if f.startswith("+avx512") else f for f in t.features.split(",")))
    elif "+avx512bw" not in t.features:
        pytest.skip("this host has no AVX-512 BW (the shifts case covers its lowering)")
    base = rng.integers(0, 256, (32, 4), dtype=np.uint8) & 0x0F
    words = rng.integers(-(2**31), 2**31, 4, dtype=np.int64).astype(np.int32)
    c = poisoned((32,), np.int32)
    k = _spread.instantiate()
    HostKernel(k, compile_kernel(k, t)).run((1,), {"a": np.concatenate([base.view(np.int32).ravel(), words]), "c": c})
    want = base.astype(np.int64).copy()
    for half, (lo, hi, shift) in enumerate(((words[0], words[1], 4), (words[2], words[3], 0))):
        both = int(np.uint32(lo)) | int(np.uint32(hi)) << 32
        bits = np.array([(both >> i) & 1 for i in range(64)], np.int64)
        want[16 * half : 16 * half + 16] |= bits.reshape(16, 4) << shift
    np.testing.assert_array_equal(c.view(np.uint8).reshape(32, 4), want.astype(np.uint8))
