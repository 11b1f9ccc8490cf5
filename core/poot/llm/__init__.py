"""Generation: a model loaded onto a device and a token loop over its compiled step."""

from .simple import SimpleGenerator

__all__ = ["SimpleGenerator"]
