"""The shared tracer: a ``DecoderConfig`` and a ``WeightMap`` become the Graph of one forward step.

One step serves a batch of sequences, prefill chunks and decode tokens mixed: tokens of all sequences
are flattened into one axis, each with its sequence id, position and KV slot. Every layer writes the
step's keys and values into its paged pools and attends through the block tables. Logits come out
only for the rows asked for (typically each sequence's last token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph import dtypes as dt
from ..graph.builder import GraphBuilder
from ..graph.compose import (
    AttentionConfig,
    AttentionWeights,
    KvState,
    MlpWeights,
    MoeWeights,
    attention_block,
    gated_mlp,
    moe,
    rms_norm,
)
from ..graph.dims import sym
from ..graph.ir import Graph, Value
from ..graph.rope import apply_rope
from ..load.roles import Role, WeightMap
from ..load.tensor import LazyTensor
from .config import ConfigError, DecoderConfig

__all__ = ["StepShapes", "StepBatch", "trace_decoder", "cache_names", "STEP_INPUTS"]

T, B, MB, NB, R = sym("tokens"), sym("batch"), sym("max_blocks"), sym("blocks"), sym("rows")
HR, NBIAS = sym("history_rows"), sym("bias_width")  # token-count rows (one per sequence slot), logit-bias pairs per row
STEP_INPUTS = ("tokens", "positions", "seq_ids", "slots", "ctx_lens", "block_tables", "logit_rows")


@dataclass
class StepBatch:
    """The per-step inputs of a traced decoder (see ``poot.models.STEP_INPUTS``)."""

    tokens: np.ndarray
    positions: np.ndarray
    seq_ids: np.ndarray
    slots: np.ndarray
    ctx_lens: np.ndarray
    block_tables: np.ndarray
    logit_rows: np.ndarray

    def as_inputs(self) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v, dtype=np.int32) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class StepShapes:
    """The paged KV layout a step is traced for."""

    block_size: int = 16
    cache_dtype: str = "f32"
    sample: bool = False  # end the step with sampling: a "tokens" output, one id per logit row
    logprobs: int = 0  # with sampling: also the log-probabilities of the chosen and the top-N tokens


def cache_names(layer: int, mla: bool) -> tuple[str, ...]:
    return (f"k_cache.{layer}", f"v_cache.{layer}") + ((f"kr_cache.{layer}",) if mla else ())


class _Tracer:
    def __init__(self, cfg: DecoderConfig, wm: WeightMap, shapes: StepShapes) -> None:
        self.cfg, self.wm, self.shapes = cfg, wm, shapes
        self.b = GraphBuilder()
        self._w: dict[str, Value] = {}

    # -- weights ------------------------------------------------------------------------------------
    def tensor(self, t: LazyTensor) -> Value:
        if t.name not in self._w:
            self._w[t.name] = self.b.weight(t.name, t.storage, list(t.shape))
        return self._w[t.name]

    def w(self, role: str, layer: int | None = None, param: str = "weight", optional: bool = False) -> Value | None:
        t = self.wm.get(role, layer, param)
        if t is None:
            if optional:
                return None
            raise ConfigError(f"{self.wm.source}: missing tensor for role {Role(role, layer, None, param)}")
        return self.tensor(t)

    def f32(self, v: Value | None) -> Value | None:
        """A weight usable against f32 activations: packed weights stay packed (matmul dequantizes)."""
        if v is None or v.dtype.is_packed or v.dtype == dt.f32:
            return v
        return self.b.cast(v, dt.f32)

    def mat(self, v: Value | None) -> Value | None:
        """A matmul's weight: packed and 16-bit float checkpoint tensors stay as stored (the product
        widens them as it reads), anything computed from them is cast to f32."""
        if v is not None and v.dtype in (dt.f16, dt.bf16) and v.node.op == "weight":
            return v
        return self.f32(v)

    def experts(self, role: str, layer: int) -> Value:
        stacked = self.wm.get(role, layer)
        if stacked is not None:
            return self.f32(self.tensor(stacked))
        per = self.wm.experts(role, layer)
        if not per:
            raise ConfigError(f"{self.wm.source}: layer {layer} has no tensors for {role}")
        parts = [self.b.reshape(self.f32(self.tensor(t)), [1] + list(t.shape)) for t in per]
        return self.b.concat(parts, axis=0)

    def norm(self, x: Value, role: str, layer: int | None) -> Value:
        return rms_norm(self.b, x, self.f32(self.w(role, layer)), self.cfg.norm_eps, self.cfg.norm_unit_offset)

    def check_tensors(self) -> None:
        """The config's numbers against the tensors they describe, before either sizes anything: a
        ``vocab_size`` other than the embedding's rows would read past its end or leave rows unread,
        and a layer count other than the tensors' would drop layers silently."""
        cfg, wm = self.cfg, self.wm
        src = wm.source or "the checkpoint"
        if wm.n_layers > cfg.n_layers:
            raise ConfigError(f"{src}: the config says {cfg.n_layers} layers (block_count / num_hidden_layers), but there are tensors for {wm.n_layers}")
        for role in ("token_embd", "output"):
            t = wm.get(role)
            if t is not None and tuple(t.shape) != (cfg.vocab_size, cfg.hidden):
                raise ConfigError(
                    f"{src}: tensor {wm.names.get(Role(role), t.name)} is {list(t.shape)}, but the config's vocab_size {cfg.vocab_size} "
                    f"and hidden size {cfg.hidden} make it [{cfg.vocab_size}, {cfg.hidden}]"
                )

    # -- the step -----------------------------------------------------------------------------------
    def trace(self) -> Graph:
        self.check_tensors()
        b, cfg = self.b, self.cfg
        ins = {
            "tokens": b.input("tokens", "i32", [T]),
            "positions": b.input("positions", "i32", [T]),
            "seq_ids": b.input("seq_ids", "i32", [T]),
            "slots": b.input("slots", "i32", [T]),
            "ctx_lens": b.input("ctx_lens", "i32", [B]),
            "block_tables": b.input("block_tables", "i32", [B, MB]),
            "logit_rows": b.input("logit_rows", "i32", [R]),
        }
        if self.shapes.sample:  # a token queued as -1 is the one the step before sampled for its sequence (on the device)
            self._count_rows = b.input("count_rows", "i32", [B])
            self._last = b.input("last_tokens", "i32", [HR])
            ins["tokens"] = b.feed_tokens(self._last, ins["tokens"], ins["seq_ids"], self._count_rows)
        embd = self.w("token_embd")
        h = b.cast(b.gather(embd, ins["tokens"]), dt.f32)
        if cfg.embed_scale is not None:
            h = b.mul(h, cfg.embed_scale)
        outputs: dict[str, Value] = {}
        for i, layer in enumerate(cfg.layers):
            pools = [b.input(name, self.shapes.cache_dtype, shape) for name, shape in zip(cache_names(i, cfg.mla is not None), self._cache_shapes())]
            x = self.norm(h, "attn_norm", i)
            if cfg.mla is not None:
                a, new_pools = self.mla_attention(x, i, layer, pools, ins)
            else:
                a, kp, vp = self.attention(x, i, layer, pools, ins)
                new_pools = [kp, vp]
            for name, p in zip(cache_names(i, cfg.mla is not None), new_pools):
                outputs[name] = p
            if cfg.sandwich_norms:
                a = self.norm(a, "attn_post_norm", i)
            h = b.add(h, a)
            x = self.norm(h, "ffn_norm", i)
            f = self.moe(x, i) if layer.moe else self.mlp(x, i)
            if cfg.sandwich_norms:
                f = self.norm(f, "ffn_post_norm", i)
            h = b.add(h, f)
        h = self.norm(h, "output_norm", None)
        rows = b.gather(h, ins["logit_rows"])
        head = self.w("output", optional=True) or embd
        logits = b.linear(rows, self.mat(head))
        if cfg.final_softcap is not None:
            logits = b.mul(b.tanh(b.mul(logits, 1.0 / cfg.final_softcap)), cfg.final_softcap)
        outputs = {"logits": logits, **outputs}
        if self.shapes.sample:
            outputs.update(self.sampling(logits, ins))
        return b.build(outputs)

    def sampling(self, logits: Value, ins: dict[str, Value]) -> dict[str, Value]:
        """The step's suffix: count the new tokens into each sequence's history, then sample one
        token per logit row (and, when asked, log-probabilities), kept as its sequence's latest token
        in ``last_tokens`` (which the next step's tokens queued as -1 read). Only these leave the
        device."""
        b = self.b
        vocab = logits.shape[1]
        counts = b.input("token_counts", "i32", [HR, vocab])
        counts = b.count_tokens(counts, ins["tokens"], ins["seq_ids"], self._count_rows)
        f32 = lambda name: b.input(name, "f32", [R])  # noqa: E731
        i32 = lambda name: b.input(name, "i32", [R])  # noqa: E731
        row_counts = i32("row_count_rows")
        words = -(-vocab.value // 32)
        tokens, _ = b.sample(
            logits=logits,
            counts=counts,
            count_rows=row_counts,
            temperature=f32("temperature"),
            top_k=i32("top_k"),
            top_p=f32("top_p"),
            min_p=f32("min_p"),
            repetition=f32("repetition"),
            presence=f32("presence"),
            frequency=f32("frequency"),
            seeds=i32("seeds"),
            steps=i32("steps"),
            mask=b.input("mask", "i32", [R, words]),
            bias_ids=b.input("bias_ids", "i32", [R, NBIAS]),
            bias_vals=b.input("bias_vals", "f32", [R, NBIAS]),
        )
        out = {"tokens": tokens, "token_counts": counts, "last_tokens": b.keep_tokens(self._last, tokens, row_counts)}
        if self.shapes.logprobs:
            chosen, ids, vals = b.logprobs(logits, tokens, self.shapes.logprobs)
            out.update({"logprob": chosen, "top_ids": ids, "top_logprobs": vals})
        return out

    def _cache_shapes(self) -> list[list]:
        bs, cfg = self.shapes.block_size, self.cfg
        hkv, dk, dv = cfg.kv_dims
        shapes = [[NB, bs, hkv, dk], [NB, bs, hkv, dv]]
        if cfg.mla is not None:
            shapes.append([NB, bs, cfg.mla.rope_dim])
        return shapes

    def attention(self, x: Value, i: int, layer, pools, ins) -> tuple[Value, Value, Value]:  # type: ignore[no-untyped-def]
        cfg, b = self.cfg, self.b
        qkv = self.w("attn_qkv", i, optional=True)
        if qkv is not None:  # Phi-3 keeps q, k and v in one tensor
            nq, nk = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
            q_w, k_w, v_w = (b.slice(qkv, 0, s, e) for s, e in ((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk)))
        else:
            q_w, k_w, v_w = self.w("attn_q", i), self.w("attn_k", i), self.w("attn_v", i)
        w = AttentionWeights(
            self.mat(q_w),
            self.mat(k_w),
            self.mat(v_w),
            self.mat(self.w("attn_output", i)),
            q_bias=self.f32(self.w("attn_q", i, "bias", optional=True)),
            k_bias=self.f32(self.w("attn_k", i, "bias", optional=True)),
            v_bias=self.f32(self.w("attn_v", i, "bias", optional=True)),
            o_bias=self.f32(self.w("attn_output", i, "bias", optional=True)),
            q_norm=self.f32(self.w("attn_q_norm", i)) if cfg.qk_norm else None,
            k_norm=self.f32(self.w("attn_k_norm", i)) if cfg.qk_norm else None,
        )
        acfg = AttentionConfig(
            cfg.heads,
            cfg.kv_heads,
            cfg.head_dim,
            layer.rope,
            window=layer.window,
            softcap=cfg.attn_softcap,
            scale=cfg.attn_scale,
            qk_norm_eps=cfg.norm_eps if cfg.qk_norm else None,
            qk_norm_unit_offset=cfg.norm_unit_offset,
        )
        kv = KvState(pools[0], pools[1], ins["slots"], ins["positions"], ins["seq_ids"], ins["ctx_lens"], ins["block_tables"])
        return attention_block(b, x, w, acfg, kv)

    def mla_attention(self, x: Value, i: int, layer, pools, ins) -> tuple[Value, list[Value]]:  # type: ignore[no-untyped-def]
        cfg, b, m = self.cfg, self.b, self.cfg.mla
        assert m is not None
        H = cfg.heads
        if m.q_lora_rank:
            q = b.linear(self.norm(b.linear(x, self.mat(self.w("attn_q_a", i))), "attn_q_a_norm", i), self.mat(self.w("attn_q_b", i)))
        else:
            q = b.linear(x, self.mat(self.w("attn_q", i)))
        q = b.reshape(q, [T, H, m.nope_dim + m.rope_dim])
        q_nope, q_pe = b.slice(q, -1, 0, m.nope_dim), b.slice(q, -1, m.nope_dim, m.nope_dim + m.rope_dim)
        kv_a = b.linear(x, self.mat(self.w("attn_kv_a_mqa", i)))
        latent = b.slice(kv_a, -1, 0, m.kv_lora_rank)
        k_pe = b.reshape(b.slice(kv_a, -1, m.kv_lora_rank, m.kv_lora_rank + m.rope_dim), [T, 1, m.rope_dim])
        kv = b.linear(self.norm(latent, "attn_kv_a_norm", i), self.mat(self.w("attn_kv_b", i)))
        kv = b.reshape(kv, [T, H, m.nope_dim + m.v_dim])
        k_nope, v = b.slice(kv, -1, 0, m.nope_dim), b.slice(kv, -1, m.nope_dim, m.nope_dim + m.v_dim)
        if layer.rope is not None:
            q_pe = apply_rope(b, q_pe, ins["positions"], layer.rope)
            k_pe = apply_rope(b, k_pe, ins["positions"], layer.rope)
        kp = b.cache_write(pools[0], k_nope, ins["slots"])  # rounded to the pools' type as written
        vp = b.cache_write(pools[1], v, ins["slots"])
        krp = b.cache_write(pools[2], b.reshape(k_pe, [T, m.rope_dim]), ins["slots"])
        att = b.attention(
            b.concat([q_nope, q_pe], axis=-1),
            kp,
            vp,
            k_shared=krp,
            positions=ins["positions"],
            seq_ids=ins["seq_ids"],
            ctx_lens=ins["ctx_lens"],
            block_tables=ins["block_tables"],
            window=layer.window,
            softcap=cfg.attn_softcap,
            scale=cfg.attn_scale if cfg.attn_scale is not None else 1 / math.sqrt(m.nope_dim + m.rope_dim),
        )
        out = b.linear(b.cast(b.reshape(att, [T, H * m.v_dim]), dt.f32), self.mat(self.w("attn_output", i)))
        return out, [kp, vp, krp]

    def mlp(self, x: Value, i: int) -> Value:
        b, cfg = self.b, self.cfg
        gate = self.w("ffn_gate", i, optional=True)
        up = self.w("ffn_up", i)
        if gate is None:  # Phi-3 keeps gate and up in one tensor, gate first
            gate, up = b.slice(up, 0, 0, cfg.ffn), b.slice(up, 0, cfg.ffn, 2 * cfg.ffn)
        return gated_mlp(b, x, MlpWeights(self.mat(gate), self.mat(up), self.mat(self.w("ffn_down", i))), cfg.activation)

    def moe(self, x: Value, i: int) -> Value:
        cfg = self.cfg
        assert cfg.moe is not None
        shared = None
        if self.wm.get("ffn_up_shexp", i) is not None:
            shared = MlpWeights(*(self.mat(self.w(r, i)) for r in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")))
        gate_inp_sh = self.w("ffn_gate_inp_shexp", i, optional=True)
        bias = self.w("exp_probs_b", i, "bias", optional=True)
        w = MoeWeights(
            self.f32(self.w("ffn_gate_inp", i)),
            self.experts("ffn_gate_exps", i),
            self.experts("ffn_up_exps", i),
            self.experts("ffn_down_exps", i),
            choice_bias=self.f32(bias),
            shared=shared,
            shared_gate=self.f32(self.b.reshape(gate_inp_sh, [1, cfg.hidden])) if gate_inp_sh is not None else None,
        )
        return moe(self.b, x, w, cfg.moe)


def trace_decoder(cfg: DecoderConfig, weights: WeightMap, shapes: StepShapes | None = None) -> Graph:
    """The forward-step Graph of a decoder-only model. Inputs: ``STEP_INPUTS`` and each layer's cache
    pools (``cache_names``); outputs: ``logits`` [rows, vocab] and the updated pools."""
    return _Tracer(cfg, weights, shapes or StepShapes()).trace()
