"""The planner's decisions and contract: fusion (norms, views, concat parts), schedules chosen by
shape, typed refusals naming op, device and reason, readable plans, and `poot plan`."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from poot.errors import Refusal
from poot.graph import GraphBuilder
from poot.graph.dims import sym
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.plan import Limits, compile_plan, plan_graph
from poot.runtime import Capabilities, Device, Unavailable
from poot.testing.paged import attention_block_graph


def _mlp_graph(wtype: str = "q5_1"):
    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 64])
    w = b.weight("w", "f32", [64])
    up = b.weight("up", wtype, [96, 64])
    from poot.graph.compose import rms_norm

    h = rms_norm(b, x, w, 1e-6)
    y = b.linear(h, up)
    half = b.slice(y, -1, 0, 48)
    rest = b.slice(y, -1, 48, 96)
    out = b.concat([b.mul(half, 2.0), b.add(rest, half)], axis=-1)
    return PassManager(DEFAULT_PASSES).run(b.build({"y": out}))


def test_fusion_decisions():
    plan = plan_graph(_mlp_graph())
    ops = collections.Counter(l.label or l.node.op for l in plan.launches)
    assert ops["rms_norm"] == 1  # mean, rsqrt and three multiplies: one kernel
    assert "slice" not in ops and "concat" not in ops  # read through views, written in place
    assert ops["matmul"] == 2  # a GEMV for few rows, a GEMM for many: one runs per shape
    assert sorted(str(l.when.doc) for l in plan.launches if l.when is not None) == ["rows <= 2", "rows > 2"]


def test_plan_description_names_values_and_kernels():
    plan = plan_graph(_mlp_graph())
    text = plan.describe({"tokens": 5})
    assert "tokens=5" in text and "up:q5_1[96, 64]" in text and "gemm_rows" in text and "gemv_lanes" not in text
    assert "rows <= 2" in str(plan)  # without symbol values every schedule is listed with its condition


def _device(**caps):
    base = dict(
        dtypes=frozenset({"f32", "i32", "u8", "bool"}),
        compute_units=2,
        max_workgroup_size=1024,
        shared_memory_bytes=1 << 20,
        subgroup_size=1,
        memory_bytes=1 << 30,
    )
    base.update(caps)
    return Device("cpu", None, "test host", target="host", capabilities=Capabilities(**base))


def test_refusals_name_op_device_and_reason():
    g = _mlp_graph()
    with pytest.raises(Refusal) as e:
        compile_plan(g, _device(max_workgroup_size=64))
    assert e.value.device == "cpu" and "256 threads" in e.value.reason
    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 8])
    h = b.cast(b.cast(x, "f16"), "f32")
    with pytest.raises(Refusal, match="f16 values are not supported") as e:
        compile_plan(PassManager(DEFAULT_PASSES).run(b.build({"y": b.mul(h, h)})), _device())
    assert e.value.op == "cast"
    gone = Device("cuda", 0, "no driver", target="nvptx:sm_90", unavailable=Unavailable("no-driver", "libcuda.so.1 is missing"))
    with pytest.raises(Refusal, match="unavailable.*libcuda"):
        compile_plan(g, gone)
    alien = Device("tpu", 0, "a target no installed backend compiles for", target="xla", capabilities=_device().capabilities)
    with pytest.raises(Refusal, match="tpu:0 refuses plan: no installed backend compiles kernels for its target 'xla'"):
        compile_plan(g, alien)


@pytest.mark.parametrize("wtype", ["q4_0", "q4_1", "q5_0", "q8_0"])
def test_integer_types_quantize_x_once_and_share_one_arithmetic(wtype):
    """On a host with a byte dot product (VNNI); without one, or at matmul precision "highest",
    the f32 lanes."""
    for limits in (Limits(), Limits(matrix=frozenset({"avx512vnni"}), matmul_precision="highest")):
        assert "quantize_x_host" not in plan_graph(_mlp_graph(wtype), limits=limits).describe({"tokens": 5})
    plan = plan_graph(_mlp_graph(wtype), limits=Limits(matrix=frozenset({"avxvnni"})))
    text = plan.describe({"tokens": 5})
    assert f"up:{wtype}[96, 64]" in text and "quantize_x_host" in text and "gemm_q8" in text and "gemm_rows" not in text
    mm = [l for l in plan.launches if l.node.op == "matmul"]
    assert [l.label for l in mm] == ["quantize_x_host", "", ""]  # one quantization of x, then the product for few rows or many
    assert sorted(str(l.when.doc) for l in mm if l.when is not None) == ["rows <= 2", "rows > 2"]
    assert [l.kernel.name.split("_")[0] for l in mm[1:]] == ["gemv", "gemm"]


def test_small_workgroup_memory_falls_back_to_the_gemv_schedule():
    plan = plan_graph(_mlp_graph(), limits=Limits(shared_bytes=512))
    mm = [l for l in plan.launches if l.node.op == "matmul"]
    assert len(mm) == 1 and mm[0].when is None and mm[0].kernel.name.startswith("gemv_lanes")


def test_poot_plan_prints_the_step(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "poot.cli", "plan", "SmolLM2", "--tokens", "3", "--context", "64"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "tokens=3" in r.stdout and "attention_lanes" in r.stdout and "activation arena" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "poot.cli", "plan", "SmolLM2", "--tokens", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--tokens: must be at least 1, got 0" in bad.stderr  # argparse's usage error
    assert r.stdout.count("\n") > 100  # a line or two per launch


@pytest.mark.parametrize("pools", ["f32", "f16"])
@pytest.mark.parametrize("gpu", [False, True])
def test_rope_with_kv_writes_and_residual_adds_with_norms_are_one_launch_each(gpu, pools):
    plan = plan_graph(attention_block_graph(pool_dtype=pools), gpu=gpu, limits=Limits(1024, 48 * 1024, subgroup=32 if gpu else 1))
    labels = collections.Counter(l.label or l.node.op for l in plan.launches)
    assert labels["rope_kv_cache"] == 1 and labels["rope"] == 0 and labels["cache_write"] == 0, labels
    pool_kernels = [
        l.kernel.name
        for l in plan.launches
        if l.label == "rope_kv_cache" or l.kernel.name.startswith(("attention_BLOCK", "attention_blocks", "attention_lanes"))
    ]
    assert pool_kernels and all(("_PTf16" in n) == (pools == "f16") for n in pool_kernels), pool_kernels
    assert labels["add_rms_norm"] == 2 and labels["rms_norm"] == 0, labels
    assert not any(l.kernel.name.startswith("ew_add") for l in plan.launches)
    assert len(plan.aliases) == 2  # the pools are written in place


@pytest.mark.parametrize("subgroup", [0, 8, 32])
def test_norms_sum_by_subgroup_reductions_where_the_device_runs_them(subgroup):
    plan = plan_graph(attention_block_graph(), gpu=True, limits=Limits(1024, 48 * 1024, subgroup=subgroup))
    names = [l.kernel.name for l in plan.launches if l.label == "add_rms_norm"]
    assert len(names) == 2 and all(f"_SUBGROUP{subgroup}_" in n for n in names), names


def test_fusions_leave_what_they_cannot_prove():
    """Keys converted before they are written (a cast between RoPE and the pool) keep their own RoPE
    and KV writes; a sum read before its norm keeps its add kernel."""
    b = GraphBuilder()
    T = sym("tokens")
    pos, slots = b.input("pos", "i32", [T]), b.input("slots", "i32", [T])
    kp, vp = b.input("kp", "f16", [8, 4, 2, 16]), b.input("vp", "f16", [8, 4, 2, 16])
    from poot.graph.rope import RopeConfig, apply_rope

    q, k = (apply_rope(b, b.input(n, "f32", [T, 2, 16]), pos, RopeConfig(16)) for n in "qk")
    graph = PassManager(DEFAULT_PASSES).run(
        b.build({"q": q, "kp": b.cache_write(kp, b.cast(k, "f16"), slots), "vp": b.cache_write(vp, b.input("v", "f32", [T, 2, 16]), slots)})
    )
    labels = collections.Counter(l.label or l.node.op for l in plan_graph(graph, gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32)).launches)
    assert labels["rope_kv_cache"] == 0 and labels["rope"] == 2 and labels["cache_write"] == 2, labels
    plan = plan_graph(attention_block_graph(norm_reads_sum_late=True), gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32))
    labels = collections.Counter(l.label or l.node.op for l in plan.launches)
    assert labels["rms_norm"] == 1 and labels["add_rms_norm"] == 1, labels


def test_a_weight_larger_than_the_device_binds_is_refused_by_name():
    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 256])
    graph = b.build({"y": b.linear(x, b.weight("big.weight", "bf16", [1024, 256]))})  # 512 KiB stored
    with pytest.raises(Refusal, match=r"weight 'big.weight' takes 524288 bytes.*at most 262144"):
        plan_graph(graph, device="vulkan:0", gpu=True, limits=Limits(1024, 32 * 1024, max_buffer_bytes=256 * 1024))
    plan_graph(graph, device="vulkan:0", gpu=True, limits=Limits(1024, 32 * 1024, max_buffer_bytes=1 << 20))


def test_a_steps_symbols_come_from_its_inputs_shapes():
    """``step_env``: each bare-symbol dimension of an input binds its symbol; a missing input, a
    wrong rank and one symbol of two sizes are errors naming the input."""
    import numpy as np

    from poot.errors import PootError
    from poot.runtime.executor import step_env

    plan = plan_graph(attention_block_graph())
    inputs = {
        "x": np.zeros((5, 64), np.float32),
        "r": np.zeros((5, 64), np.float32),
        "kp": np.zeros((8, 4, 4, 16), np.float32),
        "vp": np.zeros((8, 4, 4, 16), np.float32),
        "slots": np.zeros(5, np.int32),
        "pos": np.zeros(5, np.int32),
        "seq": np.zeros(5, np.int32),
        "ctx": np.zeros(2, np.int32),
        "bt": np.zeros((2, 4), np.int32),
    }
    assert step_env(plan, inputs) == {"tokens": 5, "batch": 2}
    assert step_env(plan, {**inputs, "pos": [0, 1, 2, 3, 4]}) == {"tokens": 5, "batch": 2}  # any array-like
    with pytest.raises(PootError, match="missing input 'bt'"):
        step_env(plan, {k: v for k, v in inputs.items() if k != "bt"})
    with pytest.raises(PootError, match="input 'ctx' has shape"):
        step_env(plan, {**inputs, "ctx": np.zeros((2, 1), np.int32)})
    with pytest.raises(PootError, match="input 'seq': dimension tokens is 4 here but 5 elsewhere"):
        step_env(plan, {**inputs, "seq": np.zeros(4, np.int32)})


def test_rows_gathered_from_a_steps_own_values_run_at_every_step_size(rng):
    """A gather whose table is one of the step's values (the decoder's hidden states at the logit
    rows: its rows are the step's tokens) is planned and gathers those rows, for each step size."""
    import numpy as np

    from poot.plugins import host
    from poot.runtime import get_device

    b = GraphBuilder()
    h = b.input("h", "f32", [sym("tokens"), 8])
    rows = b.input("rows", "i32", [sym("picked")])
    dev = get_device("cpu")
    plan = compile_plan(b.build({"y": b.gather(h, rows)}), dev)
    ex = host().hook.poot_executor(device=dev)(plan)
    try:
        for tokens, picked in ((5, 2), (9, 4)):
            x = rng.standard_normal((tokens, 8)).astype(np.float32)
            at = rng.integers(0, tokens, picked).astype(np.int32)
            np.testing.assert_array_equal(ex.run({"h": x, "rows": at}, {})["y"], x[at])
    finally:
        ex.close()
