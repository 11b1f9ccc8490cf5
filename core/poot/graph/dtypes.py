"""Element types of graph tensors: plain numeric types and packed-quantized weight types.

A packed type (``packed("q4_k")``) names a block layout owned by a quantization descriptor
(poot.quant); the graph only needs to know that such a tensor is a weight that some op dequantizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "DType",
    "f64",
    "f32",
    "f16",
    "bf16",
    "i8",
    "i32",
    "i64",
    "u8",
    "boolean",
    "packed",
    "dtype_of",
    "from_numpy",
    "round_to_bf16",
]


@dataclass(frozen=True)
class DType:
    """An element type. ``kind`` is 'float', 'int', 'uint', 'bool' or 'packed'."""

    name: str
    kind: str
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_packed(self) -> bool:
        return self.kind == "packed"

    @property
    def itemsize(self) -> int:
        if self.is_packed:
            raise TypeError(f"{self.name} is packed: its size is per block, see poot.quant")
        return max(1, self.bits // 8)

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds values of this type (bf16 values are held in float32)."""
        if self.is_packed:
            return np.dtype(np.uint8)
        return np.dtype(_NUMPY[self.name])

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


f64 = DType("f64", "float", 64)
f32 = DType("f32", "float", 32)
f16 = DType("f16", "float", 16)
bf16 = DType("bf16", "float", 16)
i8 = DType("i8", "int", 8)
i32 = DType("i32", "int", 32)
i64 = DType("i64", "int", 64)
u8 = DType("u8", "uint", 8)
boolean = DType("bool", "bool", 8)

_PLAIN = {t.name: t for t in (f64, f32, f16, bf16, i8, i32, i64, u8, boolean)}
_NUMPY = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "bf16": np.float32,
    "i8": np.int8,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "bool": np.bool_,
}


def packed(name: str) -> DType:
    """The packed-quantized weight type with this quantization name (e.g. ``"q4_k"``)."""
    name = name.lower()
    if name in _PLAIN:
        raise ValueError(f"{name} is a plain dtype, not a packed quantization")
    return DType(name, "packed", 0)


def dtype_of(name: str | DType) -> DType:
    """Look a dtype up by name: 'f32', 'bf16', 'i32', ... or a packed quant name such as 'q8_0'."""
    if isinstance(name, DType):
        return name
    key = name.lower()
    return _PLAIN.get(key) or packed(key)


def from_numpy(dt: np.dtype) -> DType:
    """The graph dtype of a numpy array's dtype."""
    dt = np.dtype(dt)
    for t in (f64, f32, f16, i8, i32, i64, u8, boolean):
        if np.dtype(_NUMPY[t.name]) == dt:
            return t
    raise TypeError(f"numpy dtype {dt} has no graph dtype")


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    a = np.array(x, dtype=np.float32, order="C", ndmin=1)
    bits = a.view(np.uint32)
    nan = np.isnan(a)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    out = (rounded & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(nan, np.float32(np.nan), out).reshape(np.shape(x))
