"""Rotary position embedding: frequency tables (plain, linear, Llama-3, YaRN) and the rotation as graph ops.

Frequencies follow the formulas of RoFormer (base ** (-2i/d)), Llama 3.1's band-wise rescaling and
YaRN (arXiv:2309.00071) with its attention factor, as transformers' ``modeling_rope_utils`` computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import dtypes as dt
from .builder import GraphBuilder
from .ir import Value

__all__ = ["LinearScaling", "Llama3Scaling", "YarnScaling", "RopeConfig", "rope_frequencies", "apply_rope"]


@dataclass(frozen=True)
class LinearScaling:
    factor: float


@dataclass(frozen=True)
class Llama3Scaling:
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


@dataclass(frozen=True)
class YarnScaling:
    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class RopeConfig:
    """``dim`` rotated dims (partial rotary when less than the head width), ``layout`` 'neox' pairs
    (i, i + dim/2), 'interleaved' pairs (2i, 2i + 1)."""

    dim: int
    theta: float = 10000.0
    layout: str = "neox"
    scaling: LinearScaling | Llama3Scaling | YarnScaling | None = None
    freq_factors: tuple[float, ...] | None = None  # per-frequency divisors (GGUF's rope_freqs tensor)

    def __post_init__(self) -> None:
        if self.dim <= 0 or self.dim % 2:
            raise ValueError(f"rotary dim must be a positive even number, got {self.dim}")
        if self.layout not in ("neox", "interleaved"):
            raise ValueError(f"rope layout must be 'neox' or 'interleaved', got {self.layout!r}")
        if self.freq_factors is not None and len(self.freq_factors) != self.dim // 2:
            raise ValueError(f"rope freq_factors need {self.dim // 2} entries, got {len(self.freq_factors)}")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(cfg: RopeConfig) -> tuple[np.ndarray, float]:
    """(inverse frequencies [dim/2] float64, attention factor multiplying cos and sin)."""
    d = cfg.dim
    exps = np.arange(0, d, 2, dtype=np.float64) / d
    inv = 1.0 / cfg.theta**exps
    if cfg.freq_factors is not None:
        inv = inv / np.asarray(cfg.freq_factors, dtype=np.float64)
    s = cfg.scaling
    if s is None:
        return inv, 1.0
    if isinstance(s, LinearScaling):
        return inv / s.factor, 1.0
    if isinstance(s, Llama3Scaling):
        low_wl = s.original_max_position / s.low_freq_factor
        high_wl = s.original_max_position / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wl, inv / s.factor, inv)
        smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        return np.where(medium, smoothed, scaled), 1.0
    # YaRN: interpolate low frequencies, keep high ones, ramp between the correction dims
    if s.attention_factor is not None:
        af = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        af = _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    else:
        af = _yarn_mscale(s.factor)

    def correction_dim(rotations: float) -> float:
        return d * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(cfg.theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return inv / s.factor * (1 - keep) + inv * keep, af


def apply_rope(b: GraphBuilder, x: Value, positions: Value, cfg: RopeConfig) -> Value:
    """Rotate ``x`` [T, H, D] by ``positions`` [T] with one ``rope`` op (computed in f32); dims past
    ``cfg.dim`` pass through."""
    head = x.shape[-1]
    if not head.is_static or cfg.dim > head.value:
        raise ValueError(f"rotary dim {cfg.dim} exceeds head width {head}")
    inv, af = rope_frequencies(cfg)
    out = b.rope(b.cast(x, dt.f32), b.cast(positions, dt.i32), inv.astype(np.float32), dim=cfg.dim, layout=cfg.layout, attn_factor=af)
    return b.cast(out, x.dtype)
