"""The RMSNorm between two one-row Q4_K products folded into both, where the GEMVs stage x
quantized once (``NvidiaSchedules.gemv``'s ``staged``: Hopper). Planned (``FOLD_NORMS``).

A decoder layer's batch-1 step runs o -> add + RMSNorm -> q/k/v and down -> add + RMSNorm -> gate/up.
The norm is one workgroup: a chain of memory latencies (wait for o, read the row, sum its squares,
write it quantized) that the next product waits for. Folded, the product before it adds the
residual, applies the norm's weights and quantizes the row by blocks of 32 features
(``gemv_warp``'s ``norm_next``: the int8 terms and block sums are scale-free), each of its
workgroups writing its features' sum of squares; the products after it add those partial sums and
stage x's block scales times the norm's rsqrt, so their sums come out normalized (``rms_in``). The
norm's launch is gone.

The readers scale x's staged block scales rather than their sums: a scale held in a register
across the sums would cost the gated MLP's reader registers (three of its 256-thread workgroups an
SM instead of four: two waves where one serves) and spill q/k/v's, capped at 40. Folded, x's
quantization is the norm's output's up to rounding, so greedy tokens are the unfolded plan's up to
near-ties. A warp computes one feature at a time: two at once (x's words shared by two rows) makes
every one-row product slower.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from poot.backend import kir as K
from poot.plan.schedules import Env, Launch, Plan, When

__all__ = ["FOLD_NORMS", "FOLD_WARPS", "fold_norms"]

# whether the planner folds the norms (one launch fewer a norm, and its chain of latencies off the step's path)
FOLD_NORMS = True

# a folding product's workgroup: 32 warps, a feature each (its 32 features are quantized together;
# as many warps an SM as the products' two workgroups of 16; 16 warps of two features each would
# hold one workgroup an SM)
FOLD_WARPS = 32


def _buffers(l: Launch, written: bool) -> list[Any]:
    return [l.buffers[p.name] for p in l.kernel.params if isinstance(p, K.Buffer) and p.readonly != written and isinstance(l.buffers.get(p.name), tuple)]


def _staged_one_row(l: Launch) -> bool:
    """A one-row Q4_K warp GEMV that stages x quantized once and can be made again (``variant``)."""
    return (
        l.variant is not None
        and l.kernel.name.startswith("gemv_warp_")
        and "_q4_k_" in l.kernel.name
        and "_MR1" in l.kernel.name
        and l.kernel.param("xq_in") is not None
        and l.kernel.param("ss") is None
    )


def fold_norms(plan: Plan) -> None:
    """Each ``add_rms_norm+quantize_x`` launch whose sum's operand comes from a single one-row Q4_K
    product, whose f32 output nothing reads and whose quantized output only one-row Q4_K products
    read, all under one condition (tried at one row and at two), folded into that product and its
    readers under that condition; the norm's launch is kept for the other shapes."""
    symbols = {s for _, _, axes in plan.input_symbols for _, s in axes}
    one, two = {s: 1 for s in symbols}, {s: 2 for s in symbols}

    def on(l: Launch, env: Env) -> bool:
        return l.when is None or l.when(env)

    readers: dict[Any, list[Launch]] = {}
    writers: dict[Any, list[Launch]] = {}
    for l in plan.launches:
        for b in _buffers(l, False):
            readers.setdefault(plan.root(b), []).append(l)
        for b in _buffers(l, True):
            writers.setdefault(plan.root(b), []).append(l)

    def at_one(ls: list[Launch]) -> list[Launch]:
        return [l for l in ls if on(l, one)]

    for norm in [l for l in plan.launches if l.label == "add_rms_norm+quantize_x"]:
        if not (on(norm, one) and not on(norm, two)) or norm.variant is None or at_one(readers.get(plan.root(norm.buffers["y"]), [])):
            continue
        for y, res in (("b", "a"), ("a", "b")):
            made = at_one(writers.get(plan.root(norm.buffers[y]), []))
            if (
                len(made) == 1
                and _staged_one_row(made[0])
                and made[0].kernel.param("w") is not None
                and at_one(readers.get(plan.root(norm.buffers[y]), [])) == [norm]
            ):
                break
        else:
            continue
        prod = made[0]
        users = at_one(readers.get(plan.root(norm.buffers["xq"]), []))
        if not users or not all(_staged_one_row(u) for u in users) or not on(prod, one) or on(prod, two) or any(on(u, two) for u in users):
            continue
        cols = prod.scalars(one)["n"]
        if cols % 32 or any(u.variant.args[1] != cols for u in users) or norm.variant.args[0] != cols:  # type: ignore[union-attr]
            continue
        _fold(plan, norm, prod, users, norm.buffers[res], cols // 32)


def _fold(plan: Plan, norm: Launch, prod: Launch, users: list[Launch], res: Any, groups: int) -> None:
    rows: Callable[[Env], int] = lambda env: prod.scalars(env)["m"]  # noqa: E731
    ss = plan.add_scratch(lambda env: rows(env) * groups)
    make: Callable[..., K.Kernel] = partial(
        prod.variant,
        warps=FOLD_WARPS,
        per_warp=1,
        min_groups=1,
        q8=True,
        norm_next=True,  # type: ignore[arg-type]
        unit_offset=norm.variant.keywords["unit_offset"],
    )  # type: ignore[union-attr]
    bufs = {
        **{k: v for k, v in prod.buffers.items() if k != "y"},
        "y": norm.buffers["h"],
        "res": res,
        "nw": norm.buffers["w"],
        "ss": ss,
        "yq": norm.buffers["xq"],
        "yr": norm.buffers["xr"],
        "yds": norm.buffers["xds"],
    }
    folded = Launch(
        prod.node, make(), bufs, lambda env: (groups, rows(env)), prod.scalars, prod.when, label=f"{prod.label or prod.node.op}+add_rms_norm", variant=make
    )
    plan.launches[plan.launches.index(prod)] = folded
    doc = getattr(norm.when, "doc", "always")
    norm.when = When(f"{doc}, not ({getattr(prod.when, 'doc', 'always')})", lambda env, a=norm.when, b=prod.when: a(env) and not b(env))
    for u in users:
        eps = lambda env, s=u.scalars: {**s(env), "eps": norm.scalars(env)["eps"]}  # noqa: E731
        again = partial(u.variant, rms_in=groups)  # type: ignore[arg-type]
        plan.launches[plan.launches.index(u)] = Launch(
            u.node, again(), {**u.buffers, "ss": ss}, u.grid, eps, u.when, label=f"{u.label or u.node.op}+rms", variant=again
        )
