"""Phi-3: fused q/k/v and gate/up projections, partial rotary, sliding window."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from poot.graph.rope import RopeConfig
from poot.models import ConfigError, DecoderConfig, DecoderFamily
from poot.models.config import Gguf, check_heads, hf_int, hf_layers, hf_rope, layers_uniform

__all__ = ["Phi3Family"]


class Phi3Family(DecoderFamily):
    name = "phi3"
    gguf_architectures = ("phi3",)
    hf_architectures = ("Phi3ForCausalLM",)
    # q, k and v in one tensor, gate and up in one (as its GGUF keeps them)
    hf_tensor_names = MappingProxyType({"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"})

    def config_from_gguf(self, md: Mapping[str, Any], weights: Any) -> DecoderConfig:
        g = Gguf(md)
        if weights.get("rope_factors_long", 0) is not None or weights.get("rope_factors_short", 0) is not None:
            raise ConfigError("GGUF phi3: LongRoPE (rope_factors_long/short) is not supported")
        heads = g.int("attention.head_count")
        kv = g.int("attention.head_count_kv", heads)
        check_heads(heads, kv, "GGUF phi3")
        hidden = g.int("embedding_length")
        head_dim = hidden // heads
        rope = RopeConfig(g.int("rope.dimension_count", head_dim), g.float("rope.freq_base", 10000.0), "neox")
        window = g.get("attention.sliding_window")
        return DecoderConfig(
            self.name,
            "phi3",
            g.vocab(),
            hidden,
            heads,
            kv,
            head_dim,
            g.int("feed_forward_length"),
            layers_uniform(g.layers(weights), rope, int(window) if window else None),
            g.float("attention.layer_norm_rms_epsilon", 1e-5),
            max_context=g.int("context_length", 4096),
        )

    def config_from_hf(self, cfg: Mapping[str, Any], weights: Any) -> DecoderConfig:
        heads, hidden = hf_int(cfg, "num_attention_heads"), hf_int(cfg, "hidden_size")
        kv = hf_int(cfg, "num_key_value_heads", heads)
        check_heads(heads, kv, "config.json")
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        rot = int(head_dim * float(cfg.get("partial_rotary_factor", 1.0)))
        params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if (params.get("rope_type") or params.get("type")) in ("longrope", "su"):
            raise ConfigError("config.json: Phi-3 LongRoPE scaling is not supported")
        window = cfg.get("sliding_window")
        return DecoderConfig(
            self.name,
            "Phi3ForCausalLM",
            hf_int(cfg, "vocab_size"),
            hidden,
            heads,
            kv,
            head_dim,
            hf_int(cfg, "intermediate_size"),
            layers_uniform(hf_layers(cfg, weights), hf_rope(cfg, rot), int(window) if window else None),
            float(cfg.get("rms_norm_eps", 1e-5)),
            max_context=int(cfg.get("max_position_embeddings", 4096)),
        )
