"""DeepSeek-V2 and V3: multi-head latent attention (a split key, a narrow value head), MoE with
group-limited routing (softmax for V2, sigmoid with a choice bias for V3) and shared experts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from poot.graph.compose import MoeConfig
from poot.models import ConfigError, DecoderConfig, DecoderFamily, LayerConfig, MlaConfig
from poot.models.config import hf_int, hf_layers, hf_rope

__all__ = ["DeepseekFamily"]


class DeepseekFamily(DecoderFamily):
    name = "deepseek"
    gguf_architectures = ("deepseek2",)
    hf_architectures = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
    # multi-head latent attention's projections and norms; the router (V3: with a score bias), the
    # shared experts and the routed ones
    hf_tensor_names = MappingProxyType(
        {
            "self_attn.q_a_proj": "attn_q_a",
            "self_attn.q_a_layernorm": "attn_q_a_norm",
            "self_attn.q_b_proj": "attn_q_b",
            "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
            "self_attn.kv_a_layernorm": "attn_kv_a_norm",
            "self_attn.kv_b_proj": "attn_kv_b",
            "mlp.gate": "ffn_gate_inp",
            "mlp.gate.e_score_correction_bias": "exp_probs_b",
            "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
            "mlp.shared_experts.up_proj": "ffn_up_shexp",
            "mlp.shared_experts.down_proj": "ffn_down_shexp",
            "mlp.experts.{E}.gate_proj": "ffn_gate_exps",
            "mlp.experts.{E}.up_proj": "ffn_up_exps",
            "mlp.experts.{E}.down_proj": "ffn_down_exps",
        }
    )

    def config_from_gguf(self, md: Mapping[str, Any], weights: Any) -> DecoderConfig:
        raise ConfigError(
            "GGUF deepseek2 files store MLA in llama.cpp's absorbed form (attn_k_b/attn_v_b), which poot does not read yet; use the safetensors checkpoint"
        )

    def config_from_hf(self, cfg: Mapping[str, Any], weights: Any) -> DecoderConfig:
        arch = str((cfg.get("architectures") or ["DeepseekV2ForCausalLM"])[0])
        v3 = "V3" in arch
        heads, hidden, n = hf_int(cfg, "num_attention_heads"), hf_int(cfg, "hidden_size"), hf_layers(cfg, weights)
        mla = MlaConfig(
            cfg.get("q_lora_rank"), hf_int(cfg, "kv_lora_rank"), hf_int(cfg, "qk_nope_head_dim"), hf_int(cfg, "qk_rope_head_dim"), hf_int(cfg, "v_head_dim")
        )
        rope = hf_rope(cfg, mla.rope_dim, "interleaved" if cfg.get("rope_interleave", True) else "neox")
        scale = 1 / math.sqrt(mla.nope_dim + mla.rope_dim)
        params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if (params.get("rope_type") or params.get("type")) == "yarn" and params.get("mscale_all_dim"):
            f = float(params["factor"])
            m = 0.1 * float(params["mscale_all_dim"]) * math.log(f) + 1.0 if f > 1 else 1.0
            scale *= m * m
        experts = hf_int(cfg, "n_routed_experts")
        method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
        groups = int(cfg.get("n_group") or 1)
        if method in ("greedy",):
            groups, topk_groups, gscore = 1, 1, "max"
        elif method == "group_limited_greedy":
            topk_groups, gscore = int(cfg.get("topk_group") or 1), "max"
        elif method == "noaux_tc":
            topk_groups, gscore = int(cfg.get("topk_group") or 1), "top2"
        else:
            raise ConfigError(f"config.json: DeepSeek topk_method {method!r} is not supported")
        moe = MoeConfig(
            experts,
            hf_int(cfg, "num_experts_per_tok"),
            "sigmoid" if cfg.get("scoring_func", "sigmoid" if v3 else "softmax") == "sigmoid" else "softmax",
            bool(cfg.get("norm_topk_prob", v3)),
            float(cfg.get("routed_scaling_factor") or 1.0),
            groups,
            topk_groups,
            gscore,
        )
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        layers = tuple(LayerConfig(None, rope, i >= first_dense and i % freq == 0) for i in range(n))
        return DecoderConfig(
            self.name,
            arch,
            hf_int(cfg, "vocab_size"),
            hidden,
            heads,
            heads,
            mla.nope_dim + mla.rope_dim,
            hf_int(cfg, "intermediate_size"),
            layers,
            float(cfg.get("rms_norm_eps", 1e-6)),
            attn_scale=scale,
            moe=moe,
            moe_ffn=hf_int(cfg, "moe_intermediate_size"),
            mla=mla,
            max_context=int(cfg.get("max_position_embeddings", 4096)),
        )
