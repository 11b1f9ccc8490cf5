"""The GGUF reader against gguf's own GGUFReader and dequantizers, on both real checkpoints and on
files written by gguf's GGUFWriter; v2, split files, laziness, and typed errors for bad files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from poot.errors import LoadError
from poot.load import open_checkpoint
from poot.load.gguf import read_gguf
from poot.quant import quantization
from poot.testing.checkpoints import write_gguf
from poot.testing.references import gguf_reader


def _compare_with_gguf(path: Path, check_data: bool) -> dict[str, int]:
    ours = open_checkpoint(path)
    ref = gguf_reader(path)
    assert len(ours.tensors) == len(ref.tensors)
    counts: dict[str, int] = {}
    for t in ref.tensors:
        o = ours.tensors[t.name]
        assert o.shape == tuple(int(x) for x in t.shape[::-1]), t.name
        assert o.info.offset == t.data_offset and o.info.nbytes == t.n_bytes, t.name
        assert quantization(o.storage).gguf_type == int(t.tensor_type), t.name
        counts[o.storage] = counts.get(o.storage, 0) + 1
        if check_data:
            want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(o.shape).astype(np.float32)
            got = o.dequantize()
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=t.name)
    for key, f in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = f.contents()
        got = ours.metadata[key]
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, np.asarray(want), err_msg=key)
        else:
            assert got == want, key
    return counts


def test_smollm2_tensors_metadata_and_every_dequantized_tensor_match_gguf(smollm2_path):
    counts = _compare_with_gguf(smollm2_path, check_data=True)
    assert counts == {"q4_1": 210, "f32": 61, "q8_0": 1}


@pytest.mark.slow
def test_gemma3_tensors_metadata_and_every_dequantized_tensor_match_gguf(gemma3_path):
    counts = _compare_with_gguf(gemma3_path, check_data=True)
    assert {"q4_k", "q6_k", "f32"} <= set(counts)


def test_opening_smollm2_reads_no_tensor_data(smollm2_path):
    """Resident memory grows by under 30 MB when the 98 MB checkpoint is opened, and by most of the
    file once every tensor is read (so the measurement can see reads)."""
    code = f"""
import gc
from pathlib import Path
def rss():
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
import numpy, poot.load, poot.quant
poot.quant.quantizations()
gc.collect(); before = rss()
ck = poot.load.open_checkpoint({str(smollm2_path)!r})
gc.collect(); opened = rss()
total = sum(int(t.raw().view(numpy.uint8).sum() % 7) for t in ck.tensors.values())
read = rss()
print(before, opened, read)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    before, opened, read = map(int, out)
    assert opened - before < 30 * 2**20, f"opening grew RSS by {(opened - before) / 2**20:.1f} MB"
    assert read - opened > 60 * 2**20, f"reading every tensor grew RSS by only {(read - opened) / 2**20:.1f} MB"
    print(f"RSS: open +{(opened - before) / 2**20:.1f} MB, read all +{(read - opened) / 2**20:.1f} MB")


def _synthetic(rng, path: Path, types=("f32", "f16", "bf16", "q8_0", "q4_0"), extra=None):
    specs, values = [], {}
    for i, st in enumerate(types):
        shape = (3, 64)
        x = rng.standard_normal(shape).astype(np.float32)
        q = quantization(st)
        if st == "f32":
            raw = x
        elif st == "f16":
            raw = x.astype(np.float16)
        elif st == "bf16":
            raw = q.quantize(x).view(np.uint16)
        else:
            raw = q.quantize(x)
        specs.append((f"blk.{i}.attn_q.weight", st, shape, raw))
        values[f"blk.{i}.attn_q.weight"] = q.dequantize(q.quantize(x))
    md = {"llama.block_count": len(types), "general.name": "synthetic", "tokenizer.ggml.tokens": ["a", "b", "ü"]}
    md.update(extra or {})
    write_gguf(path, "llama", md, specs)
    return values


def test_synthetic_file_round_trips(rng, tmp_path):
    values = _synthetic(rng, tmp_path / "m.gguf")
    ck = open_checkpoint(tmp_path / "m.gguf")
    assert ck.architecture == "llama" and ck.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ü"]
    for name, want in values.items():
        np.testing.assert_array_equal(ck.tensors[name].dequantize(), want)
    assert ck.weights.n_layers == len(values) and not ck.weights.unknown


def test_version_2_reads_like_version_3(rng, tmp_path):
    values = _synthetic(rng, tmp_path / "v3.gguf")
    data = bytearray((tmp_path / "v3.gguf").read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    (tmp_path / "v2.gguf").write_bytes(bytes(data))
    g = read_gguf(tmp_path / "v2.gguf")
    assert g.version == 2
    for name, want in values.items():
        np.testing.assert_array_equal(g.tensors[name].dequantize(), want)


def test_split_files(rng, tmp_path):
    x = [rng.standard_normal((2, 32)).astype(np.float32) for _ in range(3)]
    names = [f"blk.{i}.attn_k.weight" for i in range(3)]
    write_gguf(
        tmp_path / "m-00001-of-00002.gguf",
        "llama",
        {"llama.block_count": 3},
        [(names[0], "f32", (2, 32), x[0]), (names[1], "f32", (2, 32), x[1])],
        split=(0, 2, 3),
    )
    write_gguf(tmp_path / "m-00002-of-00002.gguf", "llama", {}, [(names[2], "f32", (2, 32), x[2])], split=(1, 2, 3))
    ck = open_checkpoint(tmp_path / "m-00001-of-00002.gguf")
    assert len(ck.files) == 2 and ck.metadata["llama.block_count"] == 3
    for n, v in zip(names, x):
        np.testing.assert_array_equal(ck.tensors[n].raw(), v)
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(LoadError, match="split part 2 of 2 is missing"):
        open_checkpoint(tmp_path / "m-00001-of-00002.gguf")


# -- typed errors for each kind of damage ----------------------------------------------------------


@pytest.fixture
def good(rng, tmp_path) -> bytes:
    _synthetic(rng, tmp_path / "good.gguf", types=("f32", "q8_0"))
    return (tmp_path / "good.gguf").read_bytes()


def _damage(good: bytes, kind: str) -> bytes:
    d = bytearray(good)
    if kind == "magic":
        d[0:4] = b"GGUX"
    elif kind == "version":
        d[4:8] = (7).to_bytes(4, "little")
    elif kind == "v1":
        d[4:8] = (1).to_bytes(4, "little")
    elif kind == "truncated-header":
        d = d[:40]
    elif kind == "string-past-end":
        i = d.index(b"synthetic") - 8  # the length of general.name's value
        d[i : i + 8] = (10**12).to_bytes(8, "little")
    elif kind == "key-past-end":
        i = d.index(b"general.name") - 8
        d[i : i + 8] = (10**12).to_bytes(8, "little")
    elif kind == "array-past-end":
        i = d.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8
        d[i : i + 8] = (2**40).to_bytes(8, "little")
    elif kind == "tensor-count-lie":
        d[8:16] = (10**9).to_bytes(8, "little")
    elif kind in ("offset-past-end", "misaligned", "unknown-type", "shape-mismatch"):
        i = d.index(b"blk.1.attn_q.weight") + len(b"blk.1.attn_q.weight")
        # rank u32, 2 dims u64, type u32, offset u64
        if kind == "shape-mismatch":
            d[i + 4 : i + 12] = (50).to_bytes(8, "little")
        elif kind == "unknown-type":
            d[i + 20 : i + 24] = (99).to_bytes(4, "little")
        elif kind == "offset-past-end":
            d[i + 24 : i + 32] = (2**30).to_bytes(8, "little")
        else:
            d[i + 24 : i + 32] = (int.from_bytes(d[i + 24 : i + 32], "little") + 4).to_bytes(8, "little")
    elif kind == "duplicate-name":
        a = d.index(b"blk.1.attn_q.weight")
        d[a + 4] = ord("0")
    elif kind == "data-truncated":
        d = d[:-100]
    return bytes(d)


@pytest.mark.parametrize(
    "kind,msg",
    [
        ("magic", "not a GGUF file"),
        ("version", "unsupported GGUF version 7"),
        ("v1", "GGUF v1"),
        ("truncated-header", "truncated"),
        ("string-past-end", "truncated: metadata 'general.name'"),
        ("key-past-end", r"metadata key #\d+ is 1000000000000 bytes long; at most 65535"),
        ("array-past-end", "truncated: metadata 'tokenizer.ggml.tokens'"),
        ("tensor-count-lie", "truncated: 1000000000 tensor records"),
        ("offset-past-end", "runs past the end of the file"),
        ("misaligned", "misaligned"),
        ("unknown-type", "unknown quant type 99"),
        ("shape-mismatch", "not a multiple of its block size 32"),
        ("duplicate-name", "duplicate tensor name 'blk.0.attn_q.weight'"),
        ("data-truncated", "runs past the end of the file"),
    ],
)
def test_damage_gives_a_typed_error_naming_file_and_field(good, tmp_path, kind, msg):
    bad = tmp_path / f"{kind}.gguf"
    bad.write_bytes(_damage(good, kind))
    with pytest.raises(LoadError, match=msg) as e:
        open_checkpoint(bad)
    assert str(bad) in str(e.value)


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(LoadError, match="no such file"):
        open_checkpoint(tmp_path / "nope.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(LoadError, match="not a GGUF file"):
        open_checkpoint(tmp_path / "empty.gguf")


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("llama.block_count", 0, "no layers"),
        ("llama.rope.freq_base", float("nan"), "RoPE frequency base"),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5, "norm_eps"),
        ("llama.embedding_length", 0, "hidden"),
    ],
)
def test_a_checkpoint_whose_numbers_describe_no_model_is_refused_by_field(smollm2_path, tmp_path, key, value, words):
    """Numbers that parse but describe no model (no layers, a NaN RoPE base, a negative epsilon)
    are a ConfigError naming the field, not a ZeroDivisionError or NaN logits later."""
    from poot.models import family_for
    from poot.models.config import ConfigError
    from poot.testing.checkpoints import copy_gguf_header

    ck = open_checkpoint(copy_gguf_header(gguf_reader(smollm2_path), tmp_path / "bad.gguf", override={key: value}))
    with pytest.raises(ConfigError, match=words):
        family_for(ck.architecture).parse_config(ck)


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_path):
    return gguf_reader(smollm2_path)


@pytest.mark.parametrize(
    "override,keep,error,words",
    [
        ({"llama.vocab_size": 60000}, 1 << 20, "ConfigError", "tensor token_embd.weight is [49152, 576], but the config's vocab_size 60000"),
        ({"llama.block_count": 29}, 1 << 20, "ConfigError", "the config says 29 layers (block_count / num_hidden_layers), but there are tensors for 30"),
        ({"llama.vocab_size": 1000}, 1 << 20, "ConfigError", "the tokenizer has 49152 tokens but the model's vocabulary (vocab_size) is 1000"),
        ({}, 256, "TokenizerError", "tokenizer (tokenizer.ggml.tokens, merges, scores) does not build"),
    ],
)
def test_numbers_that_disagree_with_the_tensors_are_refused_naming_both(smollm2_reader, tmp_path, override, keep, error, words):
    """A vocab_size or layer count other than the tensors' (they had loaded, reading past the
    embedding or dropping a layer), a tokenizer larger than the vocabulary, and a tokenizer that
    cannot be built (a bare Exception from tokenizers) are typed errors naming the file."""
    import poot
    from poot.testing.checkpoints import copy_gguf_header

    path = copy_gguf_header(smollm2_reader, tmp_path / "bad.gguf", keep=keep, override=override, trim_merges=False)  # merges of tokens cut off
    with pytest.raises(Exception) as e:
        poot.load(str(path), "cpu", max_seqs=1, max_context=64, progress=False)
    assert type(e.value).__name__ == error and str(e.value).startswith(str(path)) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("where", ["blk.7.attn_norm.weight", "blk.11.ffn_up.weight"])
def test_nan_weights_are_refused_at_load_by_tensor(smollm2_path, tmp_path, where):
    """A NaN in an f32 norm, or in a Q4_1 block's scale, of a copy of the real checkpoint is a
    LoadError naming the file and the tensor (it had loaded and answered arbitrary tokens)."""
    import shutil

    import poot

    path = shutil.copy(smollm2_path, tmp_path / "nan.gguf")
    t = open_checkpoint(path).tensors[where].info
    assert t.storage in ("f32", "q4_1")
    with open(path, "r+b") as f:
        f.seek(t.offset + (4 * 100 if t.storage == "f32" else 20 * 100))  # element or block 100 (d is a Q4_1 block's first field)
        f.write(np.float32(np.nan).tobytes() if t.storage == "f32" else np.float16(np.nan).tobytes())
    with pytest.raises(LoadError, match=rf"^{path}: tensor {where} holds NaN or infinity at (element|block) 100"):
        poot.load(str(path), "cpu", max_seqs=1, max_context=64, progress=False)


@pytest.mark.parametrize(
    "kind,words",
    [
        ("name", r"name of tensor #0 is 300 bytes long; at most 255 are allowed"),
        ("token", r"metadata 'tokenizer.ggml.tokens'\[1\] is 70000 bytes long; at most 65536 are allowed"),
        ("not-utf8", r"metadata 'general.description' \(70000 bytes\) is not UTF-8"),
    ],
)
def test_over_long_names_tokens_and_strings_are_refused_by_field(tmp_path, kind, words):
    """A tensor name past 255 bytes, a token past 64 KiB, and a string past 64 KiB that is not UTF-8
    are refused naming the field, before they are decoded (a damaged length had been decoded at
    three bytes of memory a byte); a long UTF-8 string is read."""
    import numpy as np

    from poot.testing.checkpoints import write_gguf

    name = "w" * 300 if kind == "name" else "w.weight"
    md = {"tokenizer.ggml.tokens": ["a", "b" * 70_000]} if kind == "token" else {}
    path = write_gguf(tmp_path / "long.gguf", "llama", {**md, "general.description": "x" * 70_000}, [(name, "f32", (4,), np.ones(4, np.float32))])
    if kind == "not-utf8":
        data = path.read_bytes()
        at = data.index(b"x" * 70_000)
        path.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    with pytest.raises(LoadError, match=words):
        open_checkpoint(path)
    if kind == "name":
        ok = write_gguf(tmp_path / "ok.gguf", "llama", {"general.description": "x" * 70_000}, [("w.weight", "f32", (4,), np.ones(4, np.float32))])
        assert open_checkpoint(ok).metadata["general.description"] == "x" * 70_000


def test_a_path_that_is_no_file_or_cannot_be_read_is_a_load_error(tmp_path):
    """A FIFO (or socket) named like a checkpoint, and a directory whose config cannot be reached,
    are LoadErrors naming the path, not OSErrors."""
    import os

    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    with pytest.raises(LoadError, match="not a regular file"):
        open_checkpoint(fifo)
