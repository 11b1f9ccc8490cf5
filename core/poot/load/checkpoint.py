"""Open any checkpoint: a GGUF file (possibly split) or a safetensors model directory (or file)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LoadError
from .gguf import open_gguf_split
from .roles import WeightMap
from .safetensors import open_hf_directory, read_safetensors
from .tensor import LazyTensor

__all__ = ["Checkpoint", "open_checkpoint"]


@dataclass
class Checkpoint:
    """A checkpoint's metadata and lazy tensors. ``metadata`` is the GGUF key/values, or the HF
    ``config.json`` (with ``tokenizer_config.json`` under ``"tokenizer_config"`` when present)."""

    path: Path
    format: str  # "gguf" | "safetensors"
    metadata: dict[str, Any]
    tensors: dict[str, LazyTensor]
    files: list[Path]
    weights: WeightMap = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def architecture(self) -> str:
        if self.format == "gguf":
            arch = self.metadata.get("general.architecture")
            if not isinstance(arch, str):
                raise LoadError(self.path, "metadata has no general.architecture")
            return arch
        archs = self.metadata.get("architectures") or []
        if archs and isinstance(archs, list) and isinstance(archs[0], str):
            return archs[0]
        mt = self.metadata.get("model_type")
        if isinstance(mt, str):
            return mt
        raise LoadError(self.path / "config.json", "config has neither architectures nor model_type")

    @property
    def has_tokenizer(self) -> bool:
        if self.format == "gguf":
            return "tokenizer.ggml.model" in self.metadata and "tokenizer.ggml.tokens" in self.metadata
        return (self.path / "tokenizer.json").exists() or (self.path / "tokenizer.model").exists()

    @property
    def chat_template(self) -> str | None:
        if self.format == "gguf":
            t = self.metadata.get("tokenizer.chat_template")
            return t if isinstance(t, str) else None
        t = (self.metadata.get("tokenizer_config") or {}).get("chat_template")
        if isinstance(t, list):  # several named templates: the default one
            t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
        return t if isinstance(t, str) else None


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open ``path`` without reading tensor data: a .gguf file, a model directory with config.json,
    or a single .safetensors file."""
    p = Path(path)
    if not p.exists():
        raise LoadError(p, "no such file or directory")
    if p.is_dir():
        config, tensors, files = open_hf_directory(p)
        tk = p / "tokenizer_config.json"
        if tk.exists():
            try:
                config["tokenizer_config"] = json.loads(tk.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise LoadError(tk, f"cannot read tokenizer config: {e}") from None
        ck = Checkpoint(p, "safetensors", config, tensors, files)
        ck.weights = WeightMap.from_hf(tensors, str(p), _family_names(ck))
        return ck
    if not p.is_file():
        raise LoadError(p, "not a regular file or a directory: give a .gguf file or a safetensors model directory")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise LoadError(p, f"cannot read it: {e.strerror or e}") from None
    if head == b"GGUF" or p.suffix == ".gguf":
        parts, meta, tensors = open_gguf_split(p)
        ck = Checkpoint(p, "gguf", meta, tensors, [x.path for x in parts])
        ck.weights = WeightMap.from_gguf(tensors, str(p))
        return ck
    if p.suffix == ".safetensors":
        tensors, meta = read_safetensors(p)
        ck = Checkpoint(p, "safetensors", dict(meta), tensors, [p])
        ck.weights = WeightMap.from_hf(tensors, str(p), _family_names(ck))
        return ck
    raise LoadError(p, f"not a checkpoint poot can read: expected a .gguf file or a safetensors model directory (starts with {head!r})")


def _family_names(ck: Checkpoint) -> Mapping[str, str]:
    """The Hugging Face tensor names of the family serving ``ck``'s architecture, if it names one."""
    from ..models.family import hf_tensor_names_for

    try:
        arch = ck.architecture
    except LoadError:
        return {}
    return hf_tensor_names_for(arch)
