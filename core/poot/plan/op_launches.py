"""One launch (or a few) for each op the planner lowers on its own: elementwise groups, gathers,
reductions, movement, the KV cache's and token buffers' updates, sampling, RMSNorm and RoPE. The
planner (``lower``) picks among them per node; the products and attention have modules of their own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.ir import Node, Value
from ..graph.ops import SAMPLE_OPERANDS
from ..kernel.library import gather as gather_lib
from ..kernel.library import linear_q8_rows, movement, norms
from ..kernel.library import rope as rope_lib
from ..kernel.library import sampling as sampling_lib
from ..kernel.library.elementwise import MAX_RANK, fuse_elementwise
from ..quant.bodies import BODIES, LUTS
from .attention import pool_type
from .common import Env, Limits
from .common import key as _key
from .common import pad as _pad
from .common import shape as _shape
from .common import strides as _strides
from .fusion import Into, RmsNorm, RopeCache, view_of
from .plan import WANT_LOGPROBS, Launch, Plan, When

__all__ = [
    "cache_write_launch",
    "count_tokens_launch",
    "elementwise_launch",
    "feed_tokens_launch",
    "gather_launch",
    "keep_tokens_launch",
    "logprobs_launch",
    "movement_launches",
    "pow2_at_most",
    "reduce_launch",
    "rms_norm_launch",
    "rms_norm_launch_gpu",
    "rope_cache_launch",
    "rope_launch",
    "sample_launches",
    "topk_launch",
]


def _is_bf16_weight(v: Value) -> bool:
    """Whether ``v`` is stored as a bf16 weight's 16-bit patterns (itself or a reshape of one);
    other bf16 values are widened to f32."""
    while v.node.op == "reshape":
        v = v.node.inputs[0]
    return v.dtype == dt.bf16 and v.node.op == "weight"


def _merge_dims(sizes: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Dimensions of an elementwise launch merged where every operand walks them alike (the outer
    one's stride is the inner one's times its size, for each), dimensions of size 1 dropped, padded
    back to ``MAX_RANK`` in front: a contiguous chain becomes one dimension, which the kernel walks
    without a division per element."""
    dims = [(sizes[d], [s[d] for s in strides]) for d in range(len(sizes)) if sizes[d] != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, st in reversed(dims):
        if merged and all(a == b * merged[0][0] for a, b in zip(st, merged[0][1])):
            merged[0] = (size * merged[0][0], merged[0][1])
        else:
            merged.insert(0, (size, st))
    merged = [(1, [0] * len(strides))] * (len(sizes) - len(merged)) + merged
    return [m[0] for m in merged], [[m[1][j] for m in merged] for j in range(len(strides))]


def elementwise_launch(n: Node, members: list[Node], virtual: set[int], into: Into | None) -> Launch:
    """One kernel for ``members`` (an elementwise DAG whose only escaping value is ``n``'s output),
    reading inputs through views and writing into a concat's part in place when ``into`` says so."""
    inside = {_key(v) for m in members for v in m.outputs}
    ins: list[Value] = []
    consts: list[Node] = []
    for m in members:
        for v in m.inputs:
            if _key(v) in inside or any(_key(v) == _key(x) for x in ins):
                continue
            if v.node.op == "constant" and v.node.attrs["value"].array.size == 1:
                if v.node not in consts:
                    consts.append(v.node)  # scalars are inlined into the kernel
                continue
            ins.append(v)
    views = [view_of(v, virtual) for v in ins]
    stored = [dt.bf16 if _is_bf16_weight(vw.base) else (v.dtype if v.dtype != dt.bf16 else dt.f32) for v, vw in zip(ins, views)]
    k = fuse_elementwise(f"ew_{'_'.join(m.op for m in members)[:40]}", consts + members, ins, n.outputs[0], block=256, stored=stored)
    out = n.outputs[0]
    dest = into.concat.outputs[0] if into else out

    def scalars(env: Env) -> dict[str, int]:
        oshape = _shape(out, env)
        full = _pad(list(oshape), 1)
        sc: dict[str, int] = {"n": int(np.prod(oshape)) if oshape else 1}
        strides = []  # each input's, then the output's, per dimension
        for i, (v, vw) in enumerate(zip(ins, views)):
            ishape = _pad(list(_shape(v, env)), 1)
            st = _pad(vw.strides(env), 0)
            strides.append([0 if ishape[d] == 1 and full[d] != 1 else st[d] for d in range(MAX_RANK)])
            sc[f"o{i}"] = vw.offset(env)
        dst = _strides(_shape(dest, env))
        if into is None:
            sc["o_out"] = 0
        else:
            ax = into.concat.attrs["axis"] % dest.rank
            sc["o_out"] = sum(_shape(q, env)[ax] for q in into.concat.inputs[: into.index]) * dst[ax]
        strides.append(_pad(dst, 0))
        sizes, merged = _merge_dims(full, strides)
        sc.update({f"d{d}": sizes[d] for d in range(MAX_RANK)})
        for i in range(len(ins)):
            sc.update({f"s{i}_{d}": merged[i][d] for d in range(MAX_RANK)})
        sc.update({f"ot{d}": merged[-1][d] for d in range(MAX_RANK)})
        return sc

    bufs: dict[str, Any] = {f"in{i}": _key(vw.base) for i, vw in enumerate(views)}
    bufs["out"] = _key(dest)
    return Launch(n, k, bufs, lambda env: (max(1, -(-int(np.prod(_shape(out, env))) // 256)),), scalars)


def gather_launch(n: Node, rows16: bool = False) -> Launch:
    """Rows of a 2-D table at token ids; ``rows16``: a table laid out for the host's products
    (``linear_q8_rows``)."""
    table, ids = n.inputs
    out = n.outputs[0]
    if n.attrs["axis"] != 0 or table.rank != 2:
        raise Refusal("gather", "host", "the planner gathers rows of a 2-D table only")
    cols = table.shape[1].value
    # the table's rows, per step: it may be the step's hidden states (gathered at the logit rows)
    nrows = lambda env: int(_shape(table, env)[0])  # noqa: E731
    tokens = lambda env: max(1, int(np.prod(_shape(ids, env))))  # noqa: E731
    if rows16:
        k = linear_q8_rows.gather_q8_rows16.instantiate(QTYPE=table.dtype.name, BLOCK=128)
        return Launch(
            n, k, {"table": _key(table), "ids": _key(ids), "out": _key(out)}, lambda env: (tokens(env),), lambda env: {"cols": cols, "rows": nrows(env)}
        )
    if table.dtype == dt.f16:  # f16 activations are stored as f16
        k = gather_lib.gather_f16.instantiate(BLOCK=128)
        return Launch(
            n,
            k,
            {"table": _key(table), "lut": np.zeros(1, np.float32), "ids": _key(ids), "out": _key(out)},
            lambda env: (tokens(env),),
            lambda env: {"cols": cols, "rows": nrows(env)},
        )
    if table.dtype.name in BODIES:
        bs, bb, _ = BODIES[table.dtype.name]
        k = gather_lib.gather_packed.instantiate(QTYPE=table.dtype.name, BLOCK=128)
        return Launch(
            n,
            k,
            {"table": _key(table), "lut": LUTS.get(table.dtype.name, np.zeros(1, np.float32)), "ids": _key(ids), "out": _key(out)},
            lambda env: (tokens(env),),
            lambda env: {"cols": cols, "row_bytes": cols // bs * bb, "rows": nrows(env)},
        )
    k = gather_lib.gather_f32.instantiate(BLOCK=128)
    return Launch(n, k, {"table": _key(table), "ids": _key(ids), "out": _key(out)}, lambda env: (tokens(env),), lambda env: {"cols": cols, "rows": nrows(env)})


def reduce_launch(n: Node) -> Launch:
    """Over the last axis: a row reduction; over other adjacent axes: x viewed as [outer, length, inner]."""
    (x,) = n.inputs
    axes = sorted({a % x.rank for a in n.attrs["axes"]})
    if axes != list(range(axes[0], axes[-1] + 1)):
        raise Refusal(n.op, "host", f"reduces over adjacent axes only, got {n.attrs['axes']}")
    out = n.outputs[0]
    if axes == [x.rank - 1]:
        k = movement.reduce_rows.instantiate(OP=n.op, BLOCK=128)
        return Launch(n, k, {"x": _key(x), "y": _key(out)}, lambda env: (max(1, int(np.prod(_shape(x, env)[:-1]))),), lambda env: {"cols": _shape(x, env)[-1]})
    lo, hi = axes[0], axes[-1] + 1

    def split(env: Env) -> tuple[int, int, int]:
        s = _shape(x, env)
        return int(np.prod(s[:lo])), int(np.prod(s[lo:hi])), int(np.prod(s[hi:]))

    k = movement.reduce_axis.instantiate(OP=n.op)
    return Launch(
        n,
        k,
        {"x": _key(x), "y": _key(out)},
        lambda env: (max(1, split(env)[0]), max(1, -(-split(env)[2] // 16))),
        lambda env: dict(zip(("outer", "length", "inner"), split(env))),
    )


def topk_launch(n: Node) -> Launch:
    (x,) = n.inputs
    if n.attrs["axis"] % x.rank != x.rank - 1:
        raise Refusal("topk", "host", "selects along the last axis only")
    vals, idx = n.outputs
    k = movement.topk_rows.instantiate(K=n.attrs["k"])
    return Launch(
        n,
        k,
        {"x": _key(x), "values": _key(vals), "indices": _key(idx)},
        lambda env: (max(1, int(np.prod(_shape(x, env)[:-1]))),),
        lambda env: {"cols": _shape(x, env)[-1]},
    )


def _copy(
    n: Node,
    src: Value,
    dst: Value,
    src_off: Callable[[Env], int],
    src_strides: Callable[[Env], list[int]],
    dst_off: Callable[[Env], int],
    box: Callable[[Env], tuple[int, ...]],
) -> Launch:
    k = movement.copy_strided.instantiate(BLOCK=256)

    def scalars(env: Env) -> dict[str, int]:
        b = list(box(env))
        full = _pad(b, 1)
        ss = _pad(src_strides(env), 0)
        ts = _pad(_strides(_shape(dst, env))[-len(b) :] if b else [], 0)
        sc = {"n": int(np.prod(b)) if b else 1, "src_offset": src_off(env), "dst_offset": dst_off(env)}
        sc.update({f"d{i}": full[i] for i in range(MAX_RANK)})
        sc.update({f"s{i}": ss[i] for i in range(MAX_RANK)})
        sc.update({f"t{i}": ts[i] for i in range(MAX_RANK)})
        return sc

    return Launch(n, k, {"src": _key(src), "dst": _key(dst)}, lambda env: (max(1, -(-int(np.prod(box(env))) // 256)),), scalars)


def movement_launches(n: Node, in_place: Mapping[tuple[int, int], Into]) -> list[Launch]:
    out = n.outputs[0]
    if n.op == "transpose":
        (x,) = n.inputs
        perm = n.attrs["perm"]
        return [_copy(n, x, out, lambda env: 0, lambda env: [_strides(_shape(x, env))[p] for p in perm], lambda env: 0, lambda env: _shape(out, env))]
    if n.op == "slice":
        (x,) = n.inputs
        ax = n.attrs["axis"] % x.rank

        def sst(env: Env) -> list[int]:
            s = _strides(_shape(x, env))
            s[ax] *= n.attrs["step"]
            return s

        return [_copy(n, x, out, lambda env: n.attrs["start"] * _strides(_shape(x, env))[ax], sst, lambda env: 0, lambda env: _shape(out, env))]
    if n.op == "expand":
        (x,) = n.inputs

        def est(env: Env) -> list[int]:
            xs = list(_shape(x, env))
            full = _shape(out, env)
            xs = [1] * (len(full) - len(xs)) + xs
            st = _strides(tuple(xs))
            return [0 if xs[d] == 1 and full[d] != 1 else st[d] for d in range(len(full))]

        return [_copy(n, x, out, lambda env: 0, est, lambda env: 0, lambda env: _shape(out, env))]
    if n.op == "concat":
        ax = n.attrs["axis"] % out.rank
        launches, before = [], []
        for part in n.inputs:
            prev = list(before)
            before.append(part)
            if _key(part) in in_place:
                continue  # its producer writes it into place
            launches.append(
                _copy(
                    n,
                    part,
                    out,
                    lambda env: 0,
                    lambda env, p=part: _strides(_shape(p, env)),
                    lambda env, prev=prev: sum(_shape(q, env)[ax] for q in prev) * _strides(_shape(out, env))[ax],
                    lambda env, p=part: _shape(p, env),
                )
            )
        return launches
    raise Refusal(n.op, "host", "not a data-movement op")


def cache_write_launch(n: Node) -> Launch:
    pool, vals, slots = n.inputs
    width = int(np.prod([d.value for d in pool.shape[2:]]))
    pt = pool_type(pool, "cache_write")
    if pt == "f16" and width % 2:
        raise Refusal("cache_write", "every device", f"f16 pools are written two halves at a time: rows of {width} values do not pair up")
    k = movement.cache_write.instantiate(BLOCK=128, PT=pt, VT=pool_type(vals, "cache_write"))
    return Launch(
        n,
        k,
        {"values": _key(vals), "slots": _key(slots), "pool": _key(n.outputs[0])},
        lambda env: (max(1, _shape(slots, env)[0]),),
        lambda env: {"width": width},
    )


def count_tokens_launch(n: Node) -> Launch:
    counts, tokens, seq_ids, rows = n.inputs
    vocab = counts.shape[1].value
    k = sampling_lib.count_tokens.instantiate()
    return Launch(
        n,
        k,
        {"tokens": _key(tokens), "seq_ids": _key(seq_ids), "count_rows": _key(rows), "counts": _key(n.outputs[0])},
        lambda env: (1,),
        lambda env: {"ntokens": _shape(tokens, env)[0], "vocab": vocab},
    )


def feed_tokens_launch(n: Node) -> Launch:
    last, tokens, seq_ids, rows = n.inputs
    return Launch(
        n,
        sampling_lib.feed_tokens.instantiate(),
        {"last": _key(last), "tokens": _key(tokens), "seq_ids": _key(seq_ids), "count_rows": _key(rows), "out": _key(n.outputs[0])},
        lambda env: (max(1, -(-_shape(tokens, env)[0] // 64)),),
        lambda env: {"ntokens": _shape(tokens, env)[0]},
    )


def keep_tokens_launch(n: Node) -> Launch:
    last, sampled, rows = n.inputs
    return Launch(
        n,
        sampling_lib.keep_tokens.instantiate(),
        {"sampled": _key(sampled), "rows": _key(rows), "last": _key(n.outputs[0])},
        lambda env: (max(1, -(-_shape(rows, env)[0] // 64)),),
        lambda env: {"nrows": _shape(rows, env)[0]},
    )


def sample_launches(n: Node, plan: Plan, gpu: bool, block: int = 256) -> list[Launch]:
    """Sampling in two launches: each row processed in chunks (a workgroup each: on a GPU, 512
    tokens, so Llama 3's 128,256 logits take 251 workgroups rather than one), then a workgroup a
    row (``block`` threads) picks the token from the chunks' best or filters the row first."""
    ops = dict(zip(SAMPLE_OPERANDS, n.inputs))
    logits = ops["logits"]
    vocab = logits.shape[1].value
    if vocab >= 1 << 24:  # the chunks' best token ids travel as f32 values
        raise Refusal("sample", "gpu" if gpu else "host", f"a vocabulary of {vocab} tokens: sampling handles fewer than 2**24")
    chunk = 512 if gpu else 8192  # GPU: 251 workgroups for Llama 3's logits (2048 would give 63, fewer than the SMs)
    chunks = -(-vocab // chunk)
    rows = lambda env: _shape(logits, env)[0]  # noqa: E731
    parts = plan.add_scratch(lambda env: rows(env) * chunks * sampling_lib.PART_WORDS)
    first = {
        name: _key(ops[name])
        for name in ("logits", "counts", "count_rows", "temperature", "repetition", "presence", "frequency", "seeds", "steps", "mask", "bias_ids", "bias_vals")
    }
    first.update(work=_key(n.outputs[1]), parts=parts)
    second = {name: _key(ops[name]) for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "steps")}
    second.update(work=_key(n.outputs[1]), parts=parts, tokens=_key(n.outputs[0]))
    return [
        Launch(
            n,
            sampling_lib.sample_chunks.instantiate(BLOCK=256) if gpu else sampling_lib.sample_chunks_lanes.instantiate(),
            first,
            lambda env: (rows(env), chunks),
            lambda env: {"vocab": vocab, "mask_words": _shape(ops["mask"], env)[1], "nbias": _shape(ops["bias_ids"], env)[1], "chunk": chunk},
            label="sample_chunks",
        ),
        Launch(n, sampling_lib.sample.instantiate(BLOCK=block), second, lambda env: (rows(env),), lambda env: {"vocab": vocab, "chunks": chunks}),
    ]


def logprobs_launch(n: Node, block: int = 256) -> Launch:
    """Log-probabilities, computed only in steps where some sequence asks for them (the step's
    ``WANT_LOGPROBS`` symbol; absent means yes)."""
    logits, tokens = n.inputs
    vocab = logits.shape[1].value
    k = sampling_lib.logprobs.instantiate(N=n.attrs["n"], BLOCK=block)
    chosen, ids, vals = n.outputs
    return Launch(
        n,
        k,
        {"logits": _key(logits), "tokens": _key(tokens), "chosen": _key(chosen), "top_ids": _key(ids), "top_vals": _key(vals)},
        lambda env: (_shape(logits, env)[0],),
        lambda env: {"vocab": vocab},
        When("log-probabilities asked for", lambda env: env.get(WANT_LOGPROBS, 1) != 0),
    )


def pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def rms_norm_launch_gpu(n: Node, r: RmsNorm, limits: Limits, add: Node | None = None) -> Launch:
    cols = r.x.shape[-1].value
    block = pow2_at_most(1024 if cols >= 4096 else 256 if cols >= 1024 else 128, limits.max_workgroup)  # fewer serial steps a row
    lib = norms.add_rms_norm if add is not None else norms.rms_norm
    # the sum of squares by subgroup reductions where the device runs them (two levels at 32 lanes, not
    # a tree of log2(BLOCK) barriers)
    sub = limits.subgroup if 2 <= limits.subgroup <= block else 0
    return _norm_launch(n, r, lib.instantiate(BLOCK=block, UNIT_OFFSET=r.unit_offset, WT=r.weight.dtype.name, SUBGROUP=sub), add)


def rms_norm_launch(n: Node, r: RmsNorm, add: Node | None = None) -> Launch:
    lib = norms.add_rms_norm_lanes if add is not None else norms.rms_norm_lanes
    return _norm_launch(n, r, lib.instantiate(UNIT_OFFSET=r.unit_offset, WT=r.weight.dtype.name), add)


def _norm_launch(n: Node, r: RmsNorm, k: Any, add: Node | None) -> Launch:
    """An RMSNorm launch; with ``add``, the residual add whose sum it normalises is computed (and
    written) by the same kernel."""
    cols = r.x.shape[-1].value
    bufs: dict[str, Any] = {"w": _key(r.weight), "y": _key(r.out)}
    if add is None:
        bufs["x"] = _key(r.x)
    else:
        bufs.update(a=_key(add.inputs[0]), b=_key(add.inputs[1]), h=_key(r.x))
    return Launch(
        n,
        k,
        bufs,
        lambda env: (max(1, int(np.prod(_shape(r.x, env)[:-1]))),),
        lambda env: {"cols": cols, "eps": r.eps},
        label="add_rms_norm" if add is not None else "rms_norm",
    )


def _rope_block(dim: int, gpu: bool) -> int:
    return (64 if dim >= 128 else 32) if gpu else 1


def rope_launch(n: Node, gpu: bool) -> Launch:
    x, pos = n.inputs
    a = n.attrs
    heads, head_dim = x.shape[1].value, x.shape[2].value
    k = rope_lib.rope.instantiate(ROT=a["dim"], NEOX=a["layout"] == "neox", BLOCK=_rope_block(a["dim"], gpu))
    return Launch(
        n,
        k,
        {"x": _key(x), "positions": _key(pos), "inv_freq": np.array(a["inv_freq"].array), "y": _key(n.outputs[0])},
        lambda env: (max(1, _shape(x, env)[0]), heads),
        lambda env: {"heads": heads, "head_dim": head_dim, "attn_factor": a["attn_factor"]},
    )


def rope_cache_launch(rc: RopeCache, gpu: bool) -> Launch:
    q, pos = rc.rope_q.inputs
    k = rc.rope_k.inputs[0]
    v = rc.write_v.inputs[1]
    a = rc.rope_q.attrs
    hq, hkv, head_dim, v_dim = q.shape[1].value, k.shape[1].value, q.shape[2].value, v.shape[2].value
    kern = rope_lib.rope_kv_cache.instantiate(
        ROT=a["dim"], NEOX=a["layout"] == "neox", BLOCK=_rope_block(a["dim"], gpu), PT=pool_type(rc.write_k.inputs[0], "rope_kv_cache")
    )
    bufs = {
        "q": _key(q),
        "k": _key(k),
        "v": _key(v),
        "positions": _key(pos),
        "inv_freq": np.array(a["inv_freq"].array),
        "slots": _key(rc.write_k.inputs[2]),
        "q_out": _key(rc.rope_q.outputs[0]),
        "k_pool": _key(rc.write_k.outputs[0]),
        "v_pool": _key(rc.write_v.outputs[0]),
    }
    return Launch(
        rc.rope_q,
        kern,
        bufs,
        lambda env: (max(1, _shape(q, env)[0]), hq + 2 * hkv),
        lambda env: {"hq": hq, "hkv": hkv, "head_dim": head_dim, "v_dim": v_dim, "attn_factor": a["attn_factor"]},
        label="rope_kv_cache",
    )
