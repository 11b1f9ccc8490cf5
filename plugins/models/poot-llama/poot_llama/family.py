"""Llama 2/3/3.1/3.2 (RoPE scaling), SmolLM2, Mistral (sliding window) and Mixtral (MoE)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from poot.graph.compose import MoeConfig
from poot.graph.rope import LinearScaling, RopeConfig, YarnScaling
from poot.models import ConfigError, DecoderConfig, DecoderFamily
from poot.models.config import Gguf, check_heads, hf_int, hf_layers, hf_rope, layers_uniform

__all__ = ["LlamaFamily"]

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class LlamaFamily(DecoderFamily):
    name = "llama"
    gguf_architectures = ("llama", "mistral")
    hf_architectures = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
    # Mixtral's experts and router
    hf_tensor_names = MappingProxyType(
        {
            "block_sparse_moe.gate": "ffn_gate_inp",
            "block_sparse_moe.experts.{E}.w1": "ffn_gate_exps",
            "block_sparse_moe.experts.{E}.w3": "ffn_up_exps",
            "block_sparse_moe.experts.{E}.w2": "ffn_down_exps",
        }
    )
    # byte-level vocabularies split as Llama 3's (and Llama 4's, GPT-4o's) tokenizer.json split
    pre_tokenizers = MappingProxyType(
        {
            **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), LLAMA3_SPLIT),
            **dict.fromkeys(("gpt-4o", "llama4"), GPT4O_SPLIT),
        }
    )

    def config_from_gguf(self, md: Mapping[str, Any], weights: Any) -> DecoderConfig:
        g = Gguf(md)
        heads = g.int("attention.head_count")
        kv = g.int("attention.head_count_kv", heads)
        check_heads(heads, kv, "GGUF llama")
        hidden = g.int("embedding_length")
        head_dim = g.int("attention.key_length", hidden // heads)
        rope_dim = g.int("rope.dimension_count", head_dim)
        factors = None
        freqs = weights.get("rope_freqs")
        if freqs is not None:  # Llama 3.1-style scaling is stored as per-frequency divisors
            factors = tuple(float(x) for x in np.asarray(freqs.dequantize()).reshape(-1))
        scaling = None
        kind = g.get("rope.scaling.type")
        if kind == "linear":
            scaling = LinearScaling(g.float("rope.scaling.factor"))
        elif kind == "yarn":
            scaling = YarnScaling(g.float("rope.scaling.factor"), g.int("rope.scaling.original_context_length"))
        elif kind not in (None, "none"):
            raise ConfigError(f"GGUF llama: rope scaling {kind!r} is not supported")
        # llama.cpp's converter permutes q/k rows for llama: pairs are interleaved in GGUF files
        rope = RopeConfig(rope_dim, g.float("rope.freq_base", 10000.0), "interleaved", scaling, factors)
        experts = g.int("expert_count", 0)
        moe = MoeConfig(experts, g.int("expert_used_count"), "softmax", True) if experts else None
        window = g.get("attention.sliding_window")
        return DecoderConfig(
            "llama",
            g.arch,
            g.vocab(),
            hidden,
            heads,
            kv,
            head_dim,
            g.int("feed_forward_length"),
            layers_uniform(g.layers(weights), rope, int(window) if window else None, moe is not None),
            g.float("attention.layer_norm_rms_epsilon", 1e-5),
            moe=moe,
            moe_ffn=g.int("feed_forward_length") if moe else 0,
            max_context=g.int("context_length", 4096),
        )

    def config_from_hf(self, cfg: Mapping[str, Any], weights: Any) -> DecoderConfig:
        heads, hidden = hf_int(cfg, "num_attention_heads"), hf_int(cfg, "hidden_size")
        kv = hf_int(cfg, "num_key_value_heads", heads)
        check_heads(heads, kv, "config.json")
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        rope = hf_rope(cfg, head_dim)
        window = cfg.get("sliding_window")
        experts = int(cfg.get("num_local_experts") or 0)
        moe = MoeConfig(experts, hf_int(cfg, "num_experts_per_tok"), "softmax", True) if experts else None
        ffn = hf_int(cfg, "intermediate_size")
        return DecoderConfig(
            "llama",
            str((cfg.get("architectures") or ["llama"])[0]),
            hf_int(cfg, "vocab_size"),
            hidden,
            heads,
            kv,
            head_dim,
            ffn,
            layers_uniform(hf_layers(cfg, weights), rope, int(window) if window else None, moe is not None),
            float(cfg.get("rms_norm_eps", 1e-6)),
            activation=_act(cfg),
            moe=moe,
            moe_ffn=ffn if moe else 0,
            max_context=int(cfg.get("max_position_embeddings", 4096)),
        )


def _act(cfg: Mapping[str, Any]) -> str:
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"config.json: hidden_act {act!r} is not supported for this family (supported: silu)")
    return "silu"
