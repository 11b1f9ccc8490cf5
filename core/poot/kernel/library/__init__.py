"""Synthesized kernels: templates with compile-time parameters (dtypes, block sizes, quant types)."""
