"""What an NPU takes of a plan, and how far its compile stages go.

An NPU serves the products (``matmul``) and the norms: ``NpuSchedules.finish`` leaves every other
launch of the plan to the host CPU (``Launch.place = "host"``, which runs GPU-style kernels as
thread loops), and a product or norm too whose kernel has no looped form or whose looped form
needs more than a core's data memory. ``report`` is what ``poot plan --device npu:...`` prints
after the plan: the launches the NPU takes, then its stages in order (grid to loops, LLVM IR,
AIE core objects, link recipe, linked artifact with its shape ABI checked against the plan),
each with what it made, stopping at the first that cannot run here and saying why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from poot.backend import Plan, compile_kernel, grid_to_loops, group_range, host_target, lower_kernel
from poot.errors import Refusal
from poot.plan.schedules import Schedules

from .stages import AieCoreObject, BufferPlacement, CorePlacement, LinkedArtifact, LinkRecipe, check_abi, shape_abi
from .targets import CORE_MEMORY
from .toolchain import ToolchainMissing, require_toolchain

__all__ = ["NpuSchedules", "served", "offloaded", "report", "core_plan", "core_ranges", "COLUMNS"]

COLUMNS = 8  # an XDNA2 array's columns given to one launch: a core a column (row 2, the first compute row)


def _fmt(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def served(launch: Any) -> str:
    """Why an NPU does not take ``launch`` (an op it does not serve, a kernel without a looped form,
    one too large for a core), or "" where it does."""
    if not (launch.node.op == "matmul" or "norm" in (launch.label or "")):
        return f"{launch.label or launch.node.op} is not a product or a norm"
    try:
        looped = grid_to_loops(launch.kernel)
    except Refusal as e:
        return e.reason
    need = sum(s.size * max(1, s.dtype.bits // 8) for s in looped.shared)
    if need > CORE_MEMORY:
        return f"its looped form needs {_fmt(need)} of local memory, a core has {_fmt(CORE_MEMORY)}"
    return ""


class NpuSchedules(Schedules):
    def finish(self) -> None:
        for launch in self.plan.launches:
            if served(launch):
                launch.place = "host"


def offloaded(plan: Plan, env: Mapping[str, int] | None = None) -> list[int]:
    """Indices of the launches the NPU runs (of those active at ``env``)."""
    return [i for i, l in enumerate(plan.launches) if not l.place and (env is None or l.when is None or l.when(env))]


def report(plan: Plan, env: Mapping[str, int], tgt: Any, compile: bool = False) -> str:
    mine = offloaded(plan, env)
    active = [l for l in plan.launches if l.when is None or l.when(env)]
    kinds: dict[str, int] = {}
    for i in mine:
        kind = "products" if plan.launches[i].node.op == "matmul" else "norms"
        kinds[kind] = kinds.get(kind, 0) + 1
    lines = [
        f"NPU offload ({tgt.key}): {len(mine)} of {len(active)} launches on the NPU ("
        + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
        + f"), {len(active) - len(mine)} on the host CPU",
        "  on the NPU (launches as listed above): " + ", ".join(str(active.index(plan.launches[i])) for i in mine),
    ]
    kernels = {repr(plan.launches[i].kernel): plan.launches[i].kernel for i in mine}
    looped = {key: grid_to_loops(k) for key, k in kernels.items()}
    largest = max((sum(s.size * max(1, s.dtype.bits // 8) for s in k.shared) for k in looped.values()), default=0)
    lines.append(f"stage grid to loops: {len(looped)} kernels looped (local memory up to {_fmt(largest)} of {_fmt(CORE_MEMORY)})")
    t0 = time.perf_counter()
    ir = {key: str(lower_kernel(k, tgt)) for key, k in kernels.items()}
    lines.append(f"stage LLVM IR for {tgt.triple}: {len(ir)} modules, {_fmt(sum(len(t) for t in ir.values()))} ({time.perf_counter() - t0:.1f} s)")
    if compile:
        host = host_target()
        others = {repr(l.kernel): l.kernel for l in active if l.place}
        t0 = time.perf_counter()
        sizes = [len(compile_kernel(k, host).data) for k in others.values()]
        lines.append(f"host launches: {len(sizes)} kernels compiled for {host.key} ({_fmt(sum(sizes))}, {time.perf_counter() - t0:.1f} s)")
    try:
        tc = require_toolchain("the AIE core objects")
        objects = [AieCoreObject(kernels[key].name, tgt.key, tc.version, compile_kernel(kernels[key], tgt).data) for key in kernels]
        lines.append(f"stage AIE core objects: {len(objects)} by {tc.version} ({_fmt(sum(len(o.data) for o in objects))})")
        recipe = link_recipe(plan, env, mine, objects, tgt, tc.lld)
        lines.append(f"stage link recipe: {len(recipe.cores)} cores, {len(recipe.buffers)} buffers")
        if not tc.lld:
            raise ToolchainMissing("the linked artifact", f"{tc.clang} has no ld.lld beside it")
        art = link(recipe, [shape_abi(plan, i, env) for i in mine])
        for abi in art.abi:
            check_abi(abi, plan)
        lines.append(f"stage linked artifact: {_fmt(len(art.data))}, {len(art.abi)} shape ABIs checked against the plan")
    except ToolchainMissing as e:
        lines.append(f"stage AIE core objects: stopped: {e}")
    return "\n".join(lines)


def link_recipe(plan: Plan, env: Mapping[str, int], mine: list[int], objects: list[AieCoreObject], tgt: Any, lld: str) -> LinkRecipe:
    """Each offloaded launch's workgroups split over ``COLUMNS`` cores (a core a column), its buffers
    in host memory (streamed in and out by the shim DMA), the link of every core object."""
    cores, buffers = [], {}
    for i in mine:
        launch = plan.launches[i]
        abi = shape_abi(plan, i, env)
        for c, groups in enumerate(core_ranges(abi.tiles)):
            cores.append(CorePlacement(launch.kernel.name, c, 2, groups))
        for a in abi.args:
            if a.kind == "buffer":
                buffers.setdefault(a.name, BufferPlacement(a.name, "host", 0))
    return LinkRecipe("step.elf", tgt.key, tuple(cores), tuple(buffers.values()), tuple(objects), (lld, "{objects}", "-o", "{output}"))


def link(recipe: LinkRecipe, abi: list[Any]) -> LinkedArtifact:
    """Run the recipe's link: the linked artifact, carrying the ABI of each launch it serves."""
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        paths = []
        for n, o in enumerate(recipe.objects):
            p = Path(d) / f"{n}.o"
            p.write_bytes(o.data)
            paths.append(str(p))
        out = Path(d) / recipe.artifact
        cmd: list[str] = []
        for part in recipe.command:
            cmd += paths if part == "{objects}" else [str(out) if part == "{output}" else part]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise Refusal("link", recipe.target, f"ld.lld failed: {r.stderr.strip()[-800:]}")
        return LinkedArtifact(recipe, tuple(abi), out.read_bytes())


def core_ranges(tiles: int, cores: int = COLUMNS) -> list[tuple[int, int]]:
    """The workgroups [start, stop) each of ``cores`` cores runs of a launch of ``tiles`` (as the
    link recipe places them: a core a column, consecutive ranges)."""
    per = -(-tiles // cores)
    return [(c * per, min(tiles, (c + 1) * per)) for c in range(cores) if c * per < tiles]


def core_plan(plan: Plan, cores: int = COLUMNS) -> Plan:
    """``plan`` as the NPU's cores run it: each launch the NPU takes becomes, for each core, its
    looped kernel over that core's range of workgroups; the host's launches stay as they are. The
    looped kernels compile for any LLVM target, so the host runs this plan as the NPU would split
    it: how the offload is checked without an NPU."""
    launches = []
    for launch in plan.launches:
        if launch.place:
            launches.append(launch)
            continue
        looped = grid_to_loops(launch.kernel)
        for c in range(cores):

            def scalars(env, launch=launch, c=c):  # type: ignore[no-untyped-def]
                grid = tuple(launch.grid(env))
                ranges = core_ranges(int(np.prod(grid)), cores)
                start, stop = ranges[c] if c < len(ranges) else (0, 0)
                return {**launch.scalars(env), **group_range(grid, start, stop)}

            launches.append(replace(launch, kernel=looped, grid=lambda env: (1,), scalars=scalars, variant=None))
    return replace(plan, launches=launches)
