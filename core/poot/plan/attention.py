"""Attention planned as kernel launches: the operands of an ``attention`` node (pools, block tables,
heads), the host's lane schedule and the GPU schedules (decode a thread or, where the backend says
so, a warp a position, the context split across workgroups and merged for long contexts, prefill in
blocks of query tokens or by the backend's own kernel for long prompts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.ir import Node, Value
from ..kernel.library import attention as attn_lib
from ..kernel.library import attention_gpu as attn_gpu
from .common import Env, Limits
from .common import key as _key
from .common import shape as _shape
from .plan import Launch, Plan, When
from .schedules import Schedules


@dataclass(frozen=True)
class AttentionOperands:
    """An attention node's operands and sizes, as every schedule reads them: the spec, operands by
    name, query and KV heads, key, value and shared-key widths, the pools' block size, the scale,
    the buffers every attention kernel takes and the pools' element type."""

    spec: Any
    ops: dict[str, Value]
    hq: int
    hkv: int
    dk: int
    dv: int
    dr: int
    bs: int
    scale: float
    buffers: dict[str, Any]  # the operand buffers every attention kernel takes
    pool_type: str  # the KV pools' element type


POOL_TYPES = ("f32", "f16")  # what the attention and cache-write kernels read and write


def pool_type(v: Value, op: str) -> str:
    """The element type of a KV pool (or of the values written into one), as the kernels' type
    constant (f32 or f16)."""
    if v.dtype.name not in POOL_TYPES:
        raise Refusal(op, "every device", f"KV pools (and values written into them) of {v.dtype}: the kernels read and write {' or '.join(POOL_TYPES)}")
    return v.dtype.name


def _attention_operands(n: Node, device: str) -> AttentionOperands:
    spec = n.attrs["spec"]
    if not spec.paged:
        raise Refusal("attention", device, "the planner runs paged attention only")
    from ..graph.attention import attention_operand_names

    ops = dict(zip(attention_operand_names(spec), n.inputs))
    q, k, v = ops["q"], ops["k"], ops["v"]
    hq, hkv, dk, dv, bs = q.shape[1].value, k.shape[2].value, k.shape[3].value, v.shape[3].value, k.shape[1].value
    dr = ops["k_shared"].shape[2].value if spec.k_shared else 0
    scale = spec.scale if spec.scale is not None else 1.0 / float(np.sqrt(dk + dr))
    bufs: dict[str, Any] = {
        "q": _key(q),
        "k_pool": _key(k),
        "v_pool": _key(v),
        "ks_pool": _key(ops["k_shared"]) if spec.k_shared else np.zeros(1, k.dtype.numpy),
        "positions": _key(ops["positions"]),
        "seq_ids": _key(ops["seq_ids"]),
        "ctx_lens": _key(ops["ctx_lens"]),
        "block_tables": _key(ops["block_tables"]),
        "out": _key(n.outputs[0]),
    }
    return AttentionOperands(spec, ops, hq, hkv, dk, dv, dr, bs, scale, bufs, pool_type(k, "attention"))


HOST_SPLIT_GROUPS = 32  # a host step whose tokens x KV heads is below this splits each context in SPLITS


def _context_splits(n: Node, a: AttentionOperands, plan: Plan, tokens: Callable[[Env], int], when: When, block: int) -> tuple[dict[str, Any], Launch]:
    """For attention with each context split in ``SPLITS`` shares under ``when``: the split kernel's
    output buffers (partial outputs, maxima and sums of every (token, query head, share) in the
    plan's scratch memory) and the ``attention_merge`` launch (``block`` threads; 1: the host's
    ``attention_merge_lanes``) that combines them."""
    parts = lambda env: tokens(env) * a.hq * SPLITS  # noqa: E731
    acc, pm, pl = plan.add_scratch(lambda env: parts(env) * a.dv), plan.add_scratch(parts), plan.add_scratch(parts)
    merge = Launch(
        n,
        attn_lib.attention_merge_lanes.instantiate(SPLITS=SPLITS) if block == 1 else attn_lib.attention_merge.instantiate(SPLITS=SPLITS, BLOCK=block),
        {"part_acc": acc, "part_m": pm, "part_l": pl, "out": a.buffers["out"]},
        lambda env: (tokens(env) * a.hq,),
        lambda env: {"dv": a.dv},
        when,
        label="attention_merge",
    )
    return {"out": acc, "part_m": pm, "part_l": pl}, merge


def attention_launches_host(n: Node, plan: Plan) -> list[Launch]:
    """The host's lane schedule: a KV head's query heads in one workgroup (each key and value read
    once for all of them). A step of few (token, KV head) pairs (decode: SmolLM2's three KV heads
    are three workgroups, two cores leave one idle half the time) splits each context in
    ``SPLITS`` shares, a workgroup each, merged by ``attention_merge``. Otherwise prompts and f16
    pools group the heads, and f32 pools at fewer than 8 tokens keep a workgroup a query head, whose
    more workgroups balance better over the cores."""
    a = _attention_operands(n, "host")
    spec, ops = a.spec, a.ops
    tokens = lambda env: max(1, _shape(ops["q"], env)[0])  # noqa: E731

    def scalars(env: Env) -> dict[str, float | int]:
        return {"mb": _shape(ops["block_tables"], env)[1], "scale": a.scale, "window": spec.window or 0, "softcap": spec.softcap or 0.0}

    dummy = np.zeros(1, np.float32)

    def launch(gq: int, when: When, splits: int = 1, bufs: dict[str, Any] | None = None) -> Launch:
        kern = attn_lib.attention_lanes.instantiate(
            HQ=a.hq, HKV=a.hkv, DK=a.dk, DV=a.dv, DR=a.dr, BS=a.bs, CAUSAL=spec.causal, TILE=16, PT=a.pool_type, GQ=gq, SPLITS=splits
        )
        return Launch(n, kern, bufs or {**a.buffers, "part_m": dummy, "part_l": dummy}, lambda env: (tokens(env), a.hq // gq, splits), scalars, when)

    group = a.hq // a.hkv
    few = lambda env: tokens(env) * a.hkv < HOST_SPLIT_GROUPS  # noqa: E731
    split_when = When(f"tokens x KV heads < {HOST_SPLIT_GROUPS}", few)
    parts, merge = _context_splits(n, a, plan, tokens, split_when, 1)
    out = [launch(group, split_when, SPLITS, {**a.buffers, **parts}), merge]
    if a.pool_type == "f16" or group == 1:
        return out + [launch(group, When(f"tokens x KV heads >= {HOST_SPLIT_GROUPS}", lambda env: not few(env)))]
    return out + [
        launch(1, When(f"tokens x KV heads >= {HOST_SPLIT_GROUPS}, tokens < 8", lambda env: not few(env) and tokens(env) < 8)),
        launch(group, When(f"tokens x KV heads >= {HOST_SPLIT_GROUPS}, tokens >= 8", lambda env: not few(env) and tokens(env) >= 8)),
    ]


SPLIT_CONTEXT = 1024  # decode attention splits a context this long (or longer) across workgroups
SPLITS = 8
# decode attention of up to this many (token, query head) pairs takes ``attention_decode``'s wide
# workgroups (``DECODE_WARPS``: few fit an SM); more take four warps a workgroup (several an SM)
DECODE_WIDE_PAIRS = 128
# beyond those, query heads that share a key/value head are scored by one workgroup, up to this many
# (``attention_decode``'s ``group``: each key and value row loaded once for them, not once a head);
# 1 until the grouped kernel is timed on a GPU (bench/gpu_llama8b.py --set
# poot.plan.attention.DECODE_GROUP=4 measures both)
DECODE_GROUP = 1


def decode_group(hq: int, hkv: int) -> int:
    """Query heads one decode workgroup scores beyond ``DECODE_WIDE_PAIRS`` pairs: the largest
    power of two up to ``DECODE_GROUP`` (4 at most: the kernel's registers) that divides the heads
    sharing a key/value head."""
    g = 4 if DECODE_GROUP >= 4 else 2 if DECODE_GROUP >= 2 else 1
    while g > 1 and (hq // hkv) % g:
        g //= 2
    return g


def attention_launches_gpu(
    n: Node, limits: Limits, plan: Plan, quantizing: dict[Any, tuple[Launch, Any, Any]] | None = None, sched: Schedules | None = None
) -> list[Launch]:
    """One workgroup per (token, head) scoring a tile of positions per pass (a thread each), then
    one output dimension per thread; with heads of 64 or 128 where the backend says so
    (``Schedules.warp_decode``), a warp per position instead (``attention_gpu.attention_decode``). Decode over a long context (block tables
    of ``SPLIT_CONTEXT`` positions or more) with few (token, head) pairs splits the context in
    ``SPLITS`` parts, each a workgroup writing its partial sums to scratch memory, merged by a second
    launch (flash-decoding); prefill takes blocks of 16 query tokens that share each key/value tile,
    or the backend's own kernel for long prompts (``Schedules.attention_prefill``). ``quantizing`` gets the decode launch that can
    also write its output quantized for the dp4a GEMVs, with that kernel, by the output's key."""
    a = _attention_operands(n, "gpu")
    spec, ops = a.spec, a.ops
    if a.dk + a.dr > 1024:
        raise Refusal("attention", "gpu", f"query heads of {a.dk + a.dr} values: the GPU schedule holds at most 1024 in workgroup memory")
    block = 64 if a.dv <= 64 else (128 if a.dv <= 128 else 256)
    kern = attn_lib.attention.instantiate(CAUSAL=spec.causal, SPLITS=1, BLOCK=block, PT=a.pool_type)
    # heads of 64 or 128 values on 32-lane subgroups: a warp a position (coalesced key and value
    # rows), where the backend has verified it (``Schedules.warp_decode``); other devices keep the
    # thread-a-position schedule until it has run there
    fits = limits.subgroup == 32 and a.dk == a.dv and a.dk in (64, 128) and a.dr == 0 and ops["q"].dtype == dt.f32
    warp_decode = fits and sched is not None and sched.warp_decode(a)
    if warp_decode:
        kern = attn_gpu.attention_decode(a.dk, spec.causal, 1, a.pool_type, softcap=bool(spec.softcap))
    dummy = np.zeros(1, np.float32)
    bufs = {**a.buffers, "part_m": dummy, "part_l": dummy}

    def scalars(env: Env) -> dict[str, float | int]:
        return {
            "hq": a.hq,
            "hkv": a.hkv,
            "dk": a.dk,
            "dv": a.dv,
            "dr": a.dr,
            "bs": a.bs,
            "mb": _shape(ops["block_tables"], env)[1],
            "scale": a.scale,
            "window": spec.window or 0,
            "softcap": spec.softcap or 0.0,
        }

    tokens = lambda env: max(1, _shape(ops["q"], env)[0])  # noqa: E731
    batch = lambda env: max(1, _shape(ops["ctx_lens"], env)[0])  # noqa: E731
    per_token = Launch(n, kern, bufs, lambda env: (tokens(env), a.hq, 1), scalars)
    decode = lambda env: tokens(env) < 8 * batch(env)  # noqa: E731
    long = lambda env: _shape(ops["block_tables"], env)[1] * a.bs >= SPLIT_CONTEXT and tokens(env) * a.hq <= 512  # noqa: E731
    split_k = (
        attn_gpu.attention_decode(a.dk, spec.causal, SPLITS, a.pool_type, warps=4, softcap=bool(spec.softcap))
        if warp_decode
        else attn_lib.attention.instantiate(CAUSAL=spec.causal, SPLITS=SPLITS, BLOCK=block, PT=a.pool_type)
    )
    split_when = When(f"tokens < 8 * batch, context >= {SPLIT_CONTEXT}", lambda env: decode(env) and long(env))
    parts, merge = _context_splits(n, a, plan, tokens, split_when, min(block, 128))
    split = [Launch(n, split_k, {**a.buffers, **parts}, lambda env: (tokens(env), a.hq, SPLITS), scalars, split_when), merge]
    per_token.when = When(f"tokens < 8 * batch, context < {SPLIT_CONTEXT}", lambda env: decode(env) and not long(env))
    few = lambda env: tokens(env) * a.hq <= DECODE_WIDE_PAIRS  # noqa: E731
    group = decode_group(a.hq, a.hkv)

    def narrow(doc: str, base: Callable[[Env], bool]) -> list[Launch]:
        """Decode of more (token, head) pairs than ``DECODE_WIDE_PAIRS``, under ``base``: a workgroup
        scores the ``group`` query heads of one key/value head, with 16, 8 or 4 warps as its
        workgroups are few or many (a context's chain of loads is shorter with more warps; many
        workgroups fill the GPU without them); four warps a head where heads share none."""
        tiers = ((DECODE_WIDE_PAIRS, 16), (2 * DECODE_WIDE_PAIRS, 8), (0, 4)) if group > 1 else ((0, 4),)
        out, lo = [], 0
        for hi, warps in tiers:
            kern = attn_gpu.attention_decode(a.dk, spec.causal, 1, a.pool_type, warps=warps, softcap=bool(spec.softcap), group=group)
            within = (lambda env, lo=lo, hi=hi: lo < tokens(env) * a.hq // group <= hi) if hi else (lambda env, lo=lo: tokens(env) * a.hq // group > lo)
            span = f"{lo} < tokens x heads / {group} <= {hi}" if hi else f"tokens x heads / {group} > {lo}"
            out.append(
                Launch(
                    n,
                    kern,
                    bufs,
                    lambda env: (tokens(env), a.hq // group, 1),
                    scalars,
                    When(
                        f"{doc}, tokens x heads > {DECODE_WIDE_PAIRS}" + (f", {span}" if group > 1 else ""),
                        lambda env, within=within: base(env) and not few(env) and within(env),
                    ),
                )
            )
            lo = hi
        return out

    if warp_decode:  # few (token, head) pairs: wide workgroups, a whole short context's loads in flight at once
        per_token.when = When(
            f"tokens < 8 * batch, context < {SPLIT_CONTEXT}, tokens x heads <= {DECODE_WIDE_PAIRS}", lambda env: decode(env) and not long(env) and few(env)
        )
        narrows = narrow(f"tokens < 8 * batch, context < {SPLIT_CONTEXT}", lambda env: decode(env) and not long(env))
        split += narrows
        if quantizing is not None:  # the wide kernel can also write its output quantized for dp4a GEMVs (q8)
            quantizing[a.buffers["out"]] = (per_token, attn_gpu.attention_decode(a.dk, spec.causal, 1, a.pool_type, q8=True, softcap=bool(spec.softcap)), None)
    width = max(a.dk + a.dr, a.dv)
    bk = attn_lib.attention_blocks.instantiate(CAUSAL=spec.causal, QT=16, KT=16, D=64 if width <= 64 else 128, PT=a.pool_type)
    if width > 128 or sum(sh.size * 4 for sh in bk.shared) > limits.shared_bytes or limits.max_workgroup < 128:
        per_token.when = When(f"context < {SPLIT_CONTEXT} or many tokens", lambda env: not (decode(env) and long(env)))
        if warp_decode:  # the wide workgroups for few pairs, the narrow ones for the rest
            split[-len(narrows) :] = narrow(f"(context < {SPLIT_CONTEXT} or many tokens)", lambda env: not (decode(env) and long(env)))
            per_token.when = When(
                f"(context < {SPLIT_CONTEXT} or many tokens), tokens x heads <= {DECODE_WIDE_PAIRS}", lambda env: not (decode(env) and long(env)) and few(env)
            )
        return [per_token, *split]
    # prefill: blocks of 16 query tokens share each key/value tile (while sequences average 8+ new
    # tokens); the backend's own kernel of larger blocks where it has one and sequences average as
    # many new tokens as it asks (``PrefillAttention.from_tokens``: its workgroups walk a block's
    # sequences one by one, which many short prompts in a block do not repay)
    prefill = lambda env: tokens(env) >= 8 * batch(env)  # noqa: E731
    blocks = Launch(
        n, bk, a.buffers, lambda env: (-(-tokens(env) // 16), a.hq), lambda env: {"ntok": tokens(env), **scalars(env)}, When("tokens >= 8 * batch", prefill)
    )
    own = sched.attention_prefill(a) if sched is not None else None
    if own is None:
        return [per_token, *split, blocks]
    start = max(own.from_tokens, 8)
    long_prompts = lambda env: tokens(env) >= start * batch(env)  # noqa: E731
    blocks.when = When(f"8 * batch <= tokens < {start} * batch", lambda env: prefill(env) and not long_prompts(env))
    big = Launch(
        n,
        own.kernel,
        a.buffers,
        lambda env: (-(-tokens(env) // own.rows), a.hq),
        lambda env: {"ntok": tokens(env), **scalars(env)},
        When(f"tokens >= {start} * batch", long_prompts),
    )
    return [per_token, *split, blocks, big]
