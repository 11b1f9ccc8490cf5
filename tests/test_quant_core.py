"""The core's quantization descriptors against gguf's own (de)quantizers, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from poot.quant import quantization

CORE = ["f32", "f16", "bf16", "q4_0", "q8_0"]


def random_blocks(rng, q, rows, blocks_per_row):
    """Random bytes with every f16 scale finite (a valid block)."""
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, q.block_bytes), dtype=np.uint8)
    if q.name.startswith("q"):
        d = (rng.standard_normal((rows, blocks_per_row)) * 0.05).astype(np.float16)
        raw[..., :2] = d.view(np.uint8).reshape(rows, blocks_per_row, 2)
    elif q.name in ("f16", "bf16", "f32"):
        vals = rng.standard_normal((rows, blocks_per_row)).astype({"f16": np.float16, "f32": np.float32, "bf16": np.float32}[q.name])
        b = vals.view(np.uint8) if q.name != "bf16" else (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        raw = b.reshape(rows, blocks_per_row, q.block_bytes)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("name", CORE)
def test_dequantize_equals_gguf_bit_for_bit(name, rng):
    q = quantization(name)
    raw = random_blocks(rng, q, 5, 8)
    gtype = GGMLQuantizationType(q.gguf_type)
    ours = q.dequantize(raw)
    theirs = gq.dequantize(raw, gtype)
    assert ours.shape == theirs.shape == (5, 8 * q.block_size)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("name", CORE)
def test_quantize_equals_gguf_bit_for_bit(name, rng):
    q = quantization(name)
    x = (rng.standard_normal((6, 4 * max(q.block_size, 32))) * rng.uniform(0.01, 10)).astype(np.float32)
    x[0, : q.block_size] = 0.0  # an all-zero block exercises the zero-scale path
    ours = q.quantize(x)
    theirs = gq.quantize(x, GGMLQuantizationType(q.gguf_type))
    assert ours.shape == (6, q.row_bytes(x.shape[1]))
    np.testing.assert_array_equal(ours, theirs.view(np.uint8).reshape(ours.shape))
