"""Compositions over the builder: norms, activations, softmax, gated MLPs, MoE and the attention block.

They emit primitive ops only, so the oracle checks them for free and the planner recognises them
as patterns. Norms, softmax and routing compute in f32 and cast back, as the reference models do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import dtypes as dt
from .builder import GraphBuilder
from .ir import Value
from .rope import RopeConfig, apply_rope

__all__ = [
    "rms_norm",
    "layer_norm",
    "softmax",
    "activation",
    "gated_mlp",
    "MlpWeights",
    "MoeConfig",
    "MoeWeights",
    "moe",
    "AttentionConfig",
    "AttentionWeights",
    "KvState",
    "attention_block",
]


def rms_norm(b: GraphBuilder, x: Value, weight: Value | None, eps: float, unit_offset: bool = False) -> Value:
    """x / sqrt(mean(x²) + eps) * w; ``unit_offset`` scales by (1 + w) as Gemma stores it."""
    xf = b.cast(x, dt.f32)
    ms = b.mean(b.mul(xf, xf), -1, keepdims=True)
    y = b.mul(xf, b.rsqrt(b.add(ms, eps)))
    if weight is not None:
        w = b.cast(weight, dt.f32)
        y = b.mul(y, b.add(w, 1.0) if unit_offset else w)
    return b.cast(y, x.dtype)


def layer_norm(b: GraphBuilder, x: Value, weight: Value | None, bias: Value | None, eps: float) -> Value:
    """(x - mean) / sqrt(var + eps) * w + b."""
    xf = b.cast(x, dt.f32)
    c = b.sub(xf, b.mean(xf, -1, keepdims=True))
    y = b.mul(c, b.rsqrt(b.add(b.mean(b.mul(c, c), -1, keepdims=True), eps)))
    if weight is not None:
        y = b.mul(y, b.cast(weight, dt.f32))
    if bias is not None:
        y = b.add(y, b.cast(bias, dt.f32))
    return b.cast(y, x.dtype)


def softmax(b: GraphBuilder, x: Value, axis: int = -1) -> Value:
    xf = b.cast(x, dt.f32)
    e = b.exp(b.sub(xf, b.max(xf, axis, keepdims=True)))
    return b.cast(b.div(e, b.sum(e, axis, keepdims=True)), x.dtype)


def activation(b: GraphBuilder, x: Value, kind: str) -> Value:
    """'silu', 'gelu' (erf), 'gelu_tanh', 'relu'."""
    if kind == "silu":
        return b.mul(x, b.sigmoid(x))
    if kind == "gelu":
        return b.mul(b.mul(x, 0.5), b.add(b.unary("erf", b.mul(x, 1 / math.sqrt(2))), 1.0))
    if kind == "gelu_tanh":
        inner = b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), 0.044715)), math.sqrt(2 / math.pi))
        return b.mul(b.mul(x, 0.5), b.add(b.tanh(inner), 1.0))
    if kind == "relu":
        return b.maximum(x, 0.0)
    raise ValueError(f"unknown activation {kind!r} (known: silu, gelu, gelu_tanh, relu)")


@dataclass(frozen=True)
class MlpWeights:
    gate: Value  # [F, D]
    up: Value  # [F, D]
    down: Value  # [D, F]


def gated_mlp(b: GraphBuilder, x: Value, w: MlpWeights, act: str = "silu") -> Value:
    """down(act(gate(x)) * up(x)): SwiGLU with 'silu', GeGLU with 'gelu'/'gelu_tanh'."""
    h = b.mul(activation(b, b.linear(x, w.gate), act), b.linear(x, w.up))
    return b.linear(h, w.down)


@dataclass(frozen=True)
class MoeConfig:
    """Routing of a mixture of experts.

    ``score`` 'softmax' (Mixtral, Qwen-MoE, DeepSeek-V2) or 'sigmoid' (DeepSeek-V3). With
    ``groups`` > 1, experts are chosen only from the ``topk_groups`` best groups, a group scored by
    its best expert ('max') or its best two ('top2'). ``normalize`` rescales the chosen weights to
    sum to one; ``scale`` multiplies them after.
    """

    experts: int
    top_k: int
    score: str = "softmax"
    normalize: bool = True
    scale: float = 1.0
    groups: int = 1
    topk_groups: int = 1
    group_score: str = "max"
    act: str = "silu"

    def __post_init__(self) -> None:
        if self.score not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE score must be 'softmax' or 'sigmoid', got {self.score!r}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"MoE top_k {self.top_k} must be in 1..{self.experts}")
        if self.experts % self.groups or not 1 <= self.topk_groups <= self.groups:
            raise ValueError(f"MoE groups {self.groups}/{self.topk_groups} do not divide {self.experts} experts")
        if self.group_score not in ("max", "top2"):
            raise ValueError(f"MoE group_score must be 'max' or 'top2', got {self.group_score!r}")


@dataclass(frozen=True)
class MoeWeights:
    router: Value  # [E, D]
    gate: Value  # [E, F, D]
    up: Value  # [E, F, D]
    down: Value  # [E, D, F]
    choice_bias: Value | None = None  # [E], added to scores for the choice only (DeepSeek-V3)
    shared: MlpWeights | None = None
    shared_gate: Value | None = None  # [1, D]: sigmoid gate on the shared experts (Qwen2-MoE)


def _onehot_rows(b: GraphBuilder, idx: Value, n: int) -> Value:
    """[T, k] indices -> [T, n] float 0/1 (sum over k of one-hot rows)."""
    hits = b.binary("eq", b.reshape(idx, list(idx.shape) + [1]), b.iota([1, 1, n], axis=2))
    return b.sum(b.cast(hits, dt.f32), 1)


def moe(b: GraphBuilder, x: Value, w: MoeWeights, cfg: MoeConfig) -> Value:
    """Route each token of ``x`` [T, D] to its top-k experts and mix their gated MLPs."""
    E, T = cfg.experts, x.shape[0]
    logits = b.linear(b.cast(x, dt.f32), b.cast(w.router, dt.f32) if not w.router.dtype.is_packed else w.router)
    scores = softmax(b, logits) if cfg.score == "softmax" else b.sigmoid(logits)
    choice = scores if w.choice_bias is None else b.add(scores, b.reshape(b.cast(w.choice_bias, dt.f32), [1, E]))
    if cfg.groups > 1:
        per = E // cfg.groups
        grouped = b.reshape(choice, [T, cfg.groups, per])
        gscore = b.max(grouped, -1) if cfg.group_score == "max" else b.sum(b.topk(grouped, 2)[0], -1)
        _, gidx = b.topk(gscore, cfg.topk_groups)
        gmask = b.reshape(_onehot_rows(b, gidx, cfg.groups), [T, cfg.groups, 1])
        keep = b.reshape(b.expand(gmask, [T, cfg.groups, per]), [T, E])
        choice = b.where(b.binary("gt", keep, 0.0), choice, float("-inf"))
    _, idx = b.topk(choice, cfg.top_k)
    weights = b.mul(scores, _onehot_rows(b, idx, E))  # [T, E], zero off the chosen experts
    if cfg.normalize:
        weights = b.div(weights, b.sum(weights, -1, keepdims=True))
    if cfg.scale != 1.0:
        weights = b.mul(weights, cfg.scale)
    # dense evaluation over all experts: [1, T, D] x [E, F, D]ᵀ -> [E, T, F]; the planner routes sparsely
    xe = b.reshape(x, [1, T, x.shape[1]])
    h = b.mul(activation(b, b.matmul(xe, w.gate, transpose_b=True), cfg.act), b.matmul(xe, w.up, transpose_b=True))
    y = b.matmul(h, w.down, transpose_b=True)  # [E, T, D]
    mix = b.reshape(b.transpose(b.cast(weights, x.dtype), [1, 0]), [E, T, 1])
    out = b.sum(b.mul(y, mix), 0)
    if w.shared is not None:
        s = gated_mlp(b, x, w.shared, cfg.act)
        if w.shared_gate is not None:
            s = b.mul(s, b.sigmoid(b.linear(x, w.shared_gate)))
        out = b.add(out, s)
    return out


@dataclass(frozen=True)
class AttentionConfig:
    heads: int
    kv_heads: int
    head_dim: int
    rope: RopeConfig | None
    window: int | None = None
    softcap: float | None = None
    scale: float | None = None
    qk_norm_eps: float | None = None  # q/k RMSNorm per head (Qwen3, Gemma 3)
    qk_norm_unit_offset: bool = False


@dataclass(frozen=True)
class AttentionWeights:
    q: Value
    k: Value
    v: Value
    o: Value
    q_bias: Value | None = None
    k_bias: Value | None = None
    v_bias: Value | None = None
    o_bias: Value | None = None
    q_norm: Value | None = None
    k_norm: Value | None = None


@dataclass(frozen=True)
class KvState:
    """A layer's paged KV pools and the step's addressing (shared by all layers)."""

    k_pool: Value  # [NB, BS, Hkv, D]
    v_pool: Value
    slots: Value  # [T] flat slot per new token (-1: skip)
    positions: Value  # [T]
    seq_ids: Value  # [T]
    ctx_lens: Value  # [B]
    block_tables: Value  # [B, MB]


def attention_block(b: GraphBuilder, x: Value, w: AttentionWeights, cfg: AttentionConfig, kv: KvState) -> tuple[Value, Value, Value]:
    """Project, normalise and rotate q/k, write k/v into the pools, attend, project out.

    Returns (output [T, D], updated k pool, updated v pool).
    """
    T = x.shape[0]
    q = b.reshape(b.linear(x, w.q, w.q_bias), [T, cfg.heads, cfg.head_dim])
    k = b.reshape(b.linear(x, w.k, w.k_bias), [T, cfg.kv_heads, cfg.head_dim])
    v = b.reshape(b.linear(x, w.v, w.v_bias), [T, cfg.kv_heads, cfg.head_dim])
    if cfg.qk_norm_eps is not None:
        q = rms_norm(b, q, w.q_norm, cfg.qk_norm_eps, cfg.qk_norm_unit_offset)
        k = rms_norm(b, k, w.k_norm, cfg.qk_norm_eps, cfg.qk_norm_unit_offset)
    if cfg.rope is not None:
        q = apply_rope(b, q, kv.positions, cfg.rope)
        k = apply_rope(b, k, kv.positions, cfg.rope)
    # keys and values are rounded to the pools' type as they are written; queries keep their own
    k_pool = b.cache_write(kv.k_pool, k, kv.slots)
    v_pool = b.cache_write(kv.v_pool, v, kv.slots)
    att = b.attention(
        q,
        k_pool,
        v_pool,
        positions=kv.positions,
        seq_ids=kv.seq_ids,
        ctx_lens=kv.ctx_lens,
        block_tables=kv.block_tables,
        window=cfg.window,
        softcap=cfg.softcap,
        scale=cfg.scale,
    )
    out = b.linear(b.cast(b.reshape(att, [T, cfg.heads * cfg.head_dim]), x.dtype), w.o, w.o_bias)
    return out, k_pool, v_pool
