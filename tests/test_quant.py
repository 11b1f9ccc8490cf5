"""The core's quantization descriptors against gguf's own (de)quantizers, bit for bit, and the
round-trip error of every quantizer, including those gguf does not have."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

from poot.quant import quantization, quantizations

ALL = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
       "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4"]  # fmt: skip

# the types gguf 0.19 can quantize (F32/F16 by a cast, the rest by their quantize_blocks)
GGUF_QUANTIZES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4"]

# byte offsets of each block's f16 scale fields (d, and dmin/m where the layout has one), from ggml-common.h
F16_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0],
    "q2_k": [80, 82], "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208],
    "iq4_nl": [0], "iq4_xs": [0],
}  # fmt: skip

# round-trip rms(error) / rms(x) on Gaussian data: about 1.5x the values measured over 20 seeds
ERROR_BOUNDS = {
    "f32": 0.0, "f16": 3.1e-4, "bf16": 2.5e-3,
    "q4_0": 0.13, "q4_1": 0.12, "q5_0": 0.064, "q5_1": 0.057, "q8_0": 0.008,
    "q2_k": 0.43, "q3_k": 0.23, "q4_k": 0.11, "q5_k": 0.054, "q6_k": 0.027,
    "iq4_nl": 0.114, "iq4_xs": 0.115, "mxfp4": 0.17,
}  # fmt: skip


def gguf_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name.upper()]


def random_blocks(rng, q, lead, blocks_per_row):
    """Packed rows ``[*lead, blocks_per_row * block_bytes]`` of random but valid blocks: random bytes,
    with every f16 scale a small finite value and MXFP4's exponent byte in a sane range."""
    shape = (*lead, blocks_per_row)
    if q.block_size == 1:  # plain floats: random finite values, not random bit patterns
        vals = rng.standard_normal(shape).astype(np.float32)
        bf16 = (vals.view(np.uint32) >> 16).astype(np.uint16)
        raw = {"f32": vals, "f16": vals.astype(np.float16), "bf16": bf16}[q.name]
        return raw.view(np.uint8).reshape(*lead, -1)
    raw = rng.integers(0, 256, size=(*shape, q.block_bytes), dtype=np.uint8)
    for at in F16_FIELDS.get(q.name, []):
        d = (rng.standard_normal(shape) * 0.05).astype(np.float16)
        raw[..., at : at + 2] = d[..., None].view(np.uint8)
    if q.name == "mxfp4":
        raw[..., 0] = rng.integers(100, 150, size=shape)  # E8M0: 2^-27 .. 2^22
    return raw.reshape(*lead, -1)


def gaussian(rng, rows, cols):
    return (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 10)).astype(np.float32)


def test_every_type_is_registered():
    assert set(ALL) <= set(quantizations())


@pytest.mark.parametrize("name", ALL)
def test_descriptor_agrees_with_gguf_sizes(name):
    q = quantization(name)
    block_size, type_size = GGML_QUANT_SIZES[gguf_type(name)]
    assert q.gguf_type == int(gguf_type(name))
    assert (q.block_size, q.block_bytes) == (block_size, type_size)
    k = 7 * block_size
    assert q.row_bytes(k) == 7 * type_size
    assert q.packed_shape((3, 5, k)) == (3, 5, 7 * type_size)


@pytest.mark.parametrize("name", ALL)
def test_dequantize_equals_gguf_bit_for_bit(name, rng):
    q = quantization(name)
    raw = random_blocks(rng, q, (2, 3), 5)
    ours = q.dequantize(raw)
    theirs = gq.dequantize(raw, gguf_type(name)).astype(np.float32)
    assert ours.dtype == np.float32
    assert ours.shape == theirs.shape == (2, 3, 5 * q.block_size)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("name", GGUF_QUANTIZES)
def test_quantize_equals_gguf_byte_for_byte(name, rng):
    q = quantization(name)
    bs = max(q.block_size, 32)
    x = gaussian(rng, 6, 4 * bs)
    x[0, :bs] = 0.0  # an all-zero block exercises the zero-scale path
    x[1, bs + rng.integers(bs)] = 50 * np.abs(x).max()  # a block with one large outlier
    x = x.reshape(2, 3, -1)
    ours = q.quantize(x)
    theirs = gq.quantize(x, gguf_type(name))
    assert ours.dtype == np.uint8
    assert ours.shape == (2, 3, q.row_bytes(x.shape[-1]))
    np.testing.assert_array_equal(ours, theirs.view(np.uint8).reshape(ours.shape))


def test_round_trip_error_within_measured_bounds(rng):
    x = gaussian(rng, 8, 4096)
    x[0, :256] = 0.0  # an all-zero (super-)block must come back as zeros
    rows, over = [], []
    for name in ALL:
        q = quantization(name)
        packed = q.quantize(x)
        assert packed.shape == q.packed_shape(x.shape)
        y = q.dequantize(packed)
        assert y.shape == x.shape
        assert not y[0, :256].any(), f"{name}: an all-zero block did not round-trip to zeros"
        err = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
        rows.append(f"{name:8s} {err:10.6f} {ERROR_BOUNDS[name]:10.6f}")
        if err > ERROR_BOUNDS[name]:
            over.append(name)
    print("\ntype     rel. rms      bound\n" + "\n".join(rows))
    assert not over, f"round-trip error above the bound for {over}"


@pytest.mark.parametrize("name", ALL)
def test_partial_block_is_rejected(name):
    q = quantization(name)
    with pytest.raises(ValueError, match=rf"{name}: a packed row of {q.block_bytes + 1} bytes"):
        q.dequantize(np.zeros((2, q.block_bytes + 1), np.uint8))
    if q.block_size == 1:
        return  # every row length is whole blocks
    k = q.block_size + 16
    message = rf"{name}: row length {k} is not a multiple of the block size {q.block_size}"
    with pytest.raises(ValueError, match=message):
        q.quantize(np.zeros((2, k), np.float32))
    with pytest.raises(ValueError, match=message):
        q.row_bytes(k)
    with pytest.raises(ValueError, match=message):
        q.packed_shape((3, k))


@pytest.mark.parametrize("name", ALL)
def test_a_nan_scale_or_value_is_found_where_gguf_dequantizes_nan(name, rng, tmp_path):
    """The descriptor's scale offsets are ggml-common.h's, and a NaN (or, for MXFP4, E8M0's 0xFF)
    poked into one of them in a random block is where gguf's own dequantizer gives NaN or infinity and where
    the load's finiteness check points; a clean tensor passes it."""
    from poot.load import open_checkpoint
    from poot.load.finite import first_nonfinite
    from poot.testing.checkpoints import write_gguf

    q = quantization(name)
    assert [at for at, kind in q.scales if kind == "f16"] == F16_FIELDS.get(name, [])
    assert [kind for _, kind in q.scales if kind != "f16"] == (["e8m0"] if name == "mxfp4" else [])
    rows, per_row = 3, 4 if q.block_size > 1 else 64
    k = per_row * q.block_size
    clean = random_blocks(rng, q, (rows,), per_row)
    spots = [at for at, _ in q.scales] or [None]
    for at in spots:
        raw = clean.copy()
        block = int(rng.integers(rows * per_row))
        flat = raw.reshape(-1, q.block_bytes)
        if at is None:  # plain floats: the value itself
            nan = {"f32": np.float32(np.nan).tobytes(), "f16": np.float16(np.nan).tobytes(), "bf16": np.uint16(0x7FC0).tobytes()}[name]
            flat[block] = np.frombuffer(nan, np.uint8)
        elif name == "mxfp4":
            flat[block, at] = 0xFF
        else:
            flat[block, at : at + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        with np.errstate(over="ignore", invalid="ignore"):  # E8M0's 0xFF is 2^128 to gguf: infinite products
            want = gq.dequantize(raw, gguf_type(name)).reshape(-1, q.block_size)
        assert not np.isfinite(want[block]).all() and np.isfinite(np.delete(want, block, axis=0)).all()
        stored = raw.view({"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[name]) if q.block_size == 1 else raw
        path = write_gguf(tmp_path / f"{name}-{at}.gguf", "llama", {}, [("w.weight", name, (rows, k), stored)])
        assert first_nonfinite(open_checkpoint(path).tensors["w.weight"]) == block
    path = write_gguf(
        tmp_path / f"{name}-clean.gguf",
        "llama",
        {},
        [("w.weight", name, (rows, k), clean if q.block_size > 1 else clean.view({"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[name]))],
    )
    assert first_nonfinite(open_checkpoint(path).tensors["w.weight"]) is None
