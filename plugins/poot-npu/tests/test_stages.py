"""The AIE stages where no AIE toolchain is: a plan for null:xdna2 puts its products and norms on
the NPU and the rest on the host; each stage value round-trips through JSON; the shape ABI is held
to the plan it came from; the AIE stage refuses with what to install; ``poot plan`` prints the
offload and stops there."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from poot.backend import get_device
from poot.errors import PootError
from poot.plan import compile_plan
from poot.testing.paged import synthetic_graph
from poot_npu.offload import offloaded, served
from poot_npu.stages import AbiArg, AieCoreObject, BufferPlacement, CorePlacement, LinkedArtifact, LinkRecipe, check_abi, from_json, shape_abi, to_json
from poot_npu.targets import TARGETS
from poot_npu.toolchain import ToolchainMissing, emit_core_object


@pytest.fixture
def plan(tmp_path, rng):  # type: ignore[no-untyped-def]
    g, _ = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    return compile_plan(g, get_device("null:xdna2"))


ENV = {"tokens": 3, "batch": 2, "max_blocks": 4, "rows": 2, "blocks": 9}


def test_products_and_norms_go_to_the_npu_the_rest_to_the_host(plan):
    mine = offloaded(plan)
    assert mine and len(mine) < len(plan.launches)
    for i, l in enumerate(plan.launches):
        is_npu_op = l.node.op == "matmul" or "norm" in (l.label or "")
        assert (i in mine) == (is_npu_op and not served(l)), (i, l.label or l.node.op)
        assert l.place in ("", "host") and (l.place == "host") == (i not in mine)
    assert any(plan.launches[i].node.op == "matmul" for i in mine) and any("norm" in (plan.launches[i].label or "") for i in mine)
    assert "[on host]" in plan.describe(ENV)


def test_stage_values_round_trip_through_json(plan, rng):
    abi = tuple(shape_abi(plan, i, ENV) for i in offloaded(plan))
    objects = tuple(AieCoreObject(f"k{i}", "aie:aie2p", "clang 19 (llvm-aie)", rng.bytes(int(rng.integers(1, 300)))) for i in range(3))
    recipe = LinkRecipe(
        "step.elf",
        "aie:aie2p",
        (CorePlacement("k0", 0, 2, (0, 5)), CorePlacement("k1", 1, 2, (5, 9))),
        (BufferPlacement("x", "host", 4096),),
        objects,
        ("ld.lld", "{objects}", "-o", "{output}"),
    )
    art = LinkedArtifact(recipe, abi, rng.bytes(1000))
    for value in (*objects, recipe, art, abi[0]):
        text = to_json(value)
        back = from_json(text)
        assert back == value and type(back) is type(value)
        assert to_json(back) == text
    with pytest.raises(PootError, match=r"LinkRecipe: the JSON lacks \['target', 'cores'"):
        from_json('{"type": "LinkRecipe", "value": {"artifact": "x"}}')
    with pytest.raises(PootError, match="not an AIE stage"):
        from_json("[1, 2")


def test_the_shape_abi_is_held_to_its_plan(plan):
    i = offloaded(plan)[0]
    abi = shape_abi(plan, i, ENV)
    launch = plan.launches[i]
    assert [a.name for a in abi.args if a.kind != "groups"] == [p.name for p in launch.kernel.params]
    assert [a.name for a in abi.args if a.kind == "groups"][-2:] == ["loops_group_start", "loops_group_stop"]
    assert abi.tiles == int(np.prod(launch.grid(ENV))) and abi.threads == launch.kernel.threads
    x = next(a for a in abi.args if a.kind == "buffer" and a.shape and a.shape[0] == "tokens")
    assert len(x.strides) == len(x.shape) and x.strides[-1] == "1"
    check_abi(from_json(to_json(abi)), plan)
    bad = abi.__class__(abi.launch, abi.kernel, (AbiArg("x", "buffer", "f16"),) + abi.args[1:], abi.threads, abi.tiles, abi.env)
    with pytest.raises(PootError, match=f"launch {i}.*differs from its plan's in \\['args'\\]"):
        check_abi(bad, plan)
    moved = abi.__class__(abi.launch, abi.kernel, abi.args, abi.threads, abi.tiles + 1, abi.env)
    with pytest.raises(PootError, match="tiles"):
        check_abi(moved, plan)


def test_the_aie_stage_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PEANO_INSTALL_DIR", str(tmp_path / "missing"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainMissing, match="PEANO_INSTALL_DIR=.*missing has no bin/clang.*llvm-aie"):
        emit_core_object("define void @k() {\n ret void\n}\n", TARGETS["aie:aie2p"], "k")


def test_poot_plan_prints_the_offload_and_stops_at_the_aie_stage(smollm2_path):
    env = {k: v for k, v in os.environ.items() if k != "PEANO_INSTALL_DIR"}
    r = subprocess.run([sys.executable, "-m", "poot.cli", "plan", "SmolLM2", "--device", "null:xdna2"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "[on host]" in out and "NPU offload (aie:aie2p):" in out
    head = next(line for line in out.splitlines() if line.startswith("NPU offload"))
    npu, total = (int(x) for x in head.split(": ", 1)[1].split(" launches")[0].split(" of "))
    assert 0 < npu < total and "products" in head and "norms" in head
    assert "stage grid to loops:" in out and "stage LLVM IR for aie2p-none-unknown-elf:" in out
    assert "stage AIE core objects: stopped: aie refuses the AIE core objects:" in out and "PEANO_INSTALL_DIR" in out
