"""Packed quantization: block layouts, numpy (de)quantizers, and the registry fed by the quantization hook."""

from .descriptor import Quantization
from .registry import quantization, quantizations

__all__ = ["Quantization", "quantization", "quantizations"]
