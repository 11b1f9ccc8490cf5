"""Synthetic checkpoints: every family built by transformers' own model classes with random weights
(a few layers, narrow widths, odd head counts) and saved as safetensors model directories.

Weights are redrawn at unit scale (not transformers' 0.02 init) so that attention, routing and
soft-caps all matter in the logits, and norms get random gains.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["SYNTHETIC", "build_synthetic"]

_COMMON = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, max_position_embeddings=256, tie_word_embeddings=False)

# name -> (transformers config class, model class, config overrides)
SYNTHETIC: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=8,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "llama-tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(num_attention_heads=3, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, attention_bias=True),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_attention_heads=6, num_key_value_heads=3, head_dim=8, sliding_window=5)),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=5, num_experts_per_tok=2, sliding_window=None),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=6, num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=5, num_key_value_heads=1, head_dim=12)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=40,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            num_experts=6,
            num_experts_per_tok=3,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
        ),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            sliding_window=4,
            query_pre_attn_scalar=10,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=5.0,
            tie_word_embeddings=True,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=4,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            tie_word_embeddings=True,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
            },
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(num_attention_heads=6, num_key_value_heads=2, partial_rotary_factor=0.5, sliding_window=None, pad_token_id=0),
    ),
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=24,
            first_k_dense_replace=1,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
        ),
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=24,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
    ),
}


def build_synthetic(name: str, directory: str | Path, seed: int, dtype: str = "float32", **overrides: Any) -> Path:
    """Build family ``name``'s synthetic checkpoint into ``directory`` (a safetensors model dir),
    its tensors saved as ``dtype`` ('float32', 'bfloat16' or 'float16'); ``overrides`` change its
    config (wider layers, say)."""
    import torch
    import transformers

    cfg_cls, model_cls, _ = SYNTHETIC[name]
    cfg = getattr(transformers, cfg_cls)(**{**_COMMON, **SYNTHETIC[name][2], **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    gemma = "gemma" in name
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in pname or "layernorm" in pname):
                # Gemma scales by (1 + w): random gains around one either way
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn_like(p))
            elif pname.endswith("e_score_correction_bias"):
                p.copy_(0.3 * torch.randn_like(p))
            elif p.ndim >= 2:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
            else:
                p.copy_(0.1 * torch.randn_like(p))
        for bname, buf in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                buf.copy_(0.3 * torch.randn_like(buf))
    out = Path(directory)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    return out
