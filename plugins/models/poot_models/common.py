"""What the families share: reading GGUF keys by architecture, and HF config fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from poot.graph.rope import RopeConfig
from poot.models import ConfigError, LayerConfig

__all__ = ["Gguf", "hf_int", "layers_uniform", "check_heads"]


class Gguf:
    """``{arch}.key`` lookups in GGUF metadata with clear errors."""

    def __init__(self, md: Mapping[str, Any]) -> None:
        self.md = md
        self.arch = str(md.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        v = self.md.get(f"{self.arch}.{key}")
        return default if v is None else v

    def need(self, key: str) -> Any:
        v = self.md.get(f"{self.arch}.{key}")
        if v is None:
            raise ConfigError(f"GGUF metadata has no {self.arch}.{key}")
        return v

    def int(self, key: str, default: int | None = None) -> int:
        v = self.get(key, default)
        if v is None:
            raise ConfigError(f"GGUF metadata has no {self.arch}.{key}")
        if hasattr(v, "__len__"):  # per-layer arrays: these families use one value for all layers
            vals = {int(x) for x in v}
            if len(vals) != 1:
                raise ConfigError(f"{self.arch}.{key} varies per layer ({sorted(vals)}), which this family does not support")
            return vals.pop()
        return int(v)

    def float(self, key: str, default: float | None = None) -> float:
        v = self.get(key, default)
        if v is None:
            raise ConfigError(f"GGUF metadata has no {self.arch}.{key}")
        return float(v)

    def vocab(self) -> int:
        v = self.get("vocab_size")
        return int(v) if v is not None else len(self.md.get("tokenizer.ggml.tokens") or [])


def hf_int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ConfigError(f"config.json has no '{key}'")
    return int(v)


def layers_uniform(n: int, rope: RopeConfig | None, window: int | None = None, moe: bool = False) -> tuple[LayerConfig, ...]:
    return tuple(LayerConfig(window, rope, moe) for _ in range(n))


def check_heads(heads: int, kv_heads: int, where: str) -> None:
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise ConfigError(f"{where}: {heads} attention heads are not a multiple of {kv_heads} KV heads")
