"""Test utilities shared by core and plugin tests: random tensors with reported seeds, and (later)
synthetic checkpoints. Importable without pytest; ``poot.testing.fixtures`` is the pytest plugin."""

from .random import fresh_seed, random_tensor

__all__ = ["fresh_seed", "random_tensor"]
