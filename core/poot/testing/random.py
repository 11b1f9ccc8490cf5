"""Fresh random inputs. A seed is drawn per test (or taken from POOT_TEST_SEED) and reported on failure."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["fresh_seed", "random_tensor"]


def fresh_seed() -> int:
    env = os.environ.get("POOT_TEST_SEED")
    return int(env) if env else int.from_bytes(os.urandom(4), "little")


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "f32", scale: float = 1.0) -> np.ndarray:
    """Gaussian floats (never all zeros) or uniform ints over a small range."""
    if dtype in ("f32", "f64", "f16"):
        x = rng.standard_normal(shape) * scale
        return x.astype({"f32": np.float32, "f64": np.float64, "f16": np.float16}[dtype])
    if dtype in ("i32", "i64", "i8", "u8"):
        lo = 0 if dtype == "u8" else -100
        return rng.integers(lo, 100, size=shape).astype({"i32": np.int32, "i64": np.int64, "i8": np.int8, "u8": np.uint8}[dtype])
    raise ValueError(f"no random generator for dtype {dtype}")
