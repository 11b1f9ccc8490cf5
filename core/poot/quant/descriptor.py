"""The Quantization descriptor: the one place that knows a packed block layout."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Quantization"]


@dataclass(frozen=True)
class Quantization:
    """A packed weight type.

    A row of ``K`` values is ``K // block_size`` blocks of ``block_bytes`` bytes each.
    ``dequantize`` maps uint8 ``[..., nblocks * block_bytes]`` to float32 ``[..., nblocks * block_size]``;
    ``quantize`` is its inverse (lossy) on float32 rows whose length is a multiple of ``block_size``.
    """

    name: str
    gguf_type: int
    block_size: int
    block_bytes: int
    dequantize: Callable[[np.ndarray], np.ndarray]
    quantize: Callable[[np.ndarray], np.ndarray]
    # where each block keeps its float scales: (byte offset, "f16" or "e8m0"); a load checks them for
    # NaN and infinity without dequantizing (a NaN scale makes its whole block NaN)
    scales: tuple[tuple[int, str], ...] = ()

    def row_bytes(self, k: int) -> int:
        if k % self.block_size:
            raise ValueError(f"{self.name}: row length {k} is not a multiple of the block size {self.block_size}")
        return k // self.block_size * self.block_bytes

    def packed_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The uint8 storage shape of a tensor with logical ``shape``."""
        return tuple(shape[:-1]) + (self.row_bytes(shape[-1]),)
