"""The shared description of a decoder-only transformer that every family parses its checkpoint into.

Families differ in how they spell their configs and in a handful of switches (norm offsets, sandwich
norms, soft-caps, sliding windows, MoE and MLA); the tracer in ``decoder.py`` reads only this. The
helpers below (``Gguf``, ``hf_int``, ``hf_rope``, ``layers_uniform``, ``check_heads``) are what a
family's config parsing needs from either format.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PootError
from ..graph.compose import MoeConfig
from ..graph.rope import LinearScaling, Llama3Scaling, RopeConfig, YarnScaling

__all__ = ["ConfigError", "LayerConfig", "MlaConfig", "DecoderConfig", "hf_rope", "Gguf", "hf_int", "hf_layers", "layer_count", "layers_uniform", "check_heads"]


class ConfigError(PootError):
    """A checkpoint's configuration is missing a field or asks for something poot does not support."""


@dataclass(frozen=True)
class LayerConfig:
    """What varies per layer: the attention window (None: full), its RoPE, dense MLP or MoE."""

    window: int | None
    rope: RopeConfig | None
    moe: bool = False


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv, a per-head key part without
    RoPE (``nope_dim``) and one RoPE key part shared by all heads (``rope_dim``)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int


@dataclass(frozen=True)
class DecoderConfig:
    family: str
    architecture: str
    vocab_size: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: tuple[LayerConfig, ...]
    norm_eps: float
    activation: str = "silu"
    norm_unit_offset: bool = False  # RMSNorm scales by (1 + w) (Gemma in HF form)
    qk_norm: bool = False
    sandwich_norms: bool = False  # extra norms after attention and after the MLP (Gemma 2/3)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    attn_scale: float | None = None
    embed_scale: float | None = None
    moe: MoeConfig | None = None
    moe_ffn: int = 0
    shared_ffn: int = 0
    mla: MlaConfig | None = None
    max_context: int = 4096
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        """A checkpoint whose numbers cannot describe a model is refused here, by field, before any
        of them sizes a buffer or divides anything."""
        if not self.layers:
            raise ConfigError(f"{self.architecture}: the checkpoint has no layers (its block count is 0)")
        for name in ("vocab_size", "hidden", "heads", "kv_heads", "head_dim", "max_context"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ConfigError(f"{self.architecture}: {name} must be a positive integer, got {getattr(self, name)!r}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ConfigError(f"{self.architecture}: the norms' epsilon (norm_eps) must be a positive number, got {self.norm_eps!r}")
        for i, layer in enumerate(self.layers):
            theta = layer.rope.theta if layer.rope is not None else 1.0
            if not (math.isfinite(theta) and theta > 0):
                raise ConfigError(f"{self.architecture}: layer {i}'s RoPE frequency base must be a positive number, got {theta!r}")

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def kv_dims(self) -> tuple[int, int, int]:
        """(KV heads, key width, value width) of one layer's cache; MLA also caches a shared key part."""
        if self.mla is not None:
            return self.heads, self.mla.nope_dim, self.mla.v_dim
        return self.kv_heads, self.head_dim, self.head_dim


def hf_rope(cfg: Mapping[str, Any], dim: int, layout: str = "neox", layer_type: str | None = None) -> RopeConfig:
    """RoPE from an HF config: ``rope_parameters`` (transformers 5, maybe per layer type) or
    ``rope_theta`` + ``rope_scaling`` (earlier)."""
    params: Mapping[str, Any] | None = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not isinstance(params, Mapping) or "rope_theta" not in params:
        params = dict(cfg.get("rope_scaling") or {}, rope_theta=cfg.get("rope_theta", 10000.0))
    theta = float(params.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or params.get("type") or "default"
    scaling: LinearScaling | Llama3Scaling | YarnScaling | None = None
    omp = int(params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings") or 4096)
    if kind == "default":
        scaling = None
    elif kind == "linear":
        scaling = LinearScaling(float(params["factor"]))
    elif kind == "llama3":
        scaling = Llama3Scaling(float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"]), omp)
    elif kind == "yarn":
        scaling = YarnScaling(
            float(params["factor"]),
            omp,
            float(params.get("beta_fast") or 32),
            float(params.get("beta_slow") or 1),
            params.get("mscale"),
            params.get("mscale_all_dim"),
            params.get("attention_factor"),
            bool(params.get("truncate", True)),
        )
    else:
        raise ConfigError(f"RoPE scaling {kind!r} is not supported (supported: default, linear, llama3, yarn)")
    return RopeConfig(dim, theta, layout, scaling)


class Gguf:
    """``{arch}.key`` lookups in GGUF metadata (the architecture's own keys) with clear errors."""

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

    def layers(self, weights: Any = None) -> int:
        """``{arch}.block_count``, checked against the layers ``weights`` has tensors for
        (``layer_count``)."""
        return layer_count(self.int("block_count"), weights, f"GGUF {self.arch}.block_count")

    def vocab(self) -> int:
        v = self.get("vocab_size")
        return int(v) if v is not None else len(self.md.get("tokenizer.ggml.tokens") or [])


def hf_int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """An integer field of ``config.json`` (``default`` where absent; ConfigError naming it if neither)."""
    v = cfg.get(key, default)
    if v is None:
        raise ConfigError(f"config.json has no '{key}'")
    return int(v)


def layer_count(n: int, weights: Any, where: str) -> int:
    """A config's layer count ``n`` (read from ``where``), refused with a ConfigError where it names
    more layers than the checkpoint has tensors for (``weights.n_layers``, where known), before it
    sizes anything: a corrupted count must not build millions of layers. Fewer pass here (the
    tracer says what is wrong with them; none is ``DecoderConfig``'s to refuse)."""
    have = getattr(weights, "n_layers", 0) or 0
    if have and n > have:
        raise ConfigError(f"the config says {n} layers ({where}), but there are tensors for {have}")
    return n


def hf_layers(cfg: Mapping[str, Any], weights: Any = None) -> int:
    """config.json's ``num_hidden_layers``, checked against the layers ``weights`` has tensors for."""
    return layer_count(hf_int(cfg, "num_hidden_layers"), weights, "config.json num_hidden_layers")


def layers_uniform(n: int, rope: RopeConfig | None, window: int | None = None, moe: bool = False) -> tuple[LayerConfig, ...]:
    """``n`` layers alike: the same window, RoPE and MoE choice."""
    return tuple(LayerConfig(window, rope, moe) for _ in range(n))


def check_heads(heads: int, kv_heads: int, where: str) -> None:
    """ConfigError naming ``where`` unless the query heads are a positive multiple of the KV heads."""
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise ConfigError(f"{where}: {heads} attention heads are not a multiple of {kv_heads} KV heads")
