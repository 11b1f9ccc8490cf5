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
from ..graph.ir import Graph, Node
from ..graph.ops import OPS
from ..kernel import ir as K
from ..kernel.library import norms_gpu
from ..kernel.verify import before_wait
from ..runtime.device import Device
from .attention import attention_launches_gpu, attention_launches_host
from .common import Env, Limits, between
from .common import key as _key
from .common import shape as _shape
from .fused_gemv import find_glus, find_siblings, glu_launches, siblings_launches
from .fusion import (
    RmsNorm,
    concat_parts,
    elementwise_groups,
    recognise_rms_norms,
    recognise_rope_caches,
    residual_adds,
    virtual_views,
)
from .matmul import QuantizedX, matmul_gpu, matmul_host, rows16_weights
from .memory import stored_nbytes
from .op_launches import (
    cache_write_launch,
    count_tokens_launch,
    elementwise_launch,
    feed_tokens_launch,
    gather_launch,
    keep_tokens_launch,
    logprobs_launch,
    movement_launches,
    pow2_at_most,
    reduce_launch,
    rms_norm_launch,
    rms_norm_launch_gpu,
    rope_cache_launch,
    rope_launch,
    sample_launches,
    topk_launch,
)
from .plan import Launch, Plan, When
from .schedules import Schedules

__all__ = ["Launch", "Limits", "Plan", "Schedules", "When", "compile_plan", "plan_graph"]


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
    glu_pairs: set[int] = set()  # gated MLPs whose two products the backend was offered together
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
            plan.launches.append(rms_norm_launch_gpu(n, norms_at[n.id], limits, add) if gpu else rms_norm_launch(n, norms_at[n.id], add))
            if gpu and (q8 := _norm_q8(norms_at[n.id], add, limits)) is not None:
                quantizing[_key(norms_at[n.id].out)] = (plan.launches[-1], q8, None)
            continue
        if n.id in inside:
            continue
        if n.id in in_rope_cache:
            if n.op == "cache_write":
                plan.aliases[_key(n.outputs[0])] = plan.aliases.get(_key(n.inputs[0]), _key(n.inputs[0]))
            if n.id in rope_caches:
                plan.launches.append(rope_cache_launch(rope_caches[n.id], gpu))
            continue
        if n.op == "reshape":
            plan.views[_key(n.outputs[0])] = plan.views.get(_key(n.inputs[0]), _key(n.inputs[0]))
        elif n.op in ("cache_write", "count_tokens", "keep_tokens"):  # pools updated in place
            plan.aliases[_key(n.outputs[0])] = plan.aliases.get(_key(n.inputs[0]), _key(n.inputs[0]))
            plan.launches.append({"cache_write": cache_write_launch, "count_tokens": count_tokens_launch, "keep_tokens": keep_tokens_launch}[n.op](n))
        elif n.op == "feed_tokens":
            plan.launches.append(feed_tokens_launch(n))
        elif n.op == "sample":  # the picking workgroup of a row: on a GPU, the widest
            plan.launches.extend(sample_launches(n, plan, gpu, pow2_at_most(1024, limits.max_workgroup) if gpu else 256))
        elif n.op == "logprobs":
            plan.launches.append(logprobs_launch(n, pow2_at_most(1024, limits.max_workgroup) if gpu else 256))
        elif cat == "elementwise":
            if n.id in groups:  # the group's root: its escaping value is computed here
                ew = elementwise_launch(n, groups[n.id], virtual, in_place.get(_key(n.outputs[0])))
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
            if n.id in siblings:  # (before any sibling's own launches: the backend's fused ones take rows from them)
                plan.launches.extend(siblings_launches(siblings[n.id], limits, sched, qx))
                plan.launches.extend(sched.siblings_many_rows(siblings[n.id]))
            elif n.id in glus and glus[n.id].root not in glu_pairs:  # the gated MLP's two products, likewise, at the first of them
                glu_pairs.add(glus[n.id].root)
                plan.launches.extend(sched.siblings_many_rows([glus[n.id].gate, glus[n.id].up]))
            ls = (
                matmul_gpu(n, limits, sched, None if fused_few else qx)
                if gpu
                else matmul_host(n, limits.shared_bytes, qx if _integer_products(limits) else None, rows16)
            )
            if fused_few:
                ls = [l for l in ls if not l.kernel.name.startswith("gemv_warp_")]
            plan.launches.extend(ls)
        elif n.op == "gather":
            plan.launches.append(gather_launch(n, _key(n.inputs[0]) in rows16))
        elif n.op in ("sum", "mean", "max", "min"):
            plan.launches.append(reduce_launch(n))
        elif n.op in ("transpose", "slice", "expand", "concat"):
            plan.launches.extend(movement_launches(n, in_place))
        elif n.op == "rope":
            plan.launches.append(rope_launch(n, gpu))
        elif n.op == "attention":
            plan.launches.extend(attention_launches_gpu(n, limits, plan, quantizing, sched) if gpu else attention_launches_host(n, plan))
        elif n.op == "topk":
            plan.launches.append(topk_launch(n))
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
