"""The safetensors reader on files written by the safetensors library: single files, sharded HF
directories, zero-copy views, and typed errors for headers that lie."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from poot.errors import LoadError
from poot.load import open_checkpoint
from poot.load.safetensors import read_safetensors


def _tensors(rng):
    return {
        "model.embed_tokens.weight": rng.standard_normal((10, 8)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((8, 8)).astype(np.float16),
        "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(8).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": rng.integers(-5, 5, (8, 4)).astype(np.int32),
        "model.norm.weight": rng.standard_normal(8).astype(np.float64),
    }


def test_single_file_views_without_copying(rng, tmp_path):
    t = _tensors(rng)
    save_file(t, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    got, meta = read_safetensors(tmp_path / "m.safetensors")
    assert meta == {"format": "pt"} and set(got) == set(t)
    for name, want in t.items():
        raw = got[name].raw()
        assert raw.dtype == want.dtype and raw.shape == want.shape
        np.testing.assert_array_equal(raw, want)
        assert not raw.flags.owndata and not raw.flags.writeable  # a view over the read-only mapping
        np.testing.assert_array_equal(got[name].dequantize(), want.astype(np.float32))


def test_bf16_tensors_dequantize_exactly(rng, tmp_path):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    # write a BF16 tensor by hand through the format: header + raw little-endian bits
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4, 6], "data_offsets": [0, 48]}}).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    t, _ = read_safetensors(tmp_path / "b.safetensors")
    np.testing.assert_array_equal(t["w"].dequantize(), (bits.astype(np.uint32) << 16).view(np.float32))


def test_sharded_directory_with_index(rng, tmp_path):
    t = _tensors(rng)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for f, ns in shards.items():
        save_file({n: t[n] for n in ns}, str(tmp_path / f))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {n: f for f, ns in shards.items() for n in ns}}))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    ck = open_checkpoint(tmp_path)
    assert ck.format == "safetensors" and ck.architecture == "LlamaForCausalLM" and len(ck.files) == 2
    assert ck.chat_template == "{{ messages }}"
    for n, want in t.items():
        np.testing.assert_array_equal(ck.tensors[n].raw(), want)
    wm = ck.weights
    assert wm.require("attn_q", 0).name == "model.layers.0.self_attn.q_proj.weight"
    assert wm.require("attn_q", 0, "bias").name == "model.layers.0.self_attn.q_proj.bias"
    assert wm.tied_output and not wm.unknown
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(LoadError, match="shard listed in model.safetensors.index.json is missing"):
        open_checkpoint(tmp_path)


def test_directory_without_config(rng, tmp_path):
    save_file(_tensors(rng), str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError, match="no config.json"):
        open_checkpoint(tmp_path)


def _file(tmp_path: Path, header: dict | bytes, data: bytes = b"\0" * 64, n: int | None = None) -> Path:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(h) if n is None else n) + h + data)
    return p


@pytest.mark.parametrize(
    "header,kw,msg",
    [
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}}, {}, "needs 16 bytes but data_offsets span 32"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, {}, "overlap"),
        ({"a": {"dtype": "F32", "shape": [40], "data_offsets": [0, 160]}}, {}, "fall outside the 64 data bytes"),
        ({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, {}, "unknown dtype 'Q4'"),
        ({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, {}, "must be a list of non-negative integers"),
        ({"a": {"dtype": "F32", "shape": [4]}}, {}, "needs dtype, shape and data_offsets"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 8]}}, {}, "fall outside"),
        (b"{not json", {}, "not valid JSON"),
        (b"[1, 2]", {}, "must be a JSON object"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, {"n": 10**9}, "runs past the end"),
        ({"__metadata__": {"k": 1}}, {}, "__metadata__ must map strings to strings"),
    ],
)
def test_headers_that_lie_give_typed_errors(tmp_path, header, kw, msg):
    p = _file(tmp_path, header, **kw)
    with pytest.raises(LoadError, match=msg) as e:
        read_safetensors(p)
    assert str(p) in str(e.value)


def test_truncated_file(tmp_path):
    (tmp_path / "t.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(LoadError, match="truncated"):
        read_safetensors(tmp_path / "t.safetensors")
