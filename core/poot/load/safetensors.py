"""safetensors reader: single files and sharded Hugging Face directories, memory-mapped and lazy.

The header is checked twice: by the ``safetensors`` library (which refuses files whose header lies)
and here, field by field, so that every problem is a ``LoadError`` naming the file and the tensor.
Tensor bytes are then viewed in place through the mapping: nothing is copied at load.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from ..errors import LoadError
from .tensor import PLAIN_STORAGE, LazyTensor, MappedFile, TensorInfo

__all__ = ["read_safetensors", "open_hf_directory", "SAFETENSORS_DTYPES", "INDEX_NAME"]

SAFETENSORS_DTYPES = {
    "F64": "f64",
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "I64": "i64",
    "I32": "i32",
    "I16": "i16",
    "I8": "i8",
    "U8": "u8",
    "BOOL": "bool",
}
INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


def _library_check(path: Path) -> dict[str, str]:
    """Open with the safetensors library: it validates the header and gives the metadata."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # noqa: BLE001 - SafetensorError and friends
        raise LoadError(path, f"invalid safetensors file: {e}") from None


def read_safetensors(path: str | Path) -> tuple[dict[str, LazyTensor], dict[str, str]]:
    """(tensors by name, the ``__metadata__`` strings) of one .safetensors file."""
    path = Path(path)
    try:
        mf = MappedFile(path)
    except OSError as e:
        raise LoadError(path, f"cannot open: {e.strerror or e}") from None
    if mf.size < 8:
        raise LoadError(path, f"truncated: {mf.size} bytes cannot hold a safetensors header length")
    (n,) = struct.unpack_from("<Q", mf.map, 0)
    if n > MAX_HEADER or 8 + n > mf.size:
        raise LoadError(path, f"header length {n} runs past the end of the file ({mf.size} bytes)")
    try:
        header = json.loads(bytes(mf.map[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(path, f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise LoadError(path, "header must be a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise LoadError(path, "__metadata__ must map strings to strings")
    data_start, data_size = 8 + n, mf.size - 8 - n
    tensors: dict[str, LazyTensor] = {}
    spans = []
    for name, e in header.items():
        where = f"tensor '{name}'"
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            raise LoadError(path, f"{where}: entry needs dtype, shape and data_offsets")
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise LoadError(path, f"{where}: unknown dtype {dtype!r} (known: {', '.join(SAFETENSORS_DTYPES)})")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape):
            raise LoadError(path, f"{where}: shape {shape!r} must be a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise LoadError(path, f"{where}: data_offsets {offs!r} must be [begin, end]")
        begin, end = offs
        storage = SAFETENSORS_DTYPES[dtype]
        numel = 1
        for d in shape:
            numel *= d
        want = numel * PLAIN_STORAGE[storage].itemsize
        if not 0 <= begin <= end <= data_size:
            raise LoadError(path, f"{where}: data_offsets [{begin}, {end}] fall outside the {data_size} data bytes")
        if end - begin != want:
            raise LoadError(path, f"{where}: {dtype}{shape} needs {want} bytes but data_offsets span {end - begin}")
        if (data_start + begin) % PLAIN_STORAGE[storage].itemsize:
            raise LoadError(path, f"{where}: data at byte {data_start + begin} is misaligned for {dtype}")
        spans.append((begin, end, name))
        tensors[name] = LazyTensor(TensorInfo(name, storage, tuple(shape), path, data_start + begin, want), mf)
    spans.sort()
    for (b1, e1, n1), (b2, e2, n2) in zip(spans, spans[1:]):
        if b2 < e1:
            raise LoadError(path, f"tensors '{n1}' and '{n2}' overlap (bytes {b2}..{e1})")
    _library_check(path)
    return tensors, meta


def open_hf_directory(path: str | Path) -> tuple[dict[str, Any], dict[str, LazyTensor], list[Path]]:
    """(config.json, tensors, shard files) of a Hugging Face model directory: one
    ``model.safetensors`` or shards listed in ``model.safetensors.index.json``."""
    path = Path(path)
    cfg_path = path / "config.json"
    try:
        found = cfg_path.exists()
    except OSError as e:  # (a directory that cannot be searched)
        raise LoadError(path, f"cannot read the directory: {e.strerror or e}") from None
    if not found:
        raise LoadError(path, "no config.json: a safetensors model directory needs its Hugging Face config")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(cfg_path, f"cannot read config: {e}") from None
    if not isinstance(config, dict):
        raise LoadError(cfg_path, "config must be a JSON object")
    index = path / INDEX_NAME
    if index.exists():
        try:
            idx = json.loads(index.read_text())
            weight_map = idx["weight_map"]
            assert isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AssertionError) as e:
            raise LoadError(index, f"invalid index: {type(e).__name__} {e}".strip()) from None
        shards = sorted(set(weight_map.values()))
        tensors: dict[str, LazyTensor] = {}
        by_shard = {}
        for s in shards:
            sp = path / s
            if Path(s).name != s:
                raise LoadError(index, f"shard name {s!r} must be a file in the model directory")
            if not sp.exists():
                raise LoadError(sp, f"shard listed in {INDEX_NAME} is missing")
            by_shard[s], _ = read_safetensors(sp)
        for name, s in weight_map.items():
            if name not in by_shard[s]:
                raise LoadError(path / s, f"tensor '{name}' is listed in {INDEX_NAME} but not in this shard")
            tensors[name] = by_shard[s][name]
        return config, tensors, [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if len(files) != 1:
        raise LoadError(path, f"expected model.safetensors or {INDEX_NAME}, found {len(files)} .safetensors files")
    tensors, _ = read_safetensors(files[0])
    return config, tensors, files
