"""Corrupted checkpoints never escape as anything but poot's typed errors, within a time and memory
bound: hypothesis mutates real GGUF headers (SmolLM2's and Gemma 3's, with their tensor tables and
trimmed tokenizer arrays) and safetensors headers, 1,600 cases per run, each loaded as far as its
weights (file, tensor views, roles, config, tokenizer, chat template). ``bench/fuzz_checkpoints.py``
runs ten thousand more with the same property (``poot.testing.fuzz``)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poot.testing.fuzz import INTERESTING, CaseFailed, check_checkpoint, gguf_seed, mutate, safetensors_seed

op = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 2**20), st.integers(0, 255)),
    st.tuples(st.just("u32"), st.integers(0, 2**20), st.sampled_from(INTERESTING)),
    st.tuples(st.just("u64"), st.integers(0, 2**20), st.sampled_from(INTERESTING)),
    st.tuples(st.just("cut"), st.integers(0, 2**20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 2**20), st.integers(1, 16)),
)


class Seeds(list):
    def __repr__(self) -> str:  # hypothesis prints its arguments; the headers are not worth it
        return f"<{len(self)} real GGUF headers>"


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, smollm2_path, gemma3_path):
    d = tmp_path_factory.mktemp("seeds")
    return Seeds([gguf_seed(smollm2_path, d, "SmolLM2"), gguf_seed(gemma3_path, d, "gemma3")])


def test_the_property_catches_what_it_should(seeds, tmp_path, monkeypatch):
    """The check is not vacuous: the unmutated seeds load; a truncated one is refused with a typed
    error; an untyped exception, a case past its time and one past its memory are failures."""
    import time

    import poot.testing.fuzz as fuzz

    for s in seeds:
        assert check_checkpoint(s.write(s.header, tmp_path)).refused is None
        cut = check_checkpoint(s.write(s.header[: len(s.header) // 2], tmp_path))
        assert cut.refused is not None and cut.refused.startswith("LoadError"), cut
    bad = tmp_path / "fuzz.gguf"
    bad.write_bytes(b"GGUF")
    with pytest.raises(CaseFailed, match="Python allocations peaked"):
        check_checkpoint(bad, memory_slack=-(1 << 30))  # an impossible budget: the memory bound is checked
    monkeypatch.setattr(fuzz, "_load_as_far_as_weights", lambda p: {}["no such key"])
    with pytest.raises(CaseFailed, match="KeyError escaped"):
        check_checkpoint(bad)
    monkeypatch.setattr(fuzz, "_load_as_far_as_weights", lambda p: time.sleep(5))
    with pytest.raises(CaseFailed, match="still loading after 0.2 s"):
        check_checkpoint(bad, time_limit=0.2)


@settings(max_examples=1100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.integers(0, 1), ops=st.lists(op, min_size=1, max_size=4))
def test_mutated_real_gguf_headers_give_only_typed_errors(seeds, tmp_path, which, ops):
    s = seeds[which]
    check_checkpoint(s.write(mutate(s.header, ops, len(s.header)), tmp_path))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    ops=st.lists(op, min_size=1, max_size=4),
    text_edit=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.sampled_from(['"', "}", "-1", "1e99", "null", "[", "9999999999"]))),
)
def test_mutated_safetensors_headers_give_only_typed_errors(tmp_path, seed, ops, text_edit):
    s = safetensors_seed(seed)
    data = s.header
    (n,) = struct.unpack_from("<Q", data)
    if text_edit is not None:  # edits inside the JSON text itself
        pos, text = text_edit
        pos = 8 + pos % n
        data = data[:pos] + text.encode() + data[pos + len(text) :]
    check_checkpoint(s.write(mutate(data, ops, 8 + n), tmp_path))


def test_a_corrupted_layer_count_is_refused_before_it_sizes_anything(seeds, tmp_path):
    """A block count far past the layers the file has tensors for (a fuzzed byte made Gemma 3's
    3,473,426) is a typed error at once, not millions of layer configs built first."""
    for s, arch in zip(seeds, ("llama", "gemma3")):
        key = f"{arch}.block_count".encode()
        at = s.header.index(len(key).to_bytes(8, "little") + key) + 8 + len(key) + 4  # past the key and its value's type
        bad = bytearray(s.header)
        bad[at + 2] = 53
        out = check_checkpoint(s.write(bytes(bad), tmp_path))
        assert out.refused is not None and out.refused.startswith("ConfigError") and "block_count" in out.refused, out
        assert out.seconds < 2.0, out
