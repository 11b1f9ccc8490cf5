"""Loading checkpoints: GGUF and safetensors readers, lazy mapped tensors, weight roles, model sources."""

from pathlib import Path

from .checkpoint import Checkpoint, open_checkpoint
from .roles import Role, WeightMap, gguf_name
from .sources import CATALOG, cache_dir, resolve_model
from .tensor import LazyTensor, TensorInfo

__all__ = ["Checkpoint", "open_checkpoint", "open_model", "Role", "WeightMap", "gguf_name", "CATALOG", "cache_dir", "resolve_model", "LazyTensor", "TensorInfo"]


def open_model(name: str | Path) -> Checkpoint:
    """Open a model by path, catalog name (``SmolLM2``, ``gemma3``) or package name."""
    return open_checkpoint(resolve_model(name))
