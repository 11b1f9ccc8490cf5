"""Loading checkpoints: GGUF and safetensors readers, lazy mapped tensors, weight roles, model sources.

The package is also callable: ``poot.load(model, device=...)`` gives a ``poot.llm.ModelHandle`` (a
model compiled for a device and ready to generate).
"""

import sys as _sys
import types as _types
from pathlib import Path
from typing import Any as _Any

from .checkpoint import Checkpoint, open_checkpoint
from .roles import Role, WeightMap, gguf_name
from .sources import CATALOG, cache_dir, resolve_model
from .tensor import LazyTensor, TensorInfo

__all__ = ["Checkpoint", "open_checkpoint", "open_model", "Role", "WeightMap", "gguf_name", "CATALOG", "cache_dir", "resolve_model", "LazyTensor", "TensorInfo"]


def open_model(name: str | Path) -> Checkpoint:
    """Open a model by path, catalog name (``SmolLM2``, ``gemma3``) or package name."""
    return open_checkpoint(resolve_model(name))


class _CallableModule(_types.ModuleType):
    def __call__(self, model: str | Path, device: str | None = None, **options: _Any) -> _Any:
        from ..llm.handle import load

        return load(str(model), device, **options)


_sys.modules[__name__].__class__ = _CallableModule
