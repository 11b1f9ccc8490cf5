"""Corrupted checkpoints never escape as anything but LoadError: hypothesis mutates real GGUF headers
(SmolLM2's and Gemma 3's, with their tensor tables and trimmed tokenizer arrays) and safetensors
headers, 1,600 variants per run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poot.errors import LoadError
from poot.load import open_checkpoint
from poot.testing.checkpoints import copy_gguf_header

INTERESTING = [0, 1, 2, 3, 31, 32, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]

op = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("u32"), st.integers(0, 2**20), st.sampled_from(INTERESTING).map(lambda v: v % 2**32)),
    st.tuples(st.just("u64"), st.integers(0, 2**20), st.sampled_from(INTERESTING)),
    st.tuples(st.just("cut"), st.integers(0, 2**20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 2**20), st.integers(1, 16)),
)


def mutate(data: bytes, ops, limit: int) -> bytes:
    d = bytearray(data)
    for kind, pos, val in ops:
        if not d:
            break
        pos %= max(1, min(limit, len(d)))
        if kind == "byte":
            d[pos] = val
        elif kind == "u32":
            d[pos : pos + 4] = val.to_bytes(4, "little")
        elif kind == "u64":
            d[pos : pos + 8] = val.to_bytes(8, "little")
        elif kind == "cut":
            del d[pos:]
        else:
            d[pos:pos] = bytes(range(val))
    return bytes(d)


def check(path: Path) -> None:
    try:
        ck = open_checkpoint(path)
    except LoadError:
        return
    for t in ck.tensors.values():  # a file that opens must give readable, in-bounds views
        raw = t.raw()
        assert raw.nbytes == t.info.nbytes
        assert t.info.offset + t.info.nbytes <= path.stat().st_size
    ck.weights.n_layers  # noqa: B018 - role mapping must not raise either


class Headers(list):
    def __repr__(self) -> str:  # hypothesis prints its arguments; the header bytes are not worth it
        return f"<{len(self)} real GGUF headers>"


@pytest.fixture(scope="module")
def real_headers(tmp_path_factory, smollm2_path, gemma3_path):
    d = tmp_path_factory.mktemp("headers")
    out = Headers()
    for src in (smollm2_path, gemma3_path):
        dst = copy_gguf_header(src, d / (Path(src).stem + ".hdr.gguf"))
        check(dst)
        ck = open_checkpoint(dst)  # the unmutated copy must open, so mutations explore deep paths
        assert len(ck.tensors) > 200
        data = dst.read_bytes()
        # keep only the header in memory; the data region is restored as a sparse hole per example
        hdr_len = min(t.info.offset for t in ck.tensors.values())
        out.append((data[:hdr_len], len(data), hdr_len))
    return out


@settings(max_examples=1100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.integers(0, 1), ops=st.lists(op, min_size=1, max_size=4))
def test_mutated_real_gguf_headers_give_only_load_errors(real_headers, tmp_path, which, ops):
    header, total, hdr_len = real_headers[which]
    bad = mutate(header, ops, hdr_len)
    p = tmp_path / "fuzz.gguf"
    with open(p, "wb") as f:
        f.write(bad)
        f.truncate(len(bad) + (total - hdr_len))
    check(p)


def _safetensors_bytes(rng_seed: int) -> bytes:
    rng = np.random.default_rng(rng_seed)
    tensors, off, blobs = {}, 0, []
    for i, (dt, size) in enumerate([("F32", 4), ("F16", 2), ("BF16", 2), ("I32", 4)]):
        shape = [int(rng.integers(1, 5)), int(rng.integers(1, 5))]
        n = shape[0] * shape[1] * size
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        blobs.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        off += n
    tensors["__metadata__"] = {"format": "pt"}
    h = json.dumps(tensors).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    ops=st.lists(op, min_size=1, max_size=4),
    text_edit=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.sampled_from(['"', "}", "-1", "1e99", "null", "[", "9999999999"]))),
)
def test_mutated_safetensors_headers_give_only_load_errors(tmp_path, seed, ops, text_edit):
    data = _safetensors_bytes(seed)
    (n,) = struct.unpack_from("<Q", data)
    if text_edit is not None:  # edits inside the JSON text itself
        pos, s = text_edit
        pos = 8 + pos % n
        data = data[:pos] + s.encode() + data[pos + len(s) :]
    bad = mutate(data, ops, 8 + n)
    p = tmp_path / "fuzz.safetensors"
    p.write_bytes(bad)
    check(p)
