"""Gemma 2 (soft-capping, sandwich norms, alternating sliding windows) and Gemma 3 (local/global
layers with their own RoPE bases, q/k norms)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from poot.graph.rope import LinearScaling, RopeConfig
from poot.models import ConfigError, DecoderConfig, DecoderFamily, LayerConfig
from poot.models.config import Gguf, check_heads, hf_int, hf_layers, hf_rope

__all__ = ["GemmaFamily", "GEMMA_CHAT_TEMPLATE"]

LOCAL_THETA = 10000.0  # Gemma 3's sliding-window layers


# Gemma's own format (its tokenizer_config.json), for checkpoints that carry no template
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class GemmaFamily(DecoderFamily):
    name = "gemma"
    gguf_architectures = ("gemma2", "gemma3")
    hf_architectures = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    # sandwich norms: post_attention_layernorm normalises the attention's output, the FFN has its own
    # pre and post norms; Gemma 3's q/k norms
    hf_tensor_names = MappingProxyType(
        {
            "post_attention_layernorm": "attn_post_norm",
            "pre_feedforward_layernorm": "ffn_norm",
            "post_feedforward_layernorm": "ffn_post_norm",
            "self_attn.q_norm": "attn_q_norm",
            "self_attn.k_norm": "attn_k_norm",
        }
    )
    default_chat_template = GEMMA_CHAT_TEMPLATE
    # Gemma's SentencePiece vocabulary keeps runs of spaces as spaces and lists merges in rank order
    tokenizer_options = MappingProxyType({"sentencepiece_spaces": "plain"})

    def config_from_gguf(self, md: Mapping[str, Any], weights: Any) -> DecoderConfig:
        g = Gguf(md)
        gen = 3 if g.arch == "gemma3" else 2
        heads = g.int("attention.head_count")
        kv = g.int("attention.head_count_kv", heads)
        check_heads(heads, kv, f"GGUF {g.arch}")
        hidden, n = g.int("embedding_length"), g.layers(weights)
        head_dim = g.int("attention.key_length", hidden // heads)
        window = g.int("attention.sliding_window", 4096)
        glob = RopeConfig(head_dim, g.float("rope.freq_base", 10000.0), "neox", _gguf_scaling(g))
        local = RopeConfig(head_dim, LOCAL_THETA, "neox") if gen == 3 else glob
        # llama.cpp: Gemma 3 layers are sliding except every sixth; Gemma 2 alternates, starting sliding
        period = 6 if gen == 3 else 2
        layers = tuple(LayerConfig(None, glob) if (i + 1) % period == 0 else LayerConfig(window, local) for i in range(n))
        return DecoderConfig(
            self.name,
            g.arch,
            g.vocab(),
            hidden,
            heads,
            kv,
            head_dim,
            g.int("feed_forward_length"),
            layers,
            g.float("attention.layer_norm_rms_epsilon", 1e-6),
            activation="gelu_tanh",
            norm_unit_offset=False,  # the GGUF converter stores Gemma's norm weights as 1 + w
            qk_norm=gen == 3,
            sandwich_norms=True,
            attn_softcap=_cap(g.get("attn_logit_softcapping")),
            final_softcap=_cap(g.get("final_logit_softcapping")),
            attn_scale=1 / math.sqrt(head_dim),
            embed_scale=math.sqrt(hidden),
            max_context=g.int("context_length", 8192),
        )

    def config_from_hf(self, cfg: Mapping[str, Any], weights: Any) -> DecoderConfig:
        cfg = cfg.get("text_config") or cfg
        arch = str((cfg.get("architectures") or [cfg.get("model_type", "gemma")])[0])
        gen = 3 if "3" in str(cfg.get("model_type", arch)) else 2
        heads, hidden = hf_int(cfg, "num_attention_heads"), hf_int(cfg, "hidden_size")
        kv = hf_int(cfg, "num_key_value_heads", heads)
        check_heads(heads, kv, "config.json")
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        n = hf_layers(cfg, weights)
        types = cfg.get("layer_types") or [("sliding_attention" if (i + 1) % (6 if gen == 3 else 2) else "full_attention") for i in range(n)]
        window = int(cfg.get("sliding_window") or 4096)
        layers = []
        for t in types:
            if t not in ("sliding_attention", "full_attention"):
                raise ConfigError(f"config.json: layer type {t!r} is not supported")
            rope = hf_rope(cfg, head_dim, "neox", t) if gen == 3 else hf_rope(cfg, head_dim)
            if gen == 3 and t == "sliding_attention" and "rope_parameters" not in cfg:
                rope = RopeConfig(head_dim, float(cfg.get("rope_local_base_freq", LOCAL_THETA)), "neox")
            layers.append(LayerConfig(window if t == "sliding_attention" else None, rope))
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ConfigError(f"config.json: activation {act!r} is not supported for Gemma (supported: gelu_pytorch_tanh)")
        scalar = float(cfg.get("query_pre_attn_scalar") or head_dim)
        return DecoderConfig(
            self.name,
            arch,
            hf_int(cfg, "vocab_size"),
            hidden,
            heads,
            kv,
            head_dim,
            hf_int(cfg, "intermediate_size"),
            tuple(layers),
            float(cfg.get("rms_norm_eps", 1e-6)),
            activation="gelu_tanh",
            norm_unit_offset=True,
            qk_norm=gen == 3,
            sandwich_norms=True,
            attn_softcap=_cap(cfg.get("attn_logit_softcapping")),
            final_softcap=_cap(cfg.get("final_logit_softcapping")),
            attn_scale=scalar**-0.5,
            embed_scale=math.sqrt(hidden),
            max_context=int(cfg.get("max_position_embeddings", 8192)),
        )


def _cap(v: Any) -> float | None:
    return float(v) if v else None


def _gguf_scaling(g: Gguf) -> LinearScaling | None:
    kind = g.get("rope.scaling.type")
    if kind == "linear":
        return LinearScaling(g.float("rope.scaling.factor"))
    if kind not in (None, "none"):
        raise ConfigError(f"GGUF {g.arch}: rope scaling {kind!r} is not supported")
    return None
