"""Q8_0 and Q5_0 weights laid out 16 rows at a time (``linear_q8_rows``): the layout's bytes against
gguf's own dequantizer, and its GEMV, GEMM and gather against the kernels that read the stored rows,
to the bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, dequantize

from poot.kernel.library import gather as G
from poot.kernel.library import linear_q8_host as L
from poot.kernel.library import linear_q8_rows as R
from poot.quant import quantization
from poot.testing.kernels import poisoned, run_host

TYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q5_0": GGMLQuantizationType.Q5_0}


def _weight(rng: np.random.Generator, qtype: str, n: int, k: int) -> np.ndarray:
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 10, (n, 1)).astype(np.float32)
    w[0, :32] = np.where(rng.random(32) < 0.5, -1.0, 1.0)  # quants at their extremes
    return quantization(qtype).quantize(w)


def _unlay(laid: np.ndarray, qtype: str, n: int, k: int) -> np.ndarray:
    """The layout read back as stored rows, by its definition (the module's docstring)."""
    nb, g = k // 32, n // 16
    rec = laid.reshape(g, nb, R.RECORD[qtype])
    scales = rec[:, :, :32].reshape(g, nb, 16, 2).transpose(0, 2, 1, 3)
    if qtype == "q8_0":
        quants = (rec[:, :, 32:].reshape(g, nb, 8, 16, 4) ^ np.uint8(0x80)).transpose(0, 3, 1, 2, 4).reshape(g, 16, nb, 32)
        return np.concatenate([scales, quants], axis=3).reshape(n, nb * 34)
    bits = rec[:, :, 32:96].reshape(g, nb, 16, 4).transpose(0, 2, 1, 3)
    nibbles = rec[:, :, 96:].reshape(g, nb, 4, 16, 4).transpose(0, 3, 1, 2, 4).reshape(g, 16, nb, 16)
    return np.concatenate([scales, bits, nibbles], axis=3).reshape(n, nb * 22)


@pytest.mark.parametrize("qtype", R.ROWS16_TYPES)
def test_the_layout_moves_every_byte_and_keeps_the_values(rng, qtype):
    n, k = 48, 32 * 7
    raw = _weight(rng, qtype, n, k)
    laid = R.lay_out_rows16(raw, n, k, qtype)
    assert laid.dtype == np.uint8 and laid.nbytes == raw.nbytes
    np.testing.assert_array_equal(_unlay(laid, qtype, n, k), raw.reshape(n, -1))
    rows = raw.reshape(n, -1)
    first = laid[: R.RECORD[qtype]]  # group 0, block 0: row 1's scale, and a byte of row 2 (word 1, byte 1)
    assert first[2:4].tobytes() == rows[1, 0:2].tobytes()
    if qtype == "q8_0":
        assert first[32 + 64 * 1 + 4 * 2 + 1] == (int(rows[2, 2 + 5].view(np.int8)) + 128)  # quant 5, plus 128
    else:
        assert first[32 + 4 * 2 : 36 + 4 * 2].tobytes() == rows[2, 2:6].tobytes()  # the fifth bits
        assert first[96 + 64 * 1 + 4 * 2 + 1] == rows[2, 6 + 5]  # nibble byte 5
    want = dequantize(raw.reshape(-1), TYPES[qtype]).reshape(n, k)
    np.testing.assert_array_equal(quantization(qtype).dequantize(_unlay(laid, qtype, n, k)).reshape(n, k), want)
    assert R.rows16_applies(qtype, 48, 64) and not R.rows16_applies(qtype, 40, 64) and not R.rows16_applies("q4_0", 48, 64)
    with pytest.raises(ValueError, match="holds"):
        R.lay_out_rows16(raw[:-1], n, k, qtype)


def _xq(x: np.ndarray) -> np.ndarray:
    m, k = x.shape
    xq = poisoned((m * (k // 32) * L.XW,), np.int32)
    run_host(L.quantize_x_host.instantiate(), (m,), {"x": x, "xq": xq}, {"k": k})
    return xq


@pytest.mark.parametrize("qtype", R.ROWS16_TYPES)
@pytest.mark.parametrize("pf", [False, True])
def test_gemv_and_gemm_on_the_layout_give_the_stored_rows_bits(rng, qtype, pf):
    """48 rows (three groups), 7 tokens: the GEMV a token at a time and the GEMM four tokens at a
    time on the layout, each against its kernel on the stored rows, every bit."""
    m, n, k = 7, 48, 32 * 9
    raw = _weight(rng, qtype, n, k)
    laid = R.lay_out_rows16(raw, n, k, qtype)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    xq = _xq(x)
    sc = {"m": m, "n": n, "k": k, "row_bytes": raw.reshape(n, -1).shape[1]}
    want1 = poisoned((m, n))
    run_host(L.gemv_q8.instantiate(QTYPE=qtype, SUPER=1), (n // 16, m), {"xq": xq, "w": raw, "y": want1}, sc)
    got1 = poisoned((m, n))
    run_host(R.gemv_q8_rows16.instantiate(QTYPE=qtype, PF=R.RECORD[qtype] if pf else 0), (n // 16, m), {"xq": xq, "w": laid, "y": got1}, sc, threads=1)
    assert np.isfinite(got1).all(), "an output element was never written"
    np.testing.assert_array_equal(got1.view(np.int32), want1.view(np.int32))
    deq = quantization(qtype).dequantize(raw).astype(np.float64)
    assert (np.abs(got1 - x.astype(np.float64) @ deq.T) <= 3e-5 * (np.abs(x).astype(np.float64) @ np.abs(deq).T)).all()
    wantm = poisoned((m, n))
    run_host(L.gemm_q8.instantiate(QTYPE=qtype, K=k, TM=4), (n // 16,), {"xq": xq, "w": raw, "y": wantm}, sc)
    gotm = poisoned((m, n))
    run_host(L.gemm_q8.instantiate(QTYPE=qtype, K=k, TM=4, ROWS16=True), (n // 16,), {"xq": xq, "w": laid, "y": gotm}, sc)
    np.testing.assert_array_equal(gotm.view(np.int32), wantm.view(np.int32))
    np.testing.assert_array_equal(gotm.view(np.int32), got1.view(np.int32))  # and the two schedules agree, as on stored rows


@pytest.mark.parametrize("qtype", R.ROWS16_TYPES)
def test_gather_reads_embedding_rows_out_of_the_layout(rng, qtype):
    n, k = 64, 32 * 5
    raw = _weight(rng, qtype, n, k)
    laid = R.lay_out_rows16(raw, n, k, qtype)
    ids = rng.integers(0, n, 9).astype(np.int32)
    ids[0], ids[1] = 0, n - 1
    want = poisoned((ids.size, k))
    run_host(
        G.gather_packed.instantiate(QTYPE=qtype, BLOCK=128),
        (ids.size,),
        {"table": raw, "lut": np.zeros(1, np.float32), "ids": ids, "out": want},
        {"cols": k, "row_bytes": raw.reshape(n, -1).shape[1], "rows": n},
    )
    got = poisoned((ids.size, k))
    run_host(R.gather_q8_rows16.instantiate(QTYPE=qtype, BLOCK=128), (ids.size,), {"table": laid, "ids": ids, "out": got}, {"cols": k, "rows": n})
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    np.testing.assert_array_equal(got, dequantize(raw.reshape(-1), TYPES[qtype]).reshape(n, k)[ids])
