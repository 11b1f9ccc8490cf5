"""The planner: every graph op becomes a synthesized kernel launch with a schedule for the device
(or a view, or nothing when fusion absorbed it), grids and scalar arguments computed from the run's
symbol values, so one plan serves every token count and context length."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from ..codegen.targets import SHARED_ALIGN, TARGETS
from ..errors import Refusal
from ..graph import dtypes as dt
from ..graph.ir import Graph, Node, Value
from ..graph.ops import OPS, SAMPLE_OPERANDS
from ..kernel import ir as K
from ..kernel.library import gather as gather_lib
from ..kernel.library import linear_q8_rows, movement, norms, norms_gpu
from ..kernel.library import rope as rope_lib
from ..kernel.library import sampling as sampling_lib
from ..kernel.library.elementwise import MAX_RANK, fuse_elementwise
from ..kernel.verify import before_wait
from ..quant.bodies import BODIES, LUTS
from ..runtime.device import Device
from .attention import attention_launches_gpu, attention_launches_host, pool_type
from .common import Env, Limits, between
from .common import key as _key
from .common import pad as _pad
from .common import shape as _shape
from .common import strides as _strides
from .fused_gemv import find_glus, find_siblings, glu_launches, siblings_launches
from .fusion import (
    Into,
    RmsNorm,
    RopeCache,
    concat_parts,
    elementwise_groups,
    recognise_rms_norms,
    recognise_rope_caches,
    residual_adds,
    view_of,
    virtual_views,
)
from .matmul import QuantizedX, matmul_gpu, matmul_host, rows16_weights
from .memory import stored_nbytes
from .plan import WANT_LOGPROBS, Launch, Plan, When
from .schedules import Schedules

__all__ = ["Launch", "Limits", "Plan", "Schedules", "When", "compile_plan", "plan_graph"]


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


def _elementwise(n: Node, members: list[Node], virtual: set[int], into: Into | None) -> Launch:
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


def _gather(n: Node, rows16: bool = False) -> Launch:
    """Rows of a 2-D table at token ids; ``rows16``: a table laid out for the host's products
    (``linear_q8_rows``)."""
    table, ids = n.inputs
    out = n.outputs[0]
    if n.attrs["axis"] != 0 or table.rank != 2:
        raise Refusal("gather", "host", "the planner gathers rows of a 2-D table only")
    cols = table.shape[1].value
    tokens = lambda env: max(1, int(np.prod(_shape(ids, env))))  # noqa: E731
    if rows16:
        k = linear_q8_rows.gather_q8_rows16.instantiate(QTYPE=table.dtype.name, BLOCK=128)
        return Launch(n, k, {"table": _key(table), "ids": _key(ids), "out": _key(out)}, lambda env: (tokens(env),), lambda env: {"cols": cols})
    if table.dtype == dt.f16:  # f16 activations are stored as f16
        k = gather_lib.gather_f16.instantiate(BLOCK=128)
        return Launch(
            n,
            k,
            {"table": _key(table), "lut": np.zeros(1, np.float32), "ids": _key(ids), "out": _key(out)},
            lambda env: (tokens(env),),
            lambda env: {"cols": cols},
        )
    if table.dtype.name in BODIES:
        bs, bb, _ = BODIES[table.dtype.name]
        k = gather_lib.gather_packed.instantiate(QTYPE=table.dtype.name, BLOCK=128)
        return Launch(
            n,
            k,
            {"table": _key(table), "lut": LUTS.get(table.dtype.name, np.zeros(1, np.float32)), "ids": _key(ids), "out": _key(out)},
            lambda env: (tokens(env),),
            lambda env: {"cols": cols, "row_bytes": cols // bs * bb},
        )
    k = gather_lib.gather_f32.instantiate(BLOCK=128)
    return Launch(n, k, {"table": _key(table), "ids": _key(ids), "out": _key(out)}, lambda env: (tokens(env),), lambda env: {"cols": cols})


def _reduce(n: Node) -> Launch:
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


def _topk(n: Node) -> Launch:
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


def _movement(n: Node, in_place: Mapping[tuple[int, int], Into]) -> list[Launch]:
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


def _cache_write(n: Node) -> Launch:
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


def _count_tokens(n: Node) -> Launch:
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


def _feed_tokens(n: Node) -> Launch:
    last, tokens, seq_ids, rows = n.inputs
    return Launch(
        n,
        sampling_lib.feed_tokens.instantiate(),
        {"last": _key(last), "tokens": _key(tokens), "seq_ids": _key(seq_ids), "count_rows": _key(rows), "out": _key(n.outputs[0])},
        lambda env: (max(1, -(-_shape(tokens, env)[0] // 64)),),
        lambda env: {"ntokens": _shape(tokens, env)[0]},
    )


def _keep_tokens(n: Node) -> Launch:
    last, sampled, rows = n.inputs
    return Launch(
        n,
        sampling_lib.keep_tokens.instantiate(),
        {"sampled": _key(sampled), "rows": _key(rows), "last": _key(n.outputs[0])},
        lambda env: (max(1, -(-_shape(rows, env)[0] // 64)),),
        lambda env: {"nrows": _shape(rows, env)[0]},
    )


def _sample(n: Node, plan: Plan, gpu: bool, block: int = 256) -> list[Launch]:
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


def _logprobs(n: Node, block: int = 256) -> Launch:
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


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def _rms_norm_gpu(n: Node, r: RmsNorm, limits: Limits, add: Node | None = None) -> Launch:
    cols = r.x.shape[-1].value
    block = _pow2_at_most(1024 if cols >= 4096 else 256 if cols >= 1024 else 128, limits.max_workgroup)  # fewer serial steps a row
    lib = norms.add_rms_norm if add is not None else norms.rms_norm
    # the sum of squares by subgroup reductions where the device runs them (two levels at 32 lanes, not
    # a tree of log2(BLOCK) barriers)
    sub = limits.subgroup if 2 <= limits.subgroup <= block else 0
    return _norm_launch(n, r, lib.instantiate(BLOCK=block, UNIT_OFFSET=r.unit_offset, WT=r.weight.dtype.name, SUBGROUP=sub), add)


def _rms_norm(n: Node, r: RmsNorm, add: Node | None = None) -> Launch:
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


def _rope(n: Node, gpu: bool) -> Launch:
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


def _rope_cache(rc: RopeCache, gpu: bool) -> Launch:
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


def compile_plan(graph: Graph, device: Device, matmul_precision: str = "high") -> Plan:
    """Plan ``graph`` for ``device``: schedules chosen from its capabilities; a ``Refusal`` names
    the op, the device and the reason when something cannot run there. ``matmul_precision``
    (``MATMUL_PRECISIONS``) says how activations meet tensor cores where the device has them. The
    device's backend is asked for the target it compiles for (``poot_codegen_target``) and for its
    own choices in a GPU plan (``poot_plan_schedules``: a ``Schedules`` subclass; the generic
    schedules where it has none)."""
    if device.unavailable is not None:
        raise Refusal("plan", device.name, f"the device is unavailable ({device.unavailable})")
    if device.capabilities is None:
        raise Refusal("plan", device.name, "the device reports no capabilities to plan for")
    # a device is planned for when its backend compiles for its target: the schedules are chosen
    # from the capabilities it reports (subgroups, workgroup memory, matrix instructions)
    from ..plugins import host

    hooks = host().hook
    if hooks.poot_codegen_target(device=device) is None:
        raise Refusal("plan", device.name, f"no installed backend compiles kernels for its target '{device.target}' (poot_codegen_target)")
    schedules = hooks.poot_plan_schedules(device=device) or Schedules
    caps = device.capabilities
    # schedules that reduce or shuffle across subgroups are chosen only where the device runs them
    # (a Vulkan device's SPIR-V is then compiled for its subgroup width: codegen.spirv_target)
    subgroup = caps.subgroup_size if caps.subgroup_ops else 0
    shared = caps.shared_memory_bytes
    if device.target == "spirv":  # one SPIR-V module serves every Vulkan device: codegen holds kernels to Vulkan's guaranteed minimum
        shared = min(shared, TARGETS["spirv:vulkan1.3"].max_shared)
    return plan_graph(
        graph,
        device=device.name,
        limits=Limits(
            caps.max_workgroup_size, shared, caps.dtypes, subgroup, caps.matrix_ops, caps.max_buffer_bytes, matmul_precision, caps.dynamic_shared_bytes
        ),
        gpu=device.target != "host",
        schedules=schedules,
    )


def _check_waits(plan: Plan) -> None:
    """A kernel that reads memory before its wait for the launch before (``AwaitPrior``) may read
    there only what no launch of the plan writes (weights, the step's inputs), and write nothing."""
    written = {
        plan.root(l.buffers[p.name])
        for l in plan.launches
        for p in l.kernel.params
        if isinstance(p, K.Buffer) and not p.readonly and isinstance(l.buffers.get(p.name), tuple)
    }
    for l in plan.launches:
        reads, writes = before_wait(l.kernel)
        early = sorted(b for b in reads if plan.root(l.buffers.get(b)) in written)
        if writes or early:
            raise Refusal(
                l.node.op,
                plan.device,
                f"kernel {l.kernel.name} touches {', '.join(sorted(writes) or early)} before its wait for the "
                "launch before, memory a launch of the step writes",
            )


def _check(plan: Plan, limits: Limits) -> None:
    _check_waits(plan)
    for n in plan.graph.nodes:
        for v in n.outputs:
            if not v.dtype.is_packed and v.dtype.name not in limits.dtypes:
                raise Refusal(n.op, plan.device, f"{v.dtype} values are not supported (the device has {', '.join(sorted(limits.dtypes))})")
        if n.op == "weight" and limits.max_buffer_bytes is not None and (size := stored_nbytes(n.outputs[0])) > limits.max_buffer_bytes:
            raise Refusal(
                "weight",
                plan.device,
                f"weight '{n.attrs['name']}' takes {size} bytes; a kernel on this device binds at most "
                f"{limits.max_buffer_bytes} bytes a buffer (a smaller quantization or another device is needed)",
            )
    for l in plan.launches:
        k = l.kernel
        if k.threads > limits.max_workgroup:
            raise Refusal(l.node.op, plan.device, f"kernel {k.name} needs workgroups of {k.threads} threads; the device allows {limits.max_workgroup}")
        shared = sum(sh.size * max(1, sh.dtype.bits // 8) for sh in k.shared)
        if shared > limits.shared_bytes:  # past the static limit: dynamic workgroup memory, each array aligned
            shared = sum(-(-sh.size * max(1, sh.dtype.bits // 8) // SHARED_ALIGN) * SHARED_ALIGN for sh in k.shared)
            if shared > limits.dynamic_shared:
                raise Refusal(
                    l.node.op,
                    plan.device,
                    f"kernel {k.name} needs {shared} bytes of workgroup memory; the device has {max(limits.shared_bytes, limits.dynamic_shared)}",
                )


def plan_graph(
    graph: Graph, fuse: bool = True, device: str = "host", limits: Limits | None = None, gpu: bool = False, schedules: type[Schedules] = Schedules
) -> Plan:
    """Lower every node of ``graph`` to kernel launches with host schedules, or GPU schedules with
    ``gpu`` (a ``Refusal`` names what cannot be run), asking ``schedules`` (a backend's
    ``Schedules`` class, made once for the plan) where a device's own kernels may serve. With
    ``fuse`` (the default), elementwise chains, norms and views are fused."""
    limits = limits or Limits()
    try:
        plan = _plan(graph, fuse, limits, gpu, schedules)
    except Refusal as e:
        raise Refusal(e.op, device, e.reason) from None
    plan.device = device
    _check(plan, limits)
    return plan


def _plan(graph: Graph, fuse: bool, limits: Limits, gpu: bool = False, schedules: type[Schedules] = Schedules) -> Plan:
    plan = Plan(graph, [])
    sched = schedules(plan, limits)
    qx = QuantizedX(plan)
    rows16 = rows16_weights(graph, plan) if not gpu and _integer_products(limits) else frozenset()
    norms_at = recognise_rms_norms(graph) if fuse else {}
    inside = {i for r in norms_at.values() for i in r.nodes} | set(norms_at)
    groups = elementwise_groups(graph, inside) if fuse else {n.id: [n] for n in graph.nodes if OPS[n.op].category == "elementwise"}
    virtual = virtual_views(graph, inside) if fuse else set()
    in_place = concat_parts(graph, set(groups)) if fuse else {}
    glus = find_glus(graph, groups, limits) if fuse and gpu else {}
    users = graph.users() if glus else {}
    outputs = {_key(v) for v in graph.outputs.values()}
    siblings = find_siblings(graph, limits, glus) if fuse and gpu else {}
    in_siblings = {m.id for ns in siblings.values() for m in ns}
    adds = residual_adds(graph, norms_at, groups, virtual, in_place) if fuse else {}
    added = {a.id for a in adds.values()}
    rope_caches = recognise_rope_caches(graph) if fuse else {}
    in_rope_cache = {i for rc in rope_caches.values() for i in rc.nodes}
    # launches that can also write their output quantized: that kernel (or its maker), its grid
    quantizing: dict[Any, tuple[Launch, K.Kernel | Callable[[], K.Kernel], Any]] = {}
    for n in graph.nodes:
        cat = OPS[n.op].category
        if n.op in ("input", "weight", "constant") or n.id in virtual or n.id in added:
            continue
        if n.id in norms_at:
            add = adds.get(n.id)
            plan.launches.append(_rms_norm_gpu(n, norms_at[n.id], limits, add) if gpu else _rms_norm(n, norms_at[n.id], add))
            if gpu and (q8 := _norm_q8(norms_at[n.id], add, limits)) is not None:
                quantizing[_key(norms_at[n.id].out)] = (plan.launches[-1], q8, None)
            continue
        if n.id in inside:
            continue
        if n.id in in_rope_cache:
            if n.op == "cache_write":
                plan.aliases[_key(n.outputs[0])] = plan.aliases.get(_key(n.inputs[0]), _key(n.inputs[0]))
            if n.id in rope_caches:
                plan.launches.append(_rope_cache(rope_caches[n.id], gpu))
            continue
        if n.op == "reshape":
            plan.views[_key(n.outputs[0])] = plan.views.get(_key(n.inputs[0]), _key(n.inputs[0]))
        elif n.op in ("cache_write", "count_tokens", "keep_tokens"):  # pools updated in place
            plan.aliases[_key(n.outputs[0])] = plan.aliases.get(_key(n.inputs[0]), _key(n.inputs[0]))
            plan.launches.append({"cache_write": _cache_write, "count_tokens": _count_tokens, "keep_tokens": _keep_tokens}[n.op](n))
        elif n.op == "feed_tokens":
            plan.launches.append(_feed_tokens(n))
        elif n.op == "sample":  # the picking workgroup of a row: on a GPU, the widest
            plan.launches.extend(_sample(n, plan, gpu, _pow2_at_most(1024, limits.max_workgroup) if gpu else 256))
        elif n.op == "logprobs":
            plan.launches.append(_logprobs(n, _pow2_at_most(1024, limits.max_workgroup) if gpu else 256))
        elif cat == "elementwise":
            if n.id in groups:  # the group's root: its escaping value is computed here
                ew = _elementwise(n, groups[n.id], virtual, in_place.get(_key(n.outputs[0])))
                glu = next((gl for gl in glus.values() if gl.root == n.id), None)
                if glu is not None and ew.buffers["out"] == _key(n.outputs[0]):  # few rows: one warp GEMV over both weights
                    fused = glu_launches(glu, n.outputs[0], limits, sched, qx, quantizing)
                    ew.when = between(4, None, lambda env, x=glu.gate.inputs[0]: int(np.prod(_shape(x, env)[:-1])))
                    plan.launches.extend(fused)
                    # more rows: the product in the form its readers take, where the backend has one
                    h = n.outputs[0]
                    own = [] if _key(h) in outputs else sched.glu_split(glu, h, users.get(n.id, []))
                    if own:
                        plan.launches.extend(own)
                        continue
                plan.launches.append(ew)
        elif n.op == "matmul":
            fused_few = n.id in glus or n.id in in_siblings  # few rows: a fused launch computes this product (or its use), reading x its own way
            ls = (
                matmul_gpu(n, limits, sched, None if fused_few else qx)
                if gpu
                else matmul_host(n, limits.shared_bytes, qx if _integer_products(limits) else None, rows16)
            )
            if fused_few:
                ls = [l for l in ls if not l.kernel.name.startswith("gemv_warp_")]
            if n.id in siblings:
                plan.launches.extend(siblings_launches(siblings[n.id], limits, sched, qx))
            plan.launches.extend(ls)
        elif n.op == "gather":
            plan.launches.append(_gather(n, _key(n.inputs[0]) in rows16))
        elif n.op in ("sum", "mean", "max", "min"):
            plan.launches.append(_reduce(n))
        elif n.op in ("transpose", "slice", "expand", "concat"):
            plan.launches.extend(_movement(n, in_place))
        elif n.op == "rope":
            plan.launches.append(_rope(n, gpu))
        elif n.op == "attention":
            plan.launches.extend(attention_launches_gpu(n, limits, plan, quantizing, sched) if gpu else attention_launches_host(n, plan))
        elif n.op == "topk":
            plan.launches.append(_topk(n))
        else:
            raise Refusal(n.op, "host", "the planner has no kernel for this op yet")
    _quantize_in_producers(plan, quantizing)
    if gpu:
        sched.finish()
    return plan


INTEGER_DOT = frozenset({"avx512vnni", "avxvnni"})  # host matrix operations that sum bytes (vpdpbusd)


def _integer_products(limits: Limits) -> bool:
    """Whether the host's packed products take x as two int8 terms (``linear_q8_host``): where the
    host reports a byte dot-product instruction (without one, the byte arithmetic is 5x slower than
    the f32 lanes), below matmul precision "highest"."""
    return limits.matmul_precision != "highest" and bool(INTEGER_DOT & limits.matrix)


def _norm_q8(r: RmsNorm, add: Node | None, limits: Limits) -> Callable[[], K.Kernel] | None:
    """The maker of the RMSNorm kernel that also writes its output quantized for the dp4a GEMVs
    (``norms_gpu.rms_norm_q8``), where it has one: f32 weights, rows of whole 256-value blocks,
    subgroups of 8+ lanes."""
    cols = r.x.shape[-1].value
    if limits.subgroup not in (8, 16, 32, 64) or r.weight.dtype != dt.f32 or cols % 256:
        return None
    return partial(norms_gpu.rms_norm_q8, cols, add=add is not None, unit_offset=r.unit_offset, subgroup=limits.subgroup)


def _both(a: Callable[[Env], bool] | None, b: Callable[[Env], bool], doc: str) -> When:
    return When(doc, (lambda env: b(env)) if a is None else (lambda env: a(env) and b(env)))


def _quantize_in_producers(plan: Plan, quantizing: Mapping[Any, tuple[Launch, K.Kernel | Callable[[], K.Kernel], Any]]) -> None:
    """x quantized for the dp4a GEMVs (``QuantizedX``'s ``quantize_q8x2`` launch) by the launch that
    computes x, where that one has a kernel that also writes it (an RMSNorm: ``norms_gpu.rms_norm_q8``;
    the decode attention: ``attention_decode(..., q8=True)``; the gated MLP's GEMV: ``gemv_warp(...,
    q8=True)``, which names them ``yq``, ``yr``, ``yds``, on its own grid, or the producer's where
    none is given): where both run, that kernel does both;
    where only the producer runs, its plain kernel; where only the quantization (the producer's other
    schedules), its own launch. One launch fewer a product's x in the step both run."""
    by_root = {plan.root(k): v for k, v in quantizing.items()}
    for q in [l for l in plan.launches if l.label == "quantize_x"]:
        found = by_root.get(plan.root(q.buffers["x"]))
        if found is None:
            continue
        prod, kern, grid = found
        make = kern if isinstance(kern, partial) else None  # a kernel's maker (``Launch.variant``), or the kernel
        kern = make() if make is not None else kern
        wp, wq = prod.when, q.when
        dp, dq = getattr(wp, "doc", "always"), getattr(wq, "doc", "always")
        names = ("yq", "yr", "yds") if kern.param("yq") is not None else ("xq", "xr", "xds")
        fused = Launch(
            prod.node,
            kern,
            {**prod.buffers, **{nm: q.buffers[b] for nm, b in zip(names, ("xq", "xr", "xds"))}},
            grid or prod.grid,
            _scalars_for(kern, prod.scalars),
            None if wp is None and wq is None else _both(wp, wq or (lambda env: True), f"{dp}, {dq}"),
            label=f"{prod.label or prod.node.op}+quantize_x",
            variant=make,
        )
        at = plan.launches.index(prod)
        if wq is None:
            plan.launches[at] = fused
        else:
            prod.when = _both(wp, lambda env, w=wq: not w(env), f"{dp}, not ({dq})")
            plan.launches.insert(at, fused)
        if wp is None:
            plan.launches.remove(q)
        else:
            q.when = _both(wq, lambda env, w=wp: not w(env), f"{dq}, not ({dp})")


def _scalars_for(kern: K.Kernel, scalars: Callable[[Env], dict[str, float | int]]) -> Callable[[Env], dict[str, float | int]]:
    """A launch's scalar arguments, those ``kern`` takes (a fused kernel may take fewer)."""
    names = {p.name for p in kern.params if isinstance(p, K.ScalarParam)}
    return lambda env: {k: v for k, v in scalars(env).items() if k in names}
