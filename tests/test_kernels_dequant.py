"""Packed weights dequantized to bf16 for the tensor-core GEMMs (``dequantize_bf16``), against gguf's
own dequantizer rounded to bf16 by numpy: every word, and nothing written past the matrix. Runs on
the host, or on POOT_TEST_DEVICE."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from poot.kernel.library.dequant_gpu import dequant_groups, dequantize_bf16
from poot.quant import quantization
from poot.quant.bodies import BODIES, LUTS
from poot.testing.kernels import poisoned, run_host, split_reference

PACKED = sorted(q for q in BODIES if BODIES[q][0] > 1)


@pytest.mark.parametrize("qtype", PACKED)
@pytest.mark.parametrize("n,k", [(37, 256), (5, 1024 * 3)])
def test_packed_weights_dequantized_to_bf16(rng, qtype, n, k):
    q = quantization(qtype)
    w = (rng.standard_normal((n, k)) * np.exp2(rng.integers(-6, 6, (n, 1)))).astype(np.float32)
    raw = q.quantize(w)
    want = gq.dequantize(raw, GGMLQuantizationType[qtype.upper()]).reshape(n, k).astype(np.float32)
    wd = poisoned((n * k // 2 + 64,), np.int32)
    guard = wd[n * k // 2 :].copy()
    bufs = {"w": raw.view(np.int32).reshape(-1) if qtype == "q4_k" else raw.reshape(-1), "wd": wd}
    scalars = {"n": n}
    if qtype != "q4_k":
        bufs["lut"] = LUTS.get(qtype, np.zeros(1, np.float32))
        scalars["row_bytes"] = raw.shape[1]
    run_host(dequantize_bf16(qtype, k), (dequant_groups(qtype, n, k),), bufs, scalars)
    expect = split_reference(want)[: n * k // 2]  # the nearest bf16 of each value, two a word
    assert (wd[: n * k // 2] == expect).all(), f"{(wd[: n * k // 2] != expect).sum()} of {expect.size} words differ"
    assert (wd[n * k // 2 :] == guard).all(), "wrote past the matrix"


@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_dequantize_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="not a packed type"):
        dequantize_bf16("bf16", 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize_bf16("q4_k", 320)
