"""GGUF reader: versions 2 and 3, memory-mapped, lazy, alignment honoured, split files.

Format: ggml's docs/gguf.md. Every length, count and offset is checked against the bytes that are
really there before it is used, so a corrupt or hostile file gives a ``LoadError`` naming the file
and the field, never an IndexError, a numpy error, a huge allocation or a crash.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LoadError
from .tensor import PLAIN_STORAGE, LazyTensor, MappedFile, TensorInfo

__all__ = ["GgufFile", "read_gguf", "open_gguf_split", "GGML_PLAIN_TYPES", "SPLIT_NAME"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 8
MAX_KEY = 2**16 - 1  # the GGUF specification's limit on a key
MAX_NAME = 255  # tensor names: ggml's own limit is 63 bytes (GGML_MAX_NAME); longer is damage
MAX_ELEMENT = 2**16  # a string inside an array (a token, a merge): real ones are far shorter
SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# ggml types stored plainly (the others are packed quantizations from the registry)
GGML_PLAIN_TYPES = {0: "f32", 1: "f16", 24: "i8", 25: "i16", 26: "i32", 27: "i64", 28: "f64", 30: "bf16"}

# GGUF metadata value types: id -> (struct format or special, size)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


@dataclass
class GgufFile:
    """One parsed GGUF file: metadata, tensor table and the mapping they point into."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, LazyTensor]
    alignment: int
    data_offset: int


class _Cursor:
    """Bounds-checked little-endian reads over a mapped file."""

    def __init__(self, mf: MappedFile) -> None:
        self.mf, self.buf, self.pos, self.size = mf, mf.map, 0, mf.size

    def fail(self, what: str) -> LoadError:
        return LoadError(self.mf.path, what)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated: {what} at byte {self.pos} needs {n} bytes, but the file has {self.size - self.pos} left")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str, limit: int | None = None) -> str:
        """A length-prefixed string; ``limit`` caps the length (keys and tensor names are short, so a
        damaged length is refused, not read and then quoted in an error)."""
        n = self.unpack("<Q", f"length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long; at most {limit} are allowed (a damaged length?)")
        self.need(n, f"{what} ({n} bytes)")
        raw = memoryview(self.buf)[self.pos : self.pos + n]  # decoded in place: no copy of the bytes
        try:
            text = str(raw, "utf-8")
        except UnicodeDecodeError:
            # short strings (tokens) may hold bytes that are not UTF-8, kept as surrogate escapes; a
            # long one is damage, and escaping it would take four bytes a byte
            if n > MAX_ELEMENT:
                raise self.fail(f"{what} ({n} bytes) is not UTF-8 (a damaged length?)") from None
            text = str(raw, "utf-8", "surrogateescape")
        finally:
            raw.release()
        self.pos += n
        return text

    def strings(self, count: int, what: str) -> list[str]:
        """An array's ``count`` strings (a vocabulary's tokens and merges: hundreds of thousands), as
        ``string`` reads each of them (element ``what[i]``, at most ``MAX_ELEMENT`` bytes), in one loop
        that names an element only when it is refused."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        length = _LENGTH.unpack_from
        view = memoryview(buf)
        try:
            for i in range(count):
                if pos + 8 > size:
                    self.pos = pos
                    return [*out, self.string(f"{what}[{i}]", MAX_ELEMENT)]  # (raises, naming the element)
                (n,) = length(buf, pos)
                if n > MAX_ELEMENT or pos + 8 + n > size:
                    self.pos = pos
                    return [*out, self.string(f"{what}[{i}]", MAX_ELEMENT)]  # (raises, naming the element)
                raw = view[pos + 8 : pos + 8 + n]
                try:
                    out.append(str(raw, "utf-8"))
                except UnicodeDecodeError:  # kept as surrogate escapes, as ``string`` keeps them
                    out.append(str(raw, "utf-8", "surrogateescape"))
                pos += 8 + n
        finally:
            view.release()
        self.pos = pos
        return out

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == STRING:
            return self.string(what, MAX_ELEMENT if depth else None)
        if vtype == ARRAY:
            if depth >= MAX_NESTING:
                raise self.fail(f"{what}: arrays nested deeper than {MAX_NESTING}")
            etype = self.unpack("<I", f"element type of {what}")
            count = self.unpack("<Q", f"length of {what}")
            if etype in _NP:
                size = np.dtype(_NP[etype]).itemsize
                self.need(count * size, f"{what} ({count} elements of type {etype})")
                arr = np.frombuffer(self.buf, dtype=_NP[etype], count=count, offset=self.pos).copy()
                self.pos += count * size
                return arr
            if etype not in (STRING, ARRAY):
                raise self.fail(f"{what}: unknown array element type {etype}")
            # every string or array element takes at least 8 bytes (its length)
            self.need(count * 8, f"{what} ({count} elements)")
            if etype == STRING:
                return self.strings(count, what)
            return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise self.fail(f"{what}: unknown value type {vtype}")


_LENGTH = struct.Struct("<Q")  # a string's length


def _storage_of(ggml_type: int) -> tuple[str, int, int] | None:
    """(storage name, block size, block bytes) for a ggml type id, or None when unknown."""
    if ggml_type in GGML_PLAIN_TYPES:
        name = GGML_PLAIN_TYPES[ggml_type]
        return name, 1, PLAIN_STORAGE[name].itemsize
    from ..quant import quantizations

    for q in quantizations().values():
        if q.gguf_type == ggml_type and q.name not in PLAIN_STORAGE:
            return q.name, q.block_size, q.block_bytes
    return None


def _known_types() -> str:
    from ..quant import quantizations

    names = sorted(set(GGML_PLAIN_TYPES.values()) | set(quantizations()))
    return ", ".join(names)


def read_gguf(path: str | Path) -> GgufFile:
    """Parse one GGUF file's header and tensor table; tensor data stays mapped, unread."""
    path = Path(path)
    try:
        mf = MappedFile(path)
    except OSError as e:
        raise LoadError(path, f"cannot open: {e.strerror or e}") from None
    c = _Cursor(mf)
    if mf.size < 4 or mf.map[:4] != MAGIC:
        head = bytes(mf.map[:4]) if mf.map is not None else b""
        raise LoadError(path, f"not a GGUF file: magic is {head!r}, expected {MAGIC!r}")
    c.pos = 4
    version = c.unpack("<I", "version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
            raise LoadError(path, "big-endian GGUF is not supported; convert it to little-endian")
        hint = " (GGUF v1 predates 64-bit counts; re-convert the model)" if version == 1 else ""
        raise LoadError(path, f"unsupported GGUF version {version}: poot reads versions 2 and 3{hint}")
    n_tensors = c.unpack("<Q", "tensor count")
    n_kv = c.unpack("<Q", "metadata count")
    # a key/value needs >= 12 bytes, a tensor record >= 24: counts past that are lies
    c.need(n_kv * 12, f"{n_kv} metadata entries")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key #{i}", MAX_KEY)
        vtype = c.unpack("<I", f"type of metadata '{key}'")
        if key in metadata:
            raise LoadError(path, f"duplicate metadata key '{key}'")
        metadata[key] = c.value(vtype, f"metadata '{key}'")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise LoadError(path, f"general.alignment must be a power of two, got {alignment!r}")
    c.need(n_tensors * 24, f"{n_tensors} tensor records")
    records = []
    for i in range(n_tensors):
        name = c.string(f"name of tensor #{i}", MAX_NAME)
        n_dims = c.unpack("<I", f"rank of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            raise LoadError(path, f"tensor '{name}' has rank {n_dims}; GGUF allows 1..{MAX_DIMS}")
        ne = [c.unpack("<Q", f"dimension {d} of tensor '{name}'") for d in range(n_dims)]
        ggml_type = c.unpack("<I", f"type of tensor '{name}'")
        offset = c.unpack("<Q", f"offset of tensor '{name}'")
        records.append((name, ne, ggml_type, offset))
    data_offset = (c.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, LazyTensor] = {}
    for name, ne, ggml_type, offset in records:
        if name in tensors:
            raise LoadError(path, f"duplicate tensor name '{name}'")
        st = _storage_of(ggml_type)
        if st is None:
            raise LoadError(path, f"tensor '{name}' has unknown quant type {ggml_type} (known: {_known_types()})")
        storage, block, block_bytes = st
        if any(d == 0 for d in ne) or any(d >= 1 << 40 for d in ne):
            raise LoadError(path, f"tensor '{name}' has impossible dimensions {ne}")
        if ne[0] % block:
            raise LoadError(path, f"tensor '{name}' ({storage}) has rows of {ne[0]} values, not a multiple of its block size {block}")
        numel = 1
        for d in ne:
            numel *= d
        nbytes = numel // block * block_bytes
        if offset % alignment:
            raise LoadError(path, f"tensor '{name}' is misaligned: offset {offset} is not a multiple of {alignment}")
        start = data_offset + offset
        if start + nbytes > mf.size:
            raise LoadError(path, f"tensor '{name}' ({storage}{list(reversed(ne))}, {nbytes} bytes at {start}) runs past the end of the file ({mf.size} bytes)")
        info = TensorInfo(name, storage, tuple(reversed(ne)), path, start, nbytes)
        tensors[name] = LazyTensor(info, mf)
    return GgufFile(path, version, metadata, tensors, alignment, data_offset)


def open_gguf_split(path: str | Path) -> tuple[list[GgufFile], dict[str, Any], dict[str, LazyTensor]]:
    """Open a GGUF that may be split (``name-00001-of-00003.gguf``): every part, the first part's
    metadata, and the union of their tensors."""
    path = Path(path)
    first = read_gguf(path)
    count = int(first.metadata.get("split.count", 1) or 1)
    if count == 1:
        return [first], first.metadata, dict(first.tensors)
    m = SPLIT_NAME.match(path.name)
    if not m:
        raise LoadError(path, f"split.count is {count} but the file name does not follow NAME-00001-of-{count:05d}.gguf")
    if int(m["count"]) != count:
        raise LoadError(path, f"split.count is {count} but the file name says {int(m['count'])} parts")
    parts = []
    for no in range(count):
        p = path.with_name(f"{m['stem']}-{no + 1:05d}-of-{count:05d}.gguf")
        if not p.exists():
            raise LoadError(p, f"split part {no + 1} of {count} is missing")
        part = first if p == path else read_gguf(p)
        if int(part.metadata.get("split.no", -1)) != no or int(part.metadata.get("split.count", -1)) != count:
            raise LoadError(p, f"split metadata says part {part.metadata.get('split.no')} of {part.metadata.get('split.count')}, expected {no} of {count}")
        parts.append(part)
    tensors: dict[str, LazyTensor] = {}
    for part in parts:
        for name, t in part.tensors.items():
            if name in tensors:
                raise LoadError(part.path, f"tensor '{name}' also appears in {tensors[name].info.file.name}")
            tensors[name] = t
    want = first.metadata.get("split.tensors.count")
    if want is not None and int(want) != len(tensors):
        raise LoadError(path, f"split.tensors.count is {want} but the parts hold {len(tensors)} tensors")
    return parts, parts[0].metadata, tensors
