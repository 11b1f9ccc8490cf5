"""NVIDIA's choices in GPU plans (``NvidiaSchedules``): tensor-core GEMMs by row count, x split once,
the gated MLP written as bf16 terms, attention on tensor cores and a warp a position, the Q4_K GEMVs
reading x quantized once on Hopper, and the norm fold."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from poot.errors import Refusal
from poot.graph import GraphBuilder
from poot.graph.dims import sym
from poot.plan import Limits, plan_graph
from poot.plan import attention as plan_attention
from poot.plan.memory import plan_storage
from poot.profile.costs import launch_costs
from poot.testing.paged import attention_block_graph
from poot_ptx import schedules as nvidia_schedules
from poot_ptx.schedules import NvidiaSchedules


def nvidia_plan(graph, **kw):  # type: ignore[no-untyped-def]
    """``graph`` planned with NVIDIA's schedules (as ``compile_plan`` plans an nvptx device)."""
    return plan_graph(graph, schedules=NvidiaSchedules, **kw)


def test_gpu_plans_pick_schedules_by_row_count_and_fuse_the_gated_mlp():
    """On a GPU with 32-lane subgroups and mma.sync: bf16 products get warp GEMVs for few rows, the
    weight-streaming tensor-core GEMM up to 64 and the tiled one beyond; a gated MLP's two products
    and its silu * up become one launch while the rows are few."""
    from poot.graph.builder import GraphBuilder
    from poot.graph.dims import sym
    from poot.plan.lower import Limits

    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 512])
    g = b.linear(x, b.weight("wg", "bf16", [768, 512]))
    u = b.linear(x, b.weight("wu", "bf16", [768, 512]))
    h = b.mul(b.mul(g, b.sigmoid(g)), u)
    y = b.linear(h, b.weight("wd", "bf16", [512, 768]))
    graph = b.build({"y": y})
    plan = nvidia_plan(graph, device="cuda:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"})))

    def kernels(tokens):
        return [l.kernel.name for l in plan.launches if l.when is None or l.when({"tokens": tokens})]

    assert kernels(1) == ["gemv_warp_glu_bf16_K512_MR1", "gemv_warp_bf16_K768_MR1"]
    assert kernels(3) == ["gemv_warp_glu_bf16_K512_MR4", "gemv_warp_bf16_K768_MR4"]
    # more rows: x split into two bf16 terms once for both products that read it, then tensor cores;
    # silu(g) * u written straight as the bf16 terms the down projection reads
    k9 = kernels(9)
    assert k9 == ["split_bf16x2_K512"] + ["gemm_warp_bf16_K512_1x4_W8_xs"] * 2 + ["glu_split_bf16x2_N768", "gemm_warp_bf16_K768_1x4_W8_xs"]
    down = next(l for l in plan.launches if l.kernel.name.startswith("gemm_warp_bf16_K768"))
    assert down.buffers["xs"] == next(l for l in plan.launches if l.label == "glu_split").buffers["xs"]
    shared = [l for l in plan.launches if l.kernel.name.startswith("gemm_warp_bf16_K512")]
    assert {l.buffers["xs"] for l in shared} == {next(l for l in plan.launches if l.label == "split_x").buffers["xs"]}
    assert kernels(40)[:2] == ["split_bf16x2_K512", "gemm_warp_bf16_K512_2x4_W8_xs"]
    assert kernels(300)[:2] == ["split_bf16x2_K512", "gemm_mma_bf16_K512_2x2_4x8_xs"]
    # a product that is not only read by tensor-core GEMMs keeps the elementwise kernel and the split
    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 512])
    g = b.linear(x, b.weight("wg", "bf16", [768, 512]))
    u = b.linear(x, b.weight("wu", "bf16", [768, 512]))
    h = b.mul(b.mul(g, b.sigmoid(g)), u)
    both = nvidia_plan(
        b.build({"y": b.linear(h, b.weight("wd", "bf16", [512, 768])), "h": h}),
        device="cuda:0",
        gpu=True,
        limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"})),
    )
    names9 = [l.kernel.name for l in both.launches if l.when is None or l.when({"tokens": 9})]
    assert "glu_split_bf16x2_N768" not in names9 and any(k.startswith("ew_") for k in names9) and "split_bf16x2_K768" in names9
    # products of one x (q, k and v) share one launch while the rows are few
    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 512])
    outs = {n: b.linear(x, b.weight(n, "bf16", [rows, 512])) for n, rows in (("q", 512), ("k", 128), ("v", 128))}
    qkv = nvidia_plan(b.build(outs), device="cuda:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"})))
    one = [l.kernel.name for l in qkv.launches if l.when is None or l.when({"tokens": 1})]
    assert one == ["gemv_warp_3x_bf16_K512_MR1_512_128_128"]
    assert len([l for l in qkv.launches if l.when is None or l.when({"tokens": 30})]) == 4  # x split once, three GEMMs
    # without subgroup operations (SPIR-V): bf16 warp GEMVs summing through workgroup memory for few
    # rows (the gated pair fused), the register-tiled GEMM for more, no tensor cores
    generic = plan_graph(graph, device="gpu", gpu=True, limits=Limits(1024, 48 * 1024))
    few = [l.kernel.name for l in generic.launches if l.when is None or l.when({"tokens": 1})]
    assert few == ["gemv_warp_glu_bf16_K512_MR1_shared_sums", "gemv_warp_bf16_K768_MR1_shared_sums"]
    many = [l.kernel.name for l in generic.launches if l.when is None or l.when({"tokens": 9})]
    assert not any("warp" in k or "mma" in k for k in many) and "gemm_simt_bf16_K512_BK32" in many and "gemm_simt_bf16_K768_BK32" in many
    small = plan_graph(graph, device="gpu", gpu=True, limits=Limits(1024, 16 * 1024))  # WebGPU's default workgroup memory
    assert "gemm_simt_bf16_K512_BK16" in [l.kernel.name for l in small.launches if l.when is None or l.when({"tokens": 9})]


def test_attention_runs_on_tensor_cores_and_warps_where_the_heads_suit_them(monkeypatch):
    """Prompts of 32+ new tokens on average (``MMA_FROM_TOKENS``) with heads of 64 or 128 values,
    given mma.sync: the tensor-core attention; decode there: a warp a position (over f32 or f16
    pools); otherwise the thread-a-position schedules."""
    mma = Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"}))

    def names(plan, tokens, batch):
        env = {"tokens": tokens, "batch": batch}
        return [l.kernel.name for l in plan.launches if l.node.op == "attention" and (l.when is None or l.when(env))]

    wide = nvidia_plan(attention_block_graph(head_dim=64), gpu=True, limits=mma)
    assert names(wide, 128, 2) == ["attention_mma_D64_causal_BS4_nocap"]  # the pools' block size fixed, no soft-cap
    assert names(wide, 64, 2) == ["attention_mma_D64_causal_BS4_nocap"]  # 32 a prompt
    assert names(wide, 62, 2)[0].startswith("attention_blocks")  # shorter prompts: the CUDA-core blocks
    assert names(wide, 2, 2) == ["attention_decode_D64_causal_S1_nocap"]  # decode: a warp a position, 16 warps a workgroup
    assert names(wide, 200, 200) == ["attention_decode_D64_causal_S1_W4_nocap"]  # many (token, head) pairs: four warps, several an SM
    # grouped-query heads (8 sharing 2): beyond 128 (token, head) pairs one head a workgroup, or with
    # DECODE_GROUP 4 a workgroup scores the 4 query heads of a key/value head, with fewer warps as
    # its workgroups are more
    gqa_graph = attention_block_graph(pool_dtype="f16", head_dim=64, heads=8, kv_heads=2)
    assert names(nvidia_plan(gqa_graph, gpu=True, limits=mma), 200, 200) == ["attention_decode_D64_causal_S1_W4_nocap_PTf16"]
    monkeypatch.setattr(plan_attention, "DECODE_GROUP", 4)
    gqa = nvidia_plan(gqa_graph, gpu=True, limits=mma)
    assert names(gqa, 16, 16) == ["attention_decode_D64_causal_S1_nocap_PTf16"]  # 128 pairs: one head a wide workgroup
    assert names(gqa, 17, 17) == names(gqa, 64, 64) == ["attention_decode_D64_causal_S1_G4_nocap_PTf16"]  # 34-128 workgroups of four heads: 16 warps
    assert names(gqa, 65, 65) == names(gqa, 128, 128) == ["attention_decode_D64_causal_S1_W8_G4_nocap_PTf16"]  # 130-256: eight
    assert names(gqa, 200, 200) == ["attention_decode_D64_causal_S1_W4_G4_nocap_PTf16"]  # 400 workgroups: four warps each
    grid = next(l for l in gqa.launches if l.kernel.name.endswith("W4_G4_nocap_PTf16")).grid({"tokens": 200, "batch": 200})
    assert tuple(grid) == (200, 2, 1), grid
    narrow = nvidia_plan(attention_block_graph(), gpu=True, limits=mma)  # heads of 16: the CUDA-core schedules
    assert names(narrow, 128, 2)[0].startswith("attention_blocks") and names(narrow, 2, 2)[0].startswith("attention_BLOCK")
    plain = plan_graph(attention_block_graph(head_dim=64), gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32))  # 32 lanes, no mma.sync (Vulkan on NVIDIA)
    assert names(plain, 128, 2)[0].startswith("attention_blocks") and names(plain, 2, 2)[0].startswith("attention_BLOCK")
    half = nvidia_plan(attention_block_graph(pool_dtype="f16", head_dim=64), gpu=True, limits=mma)  # f16 pools: the same kernels, reading halves
    assert names(half, 128, 2) == ["attention_mma_D64_causal_BS4_nocap_PTf16"] and names(half, 2, 2) == ["attention_decode_D64_causal_S1_nocap_PTf16"]
    assert names(half, 40, 2)[0].startswith("attention_blocks") and "_PTf16" in names(half, 40, 2)[0]
    assert names(half, 256, 8) == ["attention_mma_D64_causal_BS4_nocap_PTf16"] and names(half, 248, 8)[0].startswith("attention_blocks")


def test_matmul_precision_chooses_how_activations_meet_tensor_cores():
    """ "high" (the default): x split into two bf16 terms, attention's operands too; "medium": x
    rounded to bf16 once and one product, attention on bf16 operands; "highest": no tensor cores
    (the CUDA-core GEMM and attention blocks). Decode (few rows) is the same f32 GEMV in all three.
    Another value is refused by name."""
    from poot.errors import ParameterError
    from poot.graph.builder import GraphBuilder
    from poot.graph.dims import sym

    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 512])
    graph = b.build({"y": b.linear(x, b.weight("w", "bf16", [768, 512]))})

    def kernels(g, precision, env):
        plan = nvidia_plan(
            g, device="cuda:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"}), matmul_precision=precision)
        )
        return [l.kernel.name for l in plan.launches if l.when is None or l.when(env)]

    assert kernels(graph, "high", {"tokens": 300}) == ["split_bf16x2_K512", "gemm_mma_bf16_K512_2x2_4x8_xs"]
    assert kernels(graph, "medium", {"tokens": 300}) == ["split_bf16x1_K512", "gemm_mma_bf16_K512_2x2_4x8_xb"]
    assert kernels(graph, "medium", {"tokens": 9}) == ["split_bf16x1_K512", "gemm_warp_bf16_K512_1x4_W8_xb"]
    assert kernels(graph, "highest", {"tokens": 300}) == ["gemm_simt_bf16_K512_BK32"]
    assert {kernels(graph, p, {"tokens": 1})[0] for p in ("high", "medium", "highest")} == {"gemv_warp_bf16_K512_MR1"}
    # a Hopper GPU (wgmma): the tiled products on its warpgroup instructions, the rest as before
    hopper = lambda p, env: [  # noqa: E731
        l.kernel.name
        for l in nvidia_plan(
            graph,
            device="cuda:0",
            gpu=True,
            limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16", "wgmma"}), matmul_precision=p, dynamic_shared=227 * 1024),
        ).launches
        if l.when is None or l.when(env)
    ]
    assert hopper("high", {"tokens": 2048}) == ["split_bf16x2_K512", "gemm_wgmma_bf16_K512_N128_S4_BK32_W64_xs"]
    assert hopper("medium", {"tokens": 2048}) == ["split_bf16x1_K512", "gemm_wgmma_bf16_K512_N256_S4_BK64_W128_xb"]
    # fewer rows than fill the SMs with 128 x bn tiles: K split (as many parts as keep about 256
    # workgroups of <= 96 KiB, 128 of more, busy), the parts added in order
    assert hopper("high", {"tokens": 300}) == ["split_bf16x2_K512", "gemm_wgmma_bf16_K512_N128_S4_BK32_W64_P8_xs", "sum_parts_8"]
    assert hopper("medium", {"tokens": 300}) == ["split_bf16x1_K512", "gemm_wgmma_bf16_K512_N256_S4_BK64_W128_P8_xb", "sum_parts_8"]
    assert hopper("medium", {"tokens": 9}) == kernels(graph, "medium", {"tokens": 9})
    # 17-64 rows: a warpgroup's 64 rows a workgroup, K split to keep ~256 workgroups streaming the weights
    assert hopper("high", {"tokens": 40}) == ["split_bf16x2_K512", "gemm_wgmma_bf16_K512_M64_N128_S4_BK32_W64_P8_xs", "sum_parts_8"]
    assert hopper("medium", {"tokens": 64}) == ["split_bf16x1_K512", "gemm_wgmma_bf16_K512_M64_N128_S4_BK32_W64_P8_xb", "sum_parts_8"]
    assert hopper("highest", {"tokens": 300}) == ["gemm_simt_bf16_K512_BK32"]
    # without the opt-in workgroup memory its ring of stages needs: the mma.sync GEMM
    assert [
        l.kernel.name
        for l in nvidia_plan(
            graph, device="cuda:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16", "wgmma"}))
        ).launches
        if l.when is None or l.when({"tokens": 300})
    ] == kernels(graph, "high", {"tokens": 300})
    block = attention_block_graph(head_dim=64)
    attn = lambda p: [k for k in kernels(block, p, {"tokens": 128, "batch": 2}) if k.startswith("attention")]  # noqa: E731
    assert attn("high") == ["attention_mma_D64_causal_BS4_nocap"] and attn("medium") == ["attention_mma_D64_causal_bf16_BS4_nocap"]
    assert attn("highest")[0].startswith("attention_blocks")
    with pytest.raises(ParameterError, match="matmul_precision.*'low'"):
        Limits(matmul_precision="low")


def test_packed_weights_reach_tensor_cores_dequantized_to_bf16(monkeypatch):
    """Beyond four rows on a GPU with mma.sync: Q4_K products of 5-64 rows on the integer tensor
    cores (x quantized once; K split where the output's tiles are few, the parts added after; fewer
    rows a workgroup where x's would not fit its memory), Q6_K ones there too (taken out of
    ``IMMA_XS``: up to 64 rows through the streaming tensor-core GEMM that dequantizes them in registers), beyond 64 dequantized to bf16 into
    scratch memory for the tiled GEMM; another packed type (Q8_0) dequantized into scratch for both.
    Up to four rows: warp GEMVs (Q4_K's and Q6_K's own on dp4a, any other packed type's through its
    dequantization body); "highest" keeps the register-tiled GEMM; a weight too large for the
    scratch budget keeps it too, but for Q4_K and Q6_K, whose streaming GEMMs take every row count
    then."""
    from poot.kernel.library.linear_gpu import gemv_warp_q6_k

    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 512])
    graph = b.build(
        {
            "y": b.linear(x, b.weight("w", "q4_k", [768, 512])),
            "z": b.linear(x, b.weight("v", "q6_k", [256, 512])),
            "u": b.linear(x, b.weight("u", "q8_0", [256, 512])),
        }
    )

    def launches(precision, tokens):
        plan = nvidia_plan(
            graph, device="cuda:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"}), matmul_precision=precision)
        )
        return plan, [l for l in plan.launches if l.when is None or l.when({"tokens": tokens})]

    # with Q6_K's streaming GEMM switched off (STREAM_Q6_K), Q6_K takes its bf16 copy beyond the
    # integer GEMM's rows; from 5 rows with that off too
    monkeypatch.setattr(nvidia_schedules, "STREAM_Q6_K", False)
    deq = next(l for l in launches("high", 65)[1] if l.kernel.name == "dequantize_bf16_q6_k_K512")
    assert not deq.when({"tokens": 64}) and "gemm_imma_q6_k_xs_K512_1x2_W4_pipe" in [l.kernel.name for l in launches("high", 9)[1]]
    monkeypatch.delitem(nvidia_schedules.IMMA_XS, "q6_k")  # (on by default: below)
    assert [l.kernel.name for l in launches("high", 9)[1]][4:6] == ["dequantize_bf16_q6_k_K512", "gemm_warp_bf16_K512_1x4_W8_xs"]
    monkeypatch.setattr(nvidia_schedules, "STREAM_Q6_K", True)
    plan, nine = launches("high", 9)
    # Q4_K of 5 to 64 rows on the integer tensor cores, x quantized once for it (two parts of K:
    # 768 features make 3 workgroups); x split for the others
    assert [l.kernel.name for l in nine] == [
        "quantize_q8x2_K512",
        "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe",
        "sum_parts_2",
        "split_bf16x2_K512",
        "gemm_warp_q6_k_K512_1x4_W8_xs",
        "dequantize_bf16_q8_0_K512",
        "gemm_warp_bf16_K512_1x4_W8_xs",
    ]
    assert [l.kernel.name for l in launches("high", 5)[1]][:2] == ["quantize_q8x2_K512", "gemm_imma_q4_k_xs_K512_2x1_W4_S2_pipe"]  # one row tile
    # at "medium" the integer GEMM takes x's first int8 term alone (one product a sub-block)
    assert [l.kernel.name for l in launches("medium", 9)[1]][:2] == ["quantize_q8x2_K512", "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe_T1"]
    # 48 KiB of workgroup memory: 33-64 rows in workgroups of 32 (x's 64 rows would take 82 KiB)
    assert [l.kernel.name for l in launches("high", 40)[1]][:2] == ["quantize_q8x2_K512", "gemm_imma_q4_k_xs_K512_1x4_W8_S2_pipe"]
    assert launches("high", 40)[1][1].grid({"tokens": 40}) == (2, 6, 2)  # 128 features a workgroup
    weights = {l.buffers["w"] for l in plan.launches if l.kernel.name.startswith("gemv_")}
    assert {nine[1].buffers["w"], nine[4].buffers["w"]} <= weights and not {nine[1].buffers["w"], nine[4].buffers["w"]} & set(plan.scratch)  # as stored
    assert all(nine[1].buffers[b] == nine[0].buffers[b] for b in ("xq", "xr", "xds"))
    assert nine[1].buffers["y"] == nine[2].buffers["p"] in plan.scratch and nine[2].buffers["y"] not in plan.scratch  # the parts, then y
    assert nine[4].buffers["xs"] == nine[6].buffers["xs"] == nine[3].buffers["xs"]  # one split of x for both
    assert nine[5].buffers["wd"] == nine[6].buffers["w"] and nine[5].buffers["wd"] in plan.scratch
    assert plan.scratch[nine[5].buffers["wd"]].words({}) == 256 * 512 // 2
    plan, many = launches("medium", 300)
    assert [l.kernel.name for l in many] == [
        "dequantize_bf16_q4_k_K512",
        "split_bf16x1_K512",
        "gemm_mma_bf16_K512_2x2_4x8_xb",
        "dequantize_bf16_q6_k_K512",
        "gemm_mma_bf16_K512_2x2_4x8_xb",
        "dequantize_bf16_q8_0_K512",
        "gemm_mma_bf16_K512_2x2_4x8_xb",
    ]
    assert many[0].buffers["wd"] == many[2].buffers["w"] and many[0].buffers["wd"] in plan.scratch
    assert [l.kernel.name for l in launches("high", 40)[1]][3:5] == ["split_bf16x2_K512", "gemm_warp_q6_k_K512_2x4_W8_xs"]
    # Q6_K on the integer tensor cores too (``IMMA_XS``): x quantized once for both
    monkeypatch.setitem(nvidia_schedules.IMMA_XS, "q6_k", nvidia_schedules.IMMA_Q6_K)
    both = [l for l in launches("high", 9)[1]]
    assert [l.kernel.name for l in both][:5] == [
        "quantize_q8x2_K512",
        "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe",
        "sum_parts_2",
        "split_bf16x2_K512",  # (for the Q8_0 product)
        "gemm_imma_q6_k_xs_K512_1x2_W4_pipe",
    ]
    assert all(both[4].buffers[b] == both[0].buffers[b] for b in ("xq", "xr", "xds"))
    monkeypatch.delitem(nvidia_schedules.IMMA_XS, "q6_k")  # off: Q6_K streams through the warp GEMM
    assert [l.kernel.name for l in launches("high", 64)[1]][4] == "gemm_warp_q6_k_K512_2x4_W8_xs"
    assert [l.kernel.name for l in launches("high", 1)[1]] == ["gemv_warp_q4_k_K512_MR1", "gemv_warp_q6_k_K512_MR1", "gemv_warp_packed_q8_0_K512_MR1"]
    assert [l.kernel.name for l in launches("high", 3)[1]] == ["gemv_warp_q4_k_K512_MR4", "gemv_warp_q6_k_K512_MR4", "gemv_warp_packed_q8_0_K512_MR4"]
    # one row of x: the Q4_K GEMV's lanes take 32 quant bytes on CUDA devices, 16 elsewhere (Vulkan)
    vk = plan_graph(graph, device="vulkan:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32))
    assert [l.kernel.name for l in vk.launches if l.when is None or l.when({"tokens": 1})][0] == "gemv_warp_q4_k_K512_MR1_narrow"
    # Hopper: Q4_K up to 64 rows on the integer tensor cores (64 rows a workgroup: its memory holds
    # them), beyond through its dequantized copy; Q6_K streams through the warp GEMM up to 64 rows;
    # the Q8_0 weight through its copy from 17 rows
    hopper = nvidia_plan(
        graph, device="cuda:0", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16", "wgmma"}), dynamic_shared=227 * 1024)
    )
    at = lambda t: [l for l in hopper.launches if l.when is None or l.when({"tokens": t})]  # noqa: E731
    assert [l.kernel.name for l in at(40)] == [
        "quantize_q8x2_K512",
        "gemm_imma_q4_k_xs_K512_1x8_W8_S2_tm",
        "sum_parts_2",
        "split_bf16x2_K512",
        "gemm_warp_q6_k_K512_2x4_W8_xs",
        "dequantize_bf16_q8_0_K512",
        "gemm_wgmma_bf16_K512_M64_N128_S4_BK32_W64_P8_xs",
        "sum_parts_8",
    ]
    assert [l.kernel.name for l in at(65)][4:6] == ["dequantize_bf16_q6_k_K512", "gemm_wgmma_bf16_K512_N128_S4_BK32_W64_P8_xs"]
    assert at(40)[1].buffers["w"] == at(1)[1].buffers["w"] and at(40)[1].buffers["y"] == at(40)[2].buffers["p"] in hopper.scratch
    assert at(40)[4].buffers["w"] == at(1)[2].buffers["w"] and at(40)[5].buffers["wd"] == at(40)[6].buffers["w"]
    # one row of x on Hopper: x quantized once, by its own launch, for the Q4_K GEMV, which stages it
    # (Q6_K's quantizes x itself); more rows: each workgroup quantizes its rows
    assert [l.kernel.name for l in at(1)] == [
        "quantize_q8x2_K512",
        "gemv_warp_q4_k_K512_MR1_xs_G2",
        "gemv_warp_q6_k_K512_MR1",
        "gemv_warp_packed_q8_0_K512_MR1",
    ]
    assert all(at(1)[0].buffers[n] == at(1)[1].buffers[f"{n}_in"] in hopper.scratch for n in ("xq", "xr", "xds"))
    assert at(1)[0].buffers["x"] == at(1)[2].buffers["x"] and "x" not in at(1)[1].buffers
    assert [l.kernel.name for l in at(3)] == ["gemv_warp_q4_k_K512_MR4", "gemv_warp_q6_k_K512_MR4", "gemv_warp_packed_q8_0_K512_MR4"]
    assert [l.kernel.name for l in at(12)][:2] == ["quantize_q8x2_K512", "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe"]
    assert [l.kernel.name for l in at(32)][:2] == ["quantize_q8x2_K512", "gemm_imma_q4_k_xs_K512_1x4_W8_S2_pipe"]
    assert [l.kernel.name for l in at(300)] == [
        "dequantize_bf16_q4_k_K512",
        "split_bf16x2_K512",
        "gemm_wgmma_bf16_K512_N128_S4_BK32_W64_P8_xs",
        "sum_parts_8",
        "dequantize_bf16_q6_k_K512",
        "gemm_wgmma_bf16_K512_N128_S4_BK32_W64_P8_xs",
        "sum_parts_8",
        "dequantize_bf16_q8_0_K512",
        "gemm_wgmma_bf16_K512_N128_S4_BK32_W64_P8_xs",
        "sum_parts_8",
    ]
    assert at(300)[0].buffers["wd"] == at(300)[2].buffers["w"] and at(300)[2].buffers["y"] == at(300)[3].buffers["p"] in hopper.scratch
    b = GraphBuilder()  # any other packed type: a subgroup a feature through its dequantization body
    xo = b.input("x", "f32", [sym("tokens"), 576])
    other = plan_graph(b.build({"y": b.linear(xo, b.weight("w", "q8_0", [64, 576]))}), device="gpu", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=8))
    assert [(l.kernel.name, l.when.doc) for l in other.launches] == [
        ("gemv_warp_packed_q8_0_K576_MR1_L8", "rows <= 1"),
        ("gemv_warp_packed_q8_0_K576_MR4_L8", "1 < rows <= 4"),
        ("gemm_simt_q8_0_K576_BK32", "rows > 4"),
    ]
    # 16-bit floats are no packed type (blocks of one): the generic GEMV, as before
    for dtype, k, lim in (
        ("bf16", 576, Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"}))),
        ("f16", 512, Limits(1024, 48 * 1024, subgroup=8)),
    ):
        b = GraphBuilder()
        xf = b.input("x", "f32", [sym("tokens"), k])
        half = plan_graph(b.build({"y": b.linear(xf, b.weight("w", dtype, [64, k]))}), device="gpu", gpu=True, limits=lim)
        assert [l.kernel.name.split("_")[0] + "_" + l.kernel.name.split("_")[1] for l in half.launches] == ["gemv_blocks", "gemm_simt"]
    # Q6_K's own GEMV takes whole steps of its subgroup (16 values a lane): else the body's
    b = GraphBuilder()
    x6 = b.input("x", "f32", [sym("tokens"), 1536])
    wide = plan_graph(b.build({"y": b.linear(x6, b.weight("w", "q6_k", [64, 1536]))}), device="gpu", gpu=True, limits=Limits(1024, 48 * 1024, subgroup=64))
    assert wide.launches[0].kernel.name == "gemv_warp_packed_q6_k_K1536_MR1_L64"
    with pytest.raises(ValueError, match="and of 1024"):
        gemv_warp_q6_k(1536, 1, 64)
    assert not any("dequantize" in l.kernel.name or "mma" in l.kernel.name for l in launches("highest", 300)[1])
    # without subgroup operations: the GEMV whose workgroups split K, up to two rows
    plain = plan_graph(graph, device="gpu", gpu=True, limits=Limits(1024, 48 * 1024))
    assert [l.kernel.name for l in plain.launches if l.when({"tokens": 2})] == [
        "gemv_blocks_BB144_BLOCK64_BS256_QTYPEq4_k_ROWS4",
        "gemv_blocks_BB210_BLOCK64_BS256_QTYPEq6_k_ROWS4",
        "gemv_blocks_BB34_BLOCK64_BS32_QTYPEq8_0_ROWS4",
    ]
    assert [l.kernel.name for l in plain.launches if l.when({"tokens": 3})] == [
        "gemm_simt_q4_k_K512_BK32",
        "gemm_simt_q6_k_K512_BK32",
        "gemm_simt_q8_0_K512_BK32",
    ]
    monkeypatch.setattr(nvidia_schedules, "DEQUANT_BYTES", 2 * 256 * 512 - 1)
    assert [l.kernel.name.split("_K")[0] for l in launches("high", 300)[1]] == ["split_bf16x2", "gemm_warp_q4_k", "gemm_warp_q6_k", "gemm_simt_q8_0"]


def test_k_split_integer_gemms_add_their_own_parts_with_imma_summed(monkeypatch):
    """With ``IMMA_SUMMED`` a K-split integer GEMM adds its parts itself ("_R": the last of a tile's
    workgroups), with no ``sum_parts`` launch: the parts in scratch, the sums in the outputs (q, k
    and v divided among theirs), the tiles' arrival counts a zeroed array of the launch's own, one
    word a tile of the regime's most rows. Unsplit launches are unchanged."""
    monkeypatch.setattr(nvidia_schedules, "IMMA_SUMMED", True)
    b = GraphBuilder()
    x, x2 = (b.input(nm, "f32", [sym("tokens"), 512]) for nm in ("x", "x2"))
    outs = {n: b.linear(x, b.weight(f"w{n}", "q4_k", [size, 512])) for n, size in (("q", 512), ("k", 256), ("v", 256))}
    graph = b.build({**outs, "y": b.linear(x2, b.weight("wy", "q4_k", [768, 512]))})
    hopper = Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16", "wgmma"}), dynamic_shared=227 * 1024)
    plan = nvidia_plan(graph, device="cuda:0", gpu=True, limits=hopper)
    at = lambda t: [l for l in plan.launches if l.when is None or l.when({"tokens": t})]  # noqa: E731
    nine = at(9)
    assert not any(l.kernel.name.startswith("sum_parts") for l in nine), [l.kernel.name for l in nine]
    split = [l for l in nine if l.kernel.name.startswith("gemm_imma")]
    assert sorted(l.kernel.name for l in split) == ["gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe_P512_256_256_R", "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe_R"]
    qkv, one = sorted(split, key=lambda l: l.kernel.name)
    assert one.buffers["p"] in plan.scratch and one.buffers["y"] not in plan.scratch
    assert all(qkv.buffers[f"y{i}"] not in plan.scratch for i in range(3)) and qkv.buffers["p"] in plan.scratch
    for launch, tiles in ((one, 6), (qkv, 8)):  # 128 features a workgroup
        counts = launch.buffers["counts"]
        assert counts.dtype == np.int32 and counts.shape == (1 * tiles,) and not counts.any()  # 16 rows a tile up to 16
        assert tuple(launch.grid({"tokens": 16}))[:2] == (1, tiles)
    assert one.buffers["counts"] is not qkv.buffers["counts"]
    monkeypatch.setattr(nvidia_schedules, "IMMA_SUMMED", False)
    plain = nvidia_plan(graph, device="cuda:0", gpu=True, limits=hopper)
    names = [l.kernel.name for l in plain.launches if l.when is None or l.when({"tokens": 9})]
    assert "sum_parts_2" in names and "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe" in names


def test_q_k_and_v_of_5_to_64_rows_take_one_integer_gemm_launch():
    """Products of one x by Q4_K weights whose features are whole workgroups (q, k and v): from 5 to
    64 rows one integer GEMM launch a regime for all three (K split for their sum of features, one
    ``sum_parts`` dividing the sums among their outputs); one row their fused GEMV; beyond 64 rows
    each its own. Features that are not whole workgroups keep a launch each."""

    def plan(sizes):  # type: ignore[no-untyped-def]
        b = GraphBuilder()
        x = b.input("x", "f32", [sym("tokens"), 512])
        graph = b.build({f"y{i}": b.linear(x, b.weight(f"w{i}", "q4_k", [n, 512])) for i, n in enumerate(sizes)})
        hopper = Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16", "wgmma"}), dynamic_shared=227 * 1024)
        p = nvidia_plan(graph, device="cuda:0", gpu=True, limits=hopper)
        return p, lambda t: [l for l in p.launches if l.when is None or l.when({"tokens": t})]

    p, at = plan((512, 256, 256))
    one, twelve = at(1), at(12)
    assert [l.kernel.name for l in one] == ["quantize_q8x2_K512", "gemv_warp_3x_q4_k_K512_MR1_512_256_256_xs_G3"]
    assert [l.kernel.name for l in twelve] == ["quantize_q8x2_K512", "gemm_imma_q4_k_xs_K512_1x2_W8_S2_pipe_P512_256_256", "sum_parts_2_into_512_256_256"]
    fused, add = twelve[1], twelve[2]
    assert fused.label == "3 matmuls" and fused.grid({"tokens": 12}) == (1, 8, 2) and fused.scalars({"tokens": 12}) == {"m": 12, "n": 1024}
    assert [fused.buffers[f"w{i}"] for i in range(3)] == [one[1].buffers[f"w{i}"] for i in range(3)]  # the weights as stored
    assert fused.buffers["y"] == add.buffers["p"] in p.scratch and [add.buffers[f"y{i}"] for i in range(3)] == [one[1].buffers[f"y{i}"] for i in range(3)]
    assert all(fused.buffers[b] == twelve[0].buffers[b] for b in ("xq", "xr", "xds"))
    assert [l.kernel.name for l in at(64)][1] == "gemm_imma_q4_k_xs_K512_1x8_W8_S2_P512_256_256_tm"
    # the profile's FLOPs: the fused launch counts every weight's product, the launches around it none
    storage = plan_storage(p, {"tokens": 12})
    flops = [c.flops for c in launch_costs(p, storage, {}, np.arange(12))]
    assert flops[1] == 2 * 12 * 512 * (512 + 256 + 256) and flops[0] < flops[1] // 100 and flops[2] < flops[1] // 100
    beyond = [l.kernel.name for l in at(65)]  # each its own warpgroup GEMM
    assert beyond.count("gemm_wgmma_bf16_K512_N128_S4_BK32_W64_P8_xs") == 3 and not any("_P5" in nm or "_into_" in nm for nm in beyond)
    _, at = plan((512, 192, 192))  # 192 features: not whole workgroups of 128
    names = [l.kernel.name for l in at(12)]
    assert names.count("quantize_q8x2_K512") == 1 and sum(nm.startswith("gemm_imma_q4_k_xs_K512_") and "_P" not in nm for nm in names) == 3


def test_one_row_q4_k_products_read_x_quantized_once_before_them(tmp_path, monkeypatch):
    """Hopper, one row: each x that one-row Q4_K GEMVs read (q/k/v's, the gated MLP's, o's, down's)
    is quantized by one launch placed before its first reader, into scratch areas its readers
    stage; the products fused into one launch take x that way too. Where an RMSNorm computes x
    (q/k/v's, the gated MLP's) or the decode attention does (o's), that launch is the producer's
    own; more rows keep the plain norm; a long context (the attention split) o's own quantization.
    The plan before ``norm_fold`` (``FOLD_NORMS`` off), which
    ``test_the_norm_between_two_one_row_q4_k_products_is_folded_into_both`` folds."""
    from poot.testing.paged import wide_q4_k_llama

    monkeypatch.setattr(nvidia_schedules, "FOLD_NORMS", False)
    g, _ = wide_q4_k_llama(tmp_path, 1)
    hopper = Limits(1024, 48 * 1024, frozenset({"f32", "f16", "bf16", "i8", "i32"}), 32, frozenset({"mma.sync.bf16", "wgmma"}), 1 << 40, "high", 227 * 1024)
    plan = nvidia_plan(g, device="cuda:0", gpu=True, limits=hopper)

    def runs(l, tokens=1, blocks=4):  # in the one-row step (a decode step of one sequence), or one of ``tokens``
        try:
            return l.when is None or l.when({"tokens": tokens, "batch": tokens, "max_blocks": blocks})
        except KeyError:
            return False

    step = [l for l in plan.launches if runs(l)]
    written: dict = {}
    readers = collections.Counter()
    writers = collections.Counter()
    for l in step:
        xq = l.buffers.get("xq", l.buffers.get("yq"))  # (a GEMV names what it writes yq: its xq is its own x's workgroup array)
        if xq is not None:
            assert xq not in written, "x quantized twice"
            written[xq] = l.buffers.get("y", l.buffers.get("out", l.buffers.get("x")))
            writers[l.kernel.name.split("_K")[0].split("_D")[0]] += 1
        if l.kernel.name.startswith("gemv_warp") and "_xs" in l.kernel.name:
            assert l.buffers["xq_in"] in written, f"{l.kernel.name} reads x quantized before any launch writes it"
            readers[(l.label or "matmul").split("+")[0]] += 1
    assert readers["3 matmuls"] == readers["gated_mlp"] == 2 and readers["matmul"] >= 3, readers  # two layers: q/k/v and gate/up fused; o, down
    # each layer's two norms (the first alone, the rest with the residual add) write x quantized, the decode attention o's
    # x, the gated MLP's GEMV down's (the last down projection and the head are Q6_K: the final norm stays plain, and the
    # last gated MLP's output is not quantized)
    assert writers == {"rms_norm_q8": 1, "add_rms_norm_q8": 3, "attention_decode": 2, "gemv_warp_glu_q4_k": 1}, writers
    glu = next(l for l in step if l.kernel.name.startswith("gemv_warp_glu_q4_k") and l.kernel.name.endswith("_Q8"))
    assert glu.grid({"tokens": 1}) == (glu.scalars({"tokens": 1})["n"] // 32, 1) and "_W8_U1_F4_" in glu.kernel.name  # 8 warps, four features each
    assert [l.kernel.name.split("_BLOCK")[0] for l in step if "rms_norm_BLOCK" in l.kernel.name] == ["add_rms_norm"]
    # launch shapes measured on an H200: q/k/v capped for three workgroups an SM, the other staged products for two
    qkv = [l for l in step if l.label == "3 matmuls"]
    assert qkv and all(l.kernel.name.endswith("_xs_G3") and l.kernel.min_groups == 3 for l in qkv), [l.kernel.name for l in qkv]
    single = [l for l in step if l.kernel.name.startswith("gemv_warp_q4_k") and "_xs" in l.kernel.name]
    assert single and all(l.kernel.min_groups == 2 for l in single), [l.kernel.name for l in single]
    long = [l.kernel.name for l in plan.launches if runs(l, 1, 4096)]
    assert "quantize_q8x2_K256" in long and not any(nm.startswith("attention") and nm.endswith("_Q8") for nm in long), long
    many = [l.kernel.name for l in plan.launches if runs(l, 5)]
    # more rows: the Q4_K products on the integer tensor cores, each x quantized by the launch that
    # computes it (the norms, the decode attention; down's by the gated product, ``glu_q8``); the
    # final norm (the head is Q6_K) plain
    assert "glu_q8_N512" in many and "gemm_imma_q4_k_xs_K512_2x1_W4_S2_pipe" in many and not any(nm.startswith(("quantize_q8x2", "gemv_")) for nm in many)
    # q, k and v one launch, gate and up one (unsplit: their features fill the GPU), o and down each their own
    assert many.count("gemm_imma_q4_k_xs_K256_2x1_W4_pipe_P256_128_128") == many.count("gemm_imma_q4_k_xs_K256_2x1_W4_pipe_P512_512") == 2
    assert sum(nm.startswith("gemm_imma") for nm in many) == 8 and "sum_parts_2" in many
    assert {"rms_norm_q8_K256", "add_rms_norm_q8_K256"} <= set(many) and any(nm.startswith("attention_decode") and nm.endswith("_Q8") for nm in many)
    assert any(nm.startswith("add_rms_norm_BLOCK") for nm in many)
    assert not any(l.kernel.name.startswith("gemv_warp_q4_k") and "_xs" not in l.kernel.name and "MR1" in l.kernel.name for l in step)


def test_reads_before_the_wait_for_the_launch_before_name_only_memory_no_launch_writes():
    """Under programmatic launches a kernel runs up to its ``AwaitPrior`` while the launch before is
    still running: the decode attention reads only the step's inputs there, and the planner refuses
    a plan whose kernel reads (or writes) there memory another launch of the step writes."""
    import dataclasses

    from poot.graph import dtypes as dt
    from poot.kernel import ir as K
    from poot.kernel.verify import before_wait
    from poot.plan.lower import _check_waits

    mma = Limits(1024, 48 * 1024, subgroup=32, matrix=frozenset({"mma.sync.bf16"}))
    plan = nvidia_plan(attention_block_graph(head_dim=64), gpu=True, limits=mma)  # checked as it is planned
    decode = next(l for l in plan.launches if l.kernel.name.startswith("attention_decode"))
    assert before_wait(decode.kernel) == ({"seq_ids", "positions", "ctx_lens", "block_tables"}, set())
    # the same kernel made to read q (RoPE's output) before its wait: refused by name
    body = decode.kernel.body
    at = next(i for i, st in enumerate(body) if isinstance(st, K.AwaitPrior))
    early_q = K.Let("early", K.Load("q", K.Const(0, dt.i32), dt.f32))
    bad = dataclasses.replace(decode.kernel, body=(*body[:at], early_q, *body[at:]))
    assert "q" in before_wait(bad)[0]
    decode.kernel = bad
    with pytest.raises(Refusal, match="touches q before its wait"):
        _check_waits(plan)
    # writing before the wait is refused whatever the buffer
    decode.kernel = dataclasses.replace(bad, body=(*body[:at], K.Store("out", K.Const(0, dt.i32), K.Const(0.0, dt.f32)), *body[at:]))
    with pytest.raises(Refusal, match="touches out before"):
        _check_waits(plan)


def test_the_norm_between_two_one_row_q4_k_products_is_folded_into_both(tmp_path, monkeypatch):
    """``norm_fold`` (``FOLD_NORMS``), Hopper, one row: an RMSNorm whose input is a one-row Q4_K
    product plus the residual and whose output only one-row Q4_K products read has no launch. The product before it adds the residual into the norm's sum, writes its input quantized
    with the norm's weights applied and each workgroup's sum of squares (32 warps, a block of 32
    features a workgroup); the products after it read those partial sums and the norm's epsilon.
    More rows, and a GPU without the staged GEMVs, keep the norm; so does the plan with the pass off."""
    from poot.testing.paged import wide_q4_k_llama
    from poot_ptx.norm_fold import FOLD_WARPS

    g, _ = wide_q4_k_llama(tmp_path, 1)
    hopper = Limits(1024, 48 * 1024, frozenset({"f32", "f16", "bf16", "i8", "i32"}), 32, frozenset({"mma.sync.bf16", "wgmma"}), 1 << 40, "high", 227 * 1024)
    folds = lambda ls: [l.label for l in ls if l.label.endswith("+add_rms_norm") or l.label.endswith("+rms")]  # noqa: E731
    plan = nvidia_plan(g, device="cuda:0", gpu=True, limits=hopper)  # planned by default
    with monkeypatch.context() as m:
        m.setattr(nvidia_schedules, "FOLD_NORMS", False)
        off = nvidia_plan(g, device="cuda:0", gpu=True, limits=hopper)
    assert folds(plan.launches) and not folds(off.launches)
    env = {"tokens": 1, "batch": 1, "max_blocks": 4, "rows": 1, "blocks": 16}
    step = [l for l in plan.launches if l.when is None or l.when(env)]
    assert [l.label for l in step if "rms_norm" in l.label] == [
        "rms_norm+quantize_x",
        "matmul+add_rms_norm",
        "matmul+add_rms_norm",
        "matmul+add_rms_norm",
        "add_rms_norm",
    ]  # o, down, o; then the final norm
    folded = [l for l in step if l.label == "matmul+add_rms_norm"]
    for prod in folded:
        assert prod.kernel.name.endswith("_norm") and prod.kernel.threads == 32 * FOLD_WARPS and prod.grid(env) == (256 // 32, 1)
        users = [l for l in step if l.buffers.get("ss") == prod.buffers["ss"] and l is not prod]
        assert users and all(l.label.endswith("+rms") and l.kernel.name.endswith("_rms8") and l.buffers["xq_in"] == prod.buffers["yq"] for l in users)
        assert all(l.scalars(env)["eps"] == pytest.approx(1e-5) for l in users)
        later = step[step.index(prod) + 1 :]  # what the product writes for the next residual add is read after it
        assert any(l.buffers.get("res") == prod.buffers["y"] or l.buffers.get("a") == prod.buffers["y"] for l in later)
    assert not [l for l in step if "+rms" in l.label and l.buffers["ss"] not in {p.buffers["ss"] for p in folded}]
    two = [l for l in plan.launches if l.when is None or l.when({**env, "tokens": 2, "batch": 2, "rows": 2})]
    assert not folds(two)
    assert sum(l.label == "add_rms_norm" for l in two) == 4
    ampere = Limits(1024, 48 * 1024, frozenset({"f32", "f16", "bf16", "i8", "i32"}), 32, frozenset({"mma.sync.bf16"}), 1 << 40, "high")
    assert not folds(nvidia_plan(g, device="cuda:0", gpu=True, limits=ampere).launches)
