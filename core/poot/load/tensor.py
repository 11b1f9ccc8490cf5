"""Checkpoint tensors as lazy views over memory-mapped files.

Opening a checkpoint reads headers only. A ``LazyTensor``'s bytes are touched when ``raw()`` or
``dequantize()`` is called (or a device uploads them); ``raw()`` is a zero-copy numpy view.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TensorInfo", "LazyTensor", "PLAIN_STORAGE", "MappedFile"]

# storage types held as plain numpy arrays (bf16 as its raw uint16 bits)
PLAIN_STORAGE: dict[str, np.dtype] = {
    "f64": np.dtype("<f8"),
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "bf16": np.dtype("<u2"),
    "i64": np.dtype("<i8"),
    "i32": np.dtype("<i4"),
    "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"),
    "u8": np.dtype("u1"),
    "bool": np.dtype("?"),
}


class MappedFile:
    """A file mapped read-only; the mapping lives as long as any tensor view of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.size = f.seek(0, 2)
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None

    def view(self, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        if self.map is None:
            return np.zeros(0, dtype)
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=offset)


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives and how it is stored. ``shape`` is the logical shape in numpy order
    (rows last-contiguous); ``storage`` is 'f32', 'bf16', 'q4_k', ... ."""

    name: str
    storage: str
    shape: tuple[int, ...]
    file: Path
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class LazyTensor:
    """A checkpoint tensor; nothing is read until asked."""

    __slots__ = ("info", "_file")

    def __init__(self, info: TensorInfo, file: MappedFile) -> None:
        self.info, self._file = info, file

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def storage(self) -> str:
        return self.info.storage

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def is_packed(self) -> bool:
        return self.info.storage not in PLAIN_STORAGE

    def raw(self) -> np.ndarray:
        """The stored bytes as a read-only view: typed and shaped for plain storage (bf16 as uint16),
        uint8 ``[..., row_bytes]`` for packed quantizations."""
        i = self.info
        if not self.is_packed:
            dt = PLAIN_STORAGE[i.storage]
            return self._file.view(dt, i.offset, i.numel).reshape(i.shape)
        rows = i.numel // i.shape[-1] if i.shape else 1
        return self._file.view(np.dtype(np.uint8), i.offset, i.nbytes).reshape(tuple(i.shape[:-1]) + (i.nbytes // max(rows, 1),))

    def dequantize(self) -> np.ndarray:
        """The values as float32 (a new array), through the storage type's registered dequantizer."""
        from ..quant import quantization

        raw = self.raw()
        if self.info.storage in ("f32", "f16", "bf16") or self.is_packed:
            flat = raw.reshape(raw.shape if raw.ndim else (1,))
            return quantization(self.info.storage).dequantize(flat.view(np.uint8)).reshape(self.info.shape)
        return raw.astype(np.float32)

    def __repr__(self) -> str:
        return f"<LazyTensor {self.info.name} {self.info.storage}{list(self.info.shape)} @{self.info.file.name}+{self.info.offset}>"
