"""Qwen2 (q/k/v biases), Qwen3 (q/k norms), and their MoE variants Qwen2-MoE (shared expert with a
sigmoid gate) and Qwen3-MoE."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from poot.graph.compose import MoeConfig
from poot.graph.rope import RopeConfig
from poot.models import ConfigError, DecoderConfig, DecoderFamily, LayerConfig
from poot.models.config import Gguf, check_heads, hf_int, hf_layers, hf_rope

__all__ = ["QwenFamily"]

QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

GGUF_ARCHS = ("qwen2", "qwen3", "qwen2moe", "qwen3moe")


class QwenFamily(DecoderFamily):
    name = "qwen"
    gguf_architectures = GGUF_ARCHS
    hf_architectures = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
    hf_tensor_names = MappingProxyType(
        {
            "self_attn.q_norm": "attn_q_norm",
            "self_attn.k_norm": "attn_k_norm",
            "mlp.gate": "ffn_gate_inp",
            "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
            "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
            "mlp.shared_expert.up_proj": "ffn_up_shexp",
            "mlp.shared_expert.down_proj": "ffn_down_shexp",
            "mlp.experts.{E}.gate_proj": "ffn_gate_exps",
            "mlp.experts.{E}.up_proj": "ffn_up_exps",
            "mlp.experts.{E}.down_proj": "ffn_down_exps",
        }
    )
    # byte-level vocabularies split as Qwen2's tokenizer.json splits (single digits)
    pre_tokenizers = MappingProxyType(dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), QWEN2_SPLIT))

    def config_from_gguf(self, md: Mapping[str, Any], weights: Any) -> DecoderConfig:
        g = Gguf(md)
        heads = g.int("attention.head_count")
        kv = g.int("attention.head_count_kv", heads)
        check_heads(heads, kv, f"GGUF {g.arch}")
        hidden = g.int("embedding_length")
        head_dim = g.int("attention.key_length", hidden // heads)
        rope = RopeConfig(g.int("rope.dimension_count", head_dim), g.float("rope.freq_base", 10000.0), "neox")
        experts = g.int("expert_count", 0)
        moe = None
        if experts:
            # llama.cpp normalises Qwen3-MoE's chosen weights and leaves Qwen2-MoE's as they are
            moe = MoeConfig(experts, g.int("expert_used_count"), "softmax", g.arch == "qwen3moe")
        n = g.layers(weights)
        return DecoderConfig(
            self.name,
            g.arch,
            g.vocab(),
            hidden,
            heads,
            kv,
            head_dim,
            g.int("feed_forward_length", 0),
            tuple(LayerConfig(None, rope, moe is not None) for _ in range(n)),
            g.float("attention.layer_norm_rms_epsilon", 1e-6),
            qk_norm=g.arch.startswith("qwen3"),
            moe=moe,
            moe_ffn=g.int("expert_feed_forward_length", 0),
            shared_ffn=g.int("expert_shared_feed_forward_length", 0),
            max_context=g.int("context_length", 32768),
        )

    def config_from_hf(self, cfg: Mapping[str, Any], weights: Any) -> DecoderConfig:
        arch = str((cfg.get("architectures") or [cfg.get("model_type", "qwen2")])[0])
        heads, hidden = hf_int(cfg, "num_attention_heads"), hf_int(cfg, "hidden_size")
        kv = hf_int(cfg, "num_key_value_heads", heads)
        check_heads(heads, kv, "config.json")
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        rope = hf_rope(cfg, head_dim)
        n = hf_layers(cfg, weights)
        if cfg.get("use_sliding_window"):
            raise ConfigError("config.json: Qwen's use_sliding_window is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"config.json: hidden_act {cfg.get('hidden_act')!r} is not supported (supported: silu)")
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        moe, dense = None, set()
        if experts:
            moe = MoeConfig(experts, hf_int(cfg, "num_experts_per_tok"), "softmax", bool(cfg.get("norm_topk_prob", False)))
            step = int(cfg.get("decoder_sparse_step") or 1)
            dense = set(cfg.get("mlp_only_layers") or []) | {i for i in range(n) if (i + 1) % step}
        layers = tuple(LayerConfig(None, rope, moe is not None and i not in dense) for i in range(n))
        return DecoderConfig(
            self.name,
            arch,
            hf_int(cfg, "vocab_size"),
            hidden,
            heads,
            kv,
            head_dim,
            int(cfg.get("intermediate_size") or 0),
            layers,
            float(cfg.get("rms_norm_eps", 1e-6)),
            qk_norm="Qwen3" in arch,
            moe=moe,
            moe_ffn=int(cfg.get("moe_intermediate_size") or 0),
            shared_ffn=int(cfg.get("shared_expert_intermediate_size") or 0),
            max_context=int(cfg.get("max_position_embeddings", 32768)),
        )
