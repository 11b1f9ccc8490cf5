"""Checkpoint files for tests, written with the format libraries themselves (gguf's GGUFWriter,
safetensors' save_file) so that poot's readers are checked against independent writers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_gguf", "copy_gguf_header", "GgufTensorSpec"]

GgufTensorSpec = tuple[str, str, tuple[int, ...], np.ndarray]  # name, storage, logical shape, raw data


def write_gguf(path: str | Path, arch: str, metadata: Mapping[str, Any], tensors: Sequence[GgufTensorSpec], split: tuple[int, int, int] | None = None) -> Path:
    """Write a GGUF with ``tensors`` given as raw storage (quantized uint8 rows or plain arrays).
    ``split`` = (part index, part count, total tensors) adds the split.* keys."""
    import gguf

    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in metadata.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, list(v))
    if split is not None:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    for name, storage, shape, raw in tensors:
        qtype = _gguf_type(storage)
        raw = np.ascontiguousarray(raw)
        if raw.dtype != np.uint8 and tuple(raw.shape) != tuple(shape):
            raise ValueError(f"{name}: plain data of shape {raw.shape} does not match {shape}")
        w.add_tensor(name, raw, raw_dtype=qtype)  # uint8 rows of a quantized type: the writer derives the logical shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_type(storage: str):  # type: ignore[no-untyped-def]
    from gguf import GGMLQuantizationType as T

    return {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "i8": T.I8, "i16": T.I16, "i32": T.I32, "i64": T.I64, "f64": T.F64}.get(storage) or T[storage.upper()]


def copy_gguf_header(src: Any, dst: str | Path, keep: int = 256, override: Mapping[str, Any] | None = None, trim_merges: bool = True) -> Path:
    """A GGUF with ``src``'s real metadata (arrays cut to ``keep`` items, BPE merges to those of the
    kept tokens unless ``trim_merges`` is off, so the cut tokenizer still builds; scalar keys in ``override``
    given other values of their type) and real tensor table, whose data region is a sparse hole of
    the right size: a real header that parses in milliseconds. ``src`` is a path or a
    ``gguf.GGUFReader`` already open on one (reading a large vocabulary takes gguf seconds)."""
    import gguf

    r = src if isinstance(src, gguf.GGUFReader) else gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    kept = set(r.fields["tokenizer.ggml.tokens"].contents()[:keep]) if "tokenizer.ggml.tokens" in r.fields else set()
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        val = f.contents()
        if key == "tokenizer.ggml.merges" and trim_merges:
            val = [m for m in val if len(m.split(" ")) == 2 and {*m.split(" "), m.replace(" ", "")} <= kept]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, list(val)[:keep], vtype, f.types[-1] if len(f.types) > 1 else None)
        else:
            w.add_key_value(key, (override or {}).get(key, val), vtype)
    for t in r.tensors:
        # a non-uint8 dtype makes the writer take the shape as the logical (numpy-order) shape
        w.add_tensor_info(t.name, [int(x) for x in t.shape[::-1]], np.dtype(np.float32), int(t.n_bytes), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    total = sum(-(-int(t.n_bytes) // 32) * 32 for t in r.tensors)
    with open(dst, "r+b") as f:
        end = f.seek(0, 2)
        f.truncate((end + 31) // 32 * 32 + total)
    return Path(dst)
