"""@kernel kernels compiled for spirv:vulkan1.3, checked by spirv-val and run on Vulkan device 0
(lavapipe in CI) against numpy, with fresh random inputs and outputs poisoned with NaN."""

import subprocess

import numpy as np
import pytest

import poot.codegen as codegen
from poot.codegen import CompileError
from poot.codegen import spirv as S
from poot.errors import DeviceUnavailable, Refusal
from poot.kernel import Const, In, Out, f16, f32, i32, kernel
from poot.testing.kernels import poisoned

TARGET = codegen.target("spirv:vulkan1.3")


# -- kernels ----------------------------------------------------------------------------------------


@kernel(workgroup=(64, 1, 1))
def scale_add(x: In[f32], y: In[f32], out: Out[f32], n: i32, alpha: f32):
    i = group_id(0) * 64 + thread_id(0)
    if i < n:
        out[i] = alpha * x[i] + y[i]


@kernel(workgroup=("BLOCK", 1, 1))
def rmsnorm(x: In[f32], w: In[f32], out: Out[f32], cols: i32, eps: f32, BLOCK: Const = 128):
    row = group_id(0)
    t = thread_id(0)
    acc = shared(f32, BLOCK)
    s = 0.0
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c]
        s += v * v
    acc[t] = s
    barrier()
    for k in static_range(10):  # tree: BLOCK/2, BLOCK/4 ... 1 live threads
        if (BLOCK >> (k + 1)) >= 1:
            if t < (BLOCK >> (k + 1)):
                acc[t] = acc[t] + acc[t + (BLOCK >> (k + 1))]
            barrier()
    r = rsqrt(acc[0] / f32(cols) + eps)
    for c in range(t, cols, BLOCK):
        out[row * cols + c] = x[row * cols + c] * r * w[c]


@kernel(workgroup=("BLOCK", 1, 1))
def softmax_rows(x: In[f32], y: Out[f32], cols: i32, BLOCK: Const = 64):
    row = group_id(0)
    t = thread_id(0)
    red = shared(f32, BLOCK)
    m = -3.0e38
    for c in range(t, cols, BLOCK):
        m = max(m, x[row * cols + c])
    red[t] = m
    barrier()
    for k in static_range(10):
        if (BLOCK >> (k + 1)) >= 1:
            if t < (BLOCK >> (k + 1)):
                red[t] = max(red[t], red[t + (BLOCK >> (k + 1))])
            barrier()
    mx = red[0]
    barrier()  # every thread has read the maximum before red is reused
    s = 0.0
    for c in range(t, cols, BLOCK):
        s += exp(x[row * cols + c] - mx)
    red[t] = s
    barrier()
    for k in static_range(10):
        if (BLOCK >> (k + 1)) >= 1:
            if t < (BLOCK >> (k + 1)):
                red[t] = red[t] + red[t + (BLOCK >> (k + 1))]
            barrier()
    inv = 1.0 / red[0]
    for c in range(t, cols, BLOCK):
        y[row * cols + c] = exp(x[row * cols + c] - mx) * inv


@kernel(workgroup=(8, 4, 1))
def grid_ids(out: Out[i32], count: Out[i32], width: i32):
    gx = group_id(0) * 8 + thread_id(0)
    gy = group_id(1) * 4 + thread_id(1)
    out[gy * width + gx] = gx * 1000 + gy + num_groups(0) * 1000000
    atomic_add(count, 0, 1)


@kernel(workgroup=(64, 1, 1))
def subgroup_sum(x: In[f32], out: Out[f32]):
    i = group_id(0) * 64 + thread_id(0)
    out[i] = subgroup_add(x[i])


@kernel(workgroup=(64, 1, 1))
def subgroup_ops(x: In[f32], n: In[i32], out: Out[f32], iout: Out[i32], MASK: Const = 1):
    """Every subgroup operation codegen lowers, one output column each."""
    i = group_id(0) * 64 + thread_id(0)
    v = x[i]
    out[i * 5] = subgroup_add(v)
    out[i * 5 + 1] = subgroup_max(v)
    out[i * 5 + 2] = subgroup_min(v)
    out[i * 5 + 3] = shuffle_xor(v, MASK)
    out[i * 5 + 4] = shuffle(v, (lane_id() + 1) % subgroup_size())
    iout[i * 3] = subgroup_add(n[i])
    iout[i * 3 + 1] = subgroup_max(n[i])
    iout[i * 3 + 2] = lane_id()


# -- fixtures and helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device():
    try:
        from poot_vulkan.runtime import VulkanDevice

        dev = VulkanDevice(0)
    except DeviceUnavailable as e:
        pytest.skip(f"no Vulkan device to run on: {e}")
    yield dev
    dev.close()


def compile_spirv(template, **consts):
    k = template.instantiate(**consts)
    # the post-pass is what is under test: it ran spirv-val --target-env vulkan1.3 on the module (the
    # kernel cache's key holds codegen's source, so a cached module was validated by this code too)
    art = codegen.compile_kernel(k, TARGET)
    assert art.kind == "spirv" and art.data[:4] == b"\x03\x02\x23\x07"
    return k, art.data


def run(device, k, spv, grid, buffers, scalars):
    from poot_vulkan.runtime import VulkanKernel

    with VulkanKernel(k, spv, device) as vk:
        vk.run(grid, buffers, scalars)


def disassemble(spv: bytes, tmp_path) -> str:
    path = tmp_path / "k.spv"
    path.write_bytes(spv)
    return subprocess.run(["spirv-dis", "--raw-id", str(path)], capture_output=True, text=True, check=True).stdout


# -- kernels on the device --------------------------------------------------------------------------


def test_elementwise_bounds_check(device, rng):
    k, spv = compile_spirv(scale_add)
    from poot_vulkan.runtime import VulkanKernel

    with VulkanKernel(k, spv, device) as vk:
        for n in (1000, 77, 3001):  # not multiples of the 64-thread workgroup; grid and buffers change
            x = rng.standard_normal(n).astype(np.float32)
            y = rng.standard_normal(n).astype(np.float32)
            alpha = float(rng.uniform(-2, 2))
            out = poisoned(n + 64)  # room past n: the bounds check must keep the last group inside
            vk.run(((n + 63) // 64,), {"x": x, "y": y, "out": out}, {"n": n, "alpha": alpha})
            assert not np.isnan(out[:n]).any(), "elements below n were not written"
            assert np.isnan(out[n:]).all(), "threads past n wrote"
            np.testing.assert_allclose(out[:n], np.float32(alpha) * x + y, rtol=1e-5, atol=1e-6)


def test_rmsnorm_shared_memory_reduction(device, rng):
    """A tree reduction through shared memory with barriers: wrong unless the barriers order
    workgroup memory (the post-pass's 0x148 semantics)."""
    k, spv = compile_spirv(rmsnorm, BLOCK=128)
    rows, cols = 37, 1000  # cols is not a multiple of BLOCK
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    eps = 1e-5
    out = poisoned((rows, cols))
    run(device, k, spv, (rows,), {"x": x, "w": w, "out": out}, {"cols": cols, "eps": eps})
    assert not np.isnan(out).any()
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps) * w
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_softmax_rows(device, rng):
    k, spv = compile_spirv(softmax_rows, BLOCK=64)
    rows, cols = 23, 513
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    y = poisoned((rows, cols))
    run(device, k, spv, (rows,), {"x": x, "y": y}, {"cols": cols})
    assert not np.isnan(y).any()
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_grid_builtins_and_i32_atomics(device):
    k, spv = compile_spirv(grid_ids)
    groups = (3, 2, 1)
    width, height = 8 * groups[0], 4 * groups[1]
    out = poisoned(width * height, np.int32)
    count = np.zeros(1, np.int32)
    run(device, k, spv, groups, {"out": out, "count": count}, {"width": width})
    gy, gx = np.mgrid[0:height, 0:width]
    np.testing.assert_array_equal(out.reshape(height, width), gx * 1000 + gy + groups[0] * 1000000)
    assert count[0] == width * height


# -- the module and the post-pass -------------------------------------------------------------------


def test_post_pass_rewrites_barrier_semantics(tmp_path):
    _, spv = compile_spirv(rmsnorm, BLOCK=128)
    text = disassemble(spv, tmp_path)
    consts = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[2] == "OpConstant":
            consts[parts[0]] = int(parts[4]) if parts[4].lstrip("-").isdigit() else None
    barriers = [line.split() for line in text.splitlines() if "OpControlBarrier" in line]
    assert len(barriers) == 8  # one after the partial sums, seven in the tree (64, 32 ... 1 threads)
    for _, _, _, semantics in barriers:
        assert consts[semantics] == 0x148 == 328
    assert "OpMemoryBarrier" not in text  # the fences around barriers: covered by the barrier's semantics
    caps = {line.split()[1] for line in text.splitlines() if line.strip().startswith("OpCapability")}
    assert caps == {"Shader"}  # no Int8 (binding names), Int64 (GEP indices) or Linkage


def test_subgroup_operations_are_refused():
    with pytest.raises(Refusal, match="subgroup"):
        codegen.compile_kernel(subgroup_sum.instantiate(), TARGET, use_cache=False)


def test_subgroup_operations_at_the_devices_width(device, rng):
    """Reductions (f32 and i32 add, max, min), shuffles by lane and by xor, and lane ids, compiled for
    the device's subgroup width (8 on lavapipe) and run in full subgroups of consecutive threads."""
    if device.subgroup < 2:
        pytest.skip(f"{device.name} runs no subgroup reductions and shuffles in compute shaders")
    sg = device.subgroup
    k = subgroup_ops.instantiate(MASK=sg // 2)
    art = codegen.compile_kernel(k, codegen.spirv_target(sg))  # (validated by its post-pass)
    groups = 3
    x = rng.standard_normal(64 * groups).astype(np.float32)
    n = rng.integers(-1000, 1000, 64 * groups).astype(np.int32)
    out, iout = poisoned((64 * groups, 5)), poisoned((64 * groups, 3), np.int32)
    run(device, k, art.data, (groups, 1, 1), {"x": x, "n": n, "out": out, "iout": iout}, {})
    xs, ns = x.reshape(-1, sg).astype(np.float64), n.reshape(-1, sg)
    np.testing.assert_allclose(out[:, 0], np.repeat(xs.sum(axis=1), sg), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[:, 1], np.repeat(x.reshape(-1, sg).max(axis=1), sg))
    np.testing.assert_array_equal(out[:, 2], np.repeat(x.reshape(-1, sg).min(axis=1), sg))
    lanes = np.tile(np.arange(sg), 64 * groups // sg)
    base = np.arange(64 * groups) - lanes
    np.testing.assert_array_equal(out[:, 3], x[base + (lanes ^ (sg // 2))])
    np.testing.assert_array_equal(out[:, 4], x[base + (lanes + 1) % sg])
    np.testing.assert_array_equal(iout[:, 0], np.repeat(ns.sum(axis=1), sg))
    np.testing.assert_array_equal(iout[:, 1], np.repeat(ns.max(axis=1), sg))
    np.testing.assert_array_equal(iout[:, 2], lanes)


def test_warp_schedules_compile_for_32_lane_subgroups(tmp_path):
    """The decode GEMVs (bf16 and Q4_K, single, gated, several products; any packed type; Q6_K) for a
    Vulkan device with 32-lane subgroups (NVIDIA's): valid modules whose sums are subgroup reductions."""
    from poot.kernel.library.linear_gpu import gemv_warp, gemv_warp_packed, gemv_warp_q6_k

    for k in (
        gemv_warp("bf16", 4096, 1),
        gemv_warp("bf16", 4096, 4, glu=True),
        gemv_warp("bf16", 4096, 1, parts=(64, 16, 16)),
        gemv_warp("q4_k", 4096, 1),
        gemv_warp_packed("q6_k", 4096, 1),
        gemv_warp_packed("q4_1", 576, 4),
        gemv_warp_q6_k(2048, 4),
    ):
        art = codegen.compile_kernel(k, codegen.spirv_target(32))  # (validated by its post-pass)
        text = disassemble(art.data, tmp_path)
        assert "OpGroupNonUniformFAdd" in text and "Reduce" in text, k.name
        if "bf16" in k.name:  # weights (and x) read 16 bytes a load, from arrays of 4-vectors
            assert sum("OpLoad" in line and "Aligned 16" in line for line in text.splitlines()) >= 2, k.name
    with pytest.raises(Refusal, match="subgroup"):
        codegen.spirv_target(24)


def test_module_interface():
    k = softmax_rows.instantiate(BLOCK=64)
    assert S.bindings(k) == [(0, "x", k.params[0].dtype, False), (1, "y", k.params[1].dtype, True), (2, S.SCALARS, k.params[2].dtype, False)]
    words = S.scalar_words(rmsnorm.instantiate(), {"cols": 7, "eps": 0.5})
    assert words.tolist() == [7, np.float32(0.5).view(np.uint32)]


def _assemble(text: str, tmp_path) -> bytes:
    src, out = tmp_path / "m.spvasm", tmp_path / "m.spv"
    src.write_text(text)
    subprocess.run(["spirv-as", "--target-env", "vulkan1.3", str(src), "-o", str(out)], check=True, capture_output=True)
    return out.read_bytes()


_SHADER = """
OpCapability Shader
{extra_caps}
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main"
OpExecutionMode %main LocalSize 1 1 1
{decorations}
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%uint_2 = OpConstant %uint 2
%uint_4 = OpConstant %uint 4
{declarations}
%main = OpFunction %void None %fn
%entry = OpLabel
{body}
OpReturn
OpFunctionEnd
"""


def test_post_pass_reports_linkage_and_invalid_modules(tmp_path):
    linked = _assemble(
        _SHADER.format(extra_caps="OpCapability Linkage", decorations='OpDecorate %ext LinkageAttributes "helper" Import', declarations="", body="")
        + "%ext = OpFunction %void None %fn\nOpFunctionEnd\n",
        tmp_path,
    )
    with pytest.raises(CompileError, match="Linkage.*helper"):
        S.post_pass(linked, "linked_kernel")
    # a memory barrier without storage-class semantics: spirv-val's Vulkan rules reject it
    bad = _assemble(_SHADER.format(extra_caps="", decorations="", declarations="", body="OpMemoryBarrier %uint_2 %uint_4"), tmp_path)
    with pytest.raises(CompileError, match=r"kernel bad_kernel: spirv-val .*MemoryBarrier"):
        S.validate(bad, "bad_kernel")


def test_for_wgpu_drops_aligned_operands(tmp_path):
    _, spv = compile_spirv(scale_add)
    assert "Aligned" in disassemble(spv, tmp_path)
    naga = S.for_wgpu(spv)
    assert "Aligned" not in disassemble(naga, tmp_path)
    S.validate(naga, "scale_add")


def test_kernel_library_compiles():
    """Every catalogue kernel is valid Vulkan SPIR-V (packed weights bound as 32-bit words): each
    compiles, its post-pass running spirv-val on it."""
    from poot.kernel.library import catalogue

    for k in catalogue():
        assert codegen.compile_kernel(k, TARGET).data[:4] == b"\x03\x02\x23\x07", k.name


def test_16_bit_values_are_stored_as_whole_words_or_refused():
    """A buffer of halves is written two values at a time (vstore at an even index: one 32-bit word,
    as the f16 KV pools' writers do, in the catalogue above); a lone 16-bit store is refused with the
    buffer named, as it would have to modify half a word that another invocation may be writing."""

    def lone(x: In[f32], y: Out[f16]):
        y[thread_id(0)] = x[thread_id(0)]

    with pytest.raises(Refusal, match="'y' holds 16-bit values: write them two at a time"):
        codegen.compile_kernel(kernel(lone).instantiate(), TARGET, use_cache=False)


def test_for_wgpu_module_runs_through_naga(rng):
    """The same module, Aligned operands dropped, loads in wgpu (naga translates it) and computes the
    same RMSNorm: the binding layout (one storage buffer per binding, scalars last) suits both."""
    wgpu = pytest.importorskip("wgpu")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        dev = adapter.request_device_sync()
    except Exception as e:  # noqa: BLE001 - any failure to get an adapter means: nothing to run on
        pytest.skip(f"no wgpu adapter: {e}")
    k, spv = compile_spirv(rmsnorm, BLOCK=128)
    rows, cols, eps = 9, 700, 1e-5
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=S.for_wgpu(spv)), "entry_point": S.ENTRY})
    usage = wgpu.BufferUsage
    out = dev.create_buffer(size=x.nbytes, usage=usage.STORAGE | usage.COPY_SRC)
    bufs = [
        dev.create_buffer_with_data(data=x, usage=usage.STORAGE),
        dev.create_buffer_with_data(data=w, usage=usage.STORAGE),
        out,
        dev.create_buffer_with_data(data=S.scalar_words(k, {"cols": cols, "eps": eps}), usage=usage.STORAGE),
    ]
    group = dev.create_bind_group(
        layout=pipe.get_bind_group_layout(0), entries=[{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bufs)]
    )
    enc = dev.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipe)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(rows, 1, 1)
    cpass.end()
    dev.queue.submit([enc.finish()])
    y = np.frombuffer(dev.queue.read_buffer(out), np.float32).reshape(rows, cols)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps) * w, rtol=1e-5, atol=1e-6)


def test_post_pass_renumbers_labels_that_reuse_module_ids(device, rng):
    """LLVM 22 now and then numbers a function's block labels from 1 again, colliding with types and
    constants (spirv-val: 'Id 1 is defined more than once'). Make that happen to a good module, then
    check the post-pass gives back a valid module that still computes softmax."""
    k, spv = compile_spirv(softmax_rows, BLOCK=64)
    m = S._Spv(spv, k.name)
    labels = [ops[0] for op, ops in m.insts if op == 248]  # OpLabel
    clash = dict(zip(labels, sorted(S._module_ids(m))))  # each label takes the id of a type or constant
    where = {5: (0,), 248: (0,), 249: (0,), 250: (1, 2), 246: (0, 1), 247: (0,)}  # name, label, branches, loop/selection merge
    for op, ops in m.insts:
        for n in range(3, len(ops), 2) if op == 245 else where.get(op, ()):  # OpPhi: (value, parent) pairs
            ops[n] = clash.get(ops[n], ops[n])
    broken = m.to_bytes()
    with pytest.raises(CompileError, match="defined more than once"):
        S.validate(broken, k.name)
    fixed = S.post_pass(broken, k.name)
    rows, cols = 5, 300
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = poisoned((rows, cols))
    run(device, k, fixed, (rows,), {"x": x, "y": y}, {"cols": cols})
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_post_pass_refuses_labels_that_reuse_each_other():
    """Two blocks with one id cannot be told apart by their branches: an error naming the cause, not
    a guessed repair."""
    k, spv = compile_spirv(softmax_rows, BLOCK=64)
    m = S._Spv(spv, k.name)
    first, second = [ops for op, ops in m.insts if op == 248][:2]  # OpLabel
    second[0] = first[0]
    with pytest.raises(CompileError, match=f"kernel {k.name}: .*same label id"):
        S.post_pass(m.to_bytes(), k.name)


# -- a sample of the synthesized kernels on the device, against the oracle ---------------------------


def test_synthesized_kernels_on_the_device_match_the_oracle(device, rng):
    from poot.eval import evaluate
    from poot.graph import GraphBuilder
    from poot.graph.compose import rms_norm as g_rms_norm
    from poot.graph.compose import softmax as g_softmax
    from poot.kernel.library import gather, linear, norms

    rows, cols = 5, 301
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    # RMSNorm: a shared-memory tree reduction across barriers
    k, spv = compile_spirv(norms.rms_norm, BLOCK=64, UNIT_OFFSET=True)
    y = poisoned((rows, cols))
    run(device, k, spv, (rows,), {"x": x, "w": w, "y": y}, {"cols": cols, "eps": 1e-6})
    b = GraphBuilder()
    want = evaluate(b.build({"y": g_rms_norm(b, b.input("x", "f32", [rows, cols]), b.weight("w", "f32", [cols]), 1e-6, True)}), {"x": x}, {"w": w})["y"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    # softmax: max and sum reductions
    k, spv = compile_spirv(norms.softmax, BLOCK=128)
    y = poisoned((rows, cols))
    run(device, k, spv, (rows,), {"x": x, "y": y}, {"cols": cols, "scale": 1.0})
    b = GraphBuilder()
    want = evaluate(b.build({"y": g_softmax(b, b.input("x", "f32", [rows, cols]))}), {"x": x})["y"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-8)
    # tiled GEMM through shared memory, sizes off the tile grid
    m, n, kk = 19, 23, 37
    a, wt = rng.standard_normal((m, kk)).astype(np.float32), rng.standard_normal((n, kk)).astype(np.float32)
    k, spv = compile_spirv(linear.gemm_f32)
    c = poisoned((m, n))
    run(device, k, spv, (2, 2), {"a": a, "w": wt, "c": c}, {"m": m, "n": n, "k": kk})
    np.testing.assert_allclose(c, a.astype(np.float64) @ wt.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    # embedding gather with i32 ids
    ids = rng.integers(0, rows, 7).astype(np.int32)
    k, spv = compile_spirv(gather.gather_f32, BLOCK=64)
    out = poisoned((7, cols))
    run(device, k, spv, (7,), {"table": x, "ids": ids, "out": out}, {"cols": cols, "rows": rows})
    np.testing.assert_array_equal(out, x[ids])


@pytest.mark.parametrize("qtype", ["q8_0", "q4_1", "q4_k", "q6_k", "iq4_nl", "mxfp4"])
def test_packed_gemv_on_the_device(device, rng, qtype):
    """Packed weights are bound as 32-bit words; the dequantizing GEMV matches the oracle."""
    from poot.kernel.library import linear
    from poot.quant import quantization
    from poot.quant.bodies import BODIES, LUTS

    bs, bb, _ = BODIES[qtype]
    m, n, k = 2, 13, bs * 2
    q = quantization(qtype)
    raw = q.quantize(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    kern, spv = compile_spirv(linear.gemv_blocks, QTYPE=qtype, BS=bs, BB=bb, ROWS=4, BLOCK=32)
    y = poisoned((m, n))
    run(
        device,
        kern,
        spv,
        (-(-n // 4), m),
        {"x": x, "w": raw, "lut": LUTS.get(qtype, np.zeros(1, np.float32)), "y": y},
        {"n": n, "k": k, "row_bytes": raw.shape[1]},
    )
    np.testing.assert_allclose(y, x.astype(np.float64) @ q.dequantize(raw).astype(np.float64).T, rtol=1e-4, atol=1e-4)


@kernel(workgroup=(128, 1, 1))
def narrowed_index_math(out: Out[i32], cols: i32):
    for c in range(thread_id(0), cols, 128):
        j = c % 256  # LLVM knows these ranges and does some of this in 16-bit integers
        out[c * 4 + 0] = j // 32
        out[c * 4 + 1] = (j // 64) * 2
        out[c * 4 + 2] = j % 32 - 16
        out[c * 4 + 3] = (j - (j // 64) * 64) // 32


def _run_narrowed(device, template, tmp_path, monkeypatch, llvm_narrow: str, cols: int = 300) -> np.ndarray:
    """Compile ``template`` (whose LLVM output must match ``llvm_narrow``: narrow integers), check
    that its SPIR-V has no narrow integer type left, run it on ``device`` and return ``out``."""
    import re

    from poot_vulkan.runtime import VulkanKernel

    monkeypatch.setenv("POOT_DUMP", str(tmp_path))
    k, spv = compile_spirv(template)
    assert re.search(llvm_narrow, (tmp_path / f"{k.name}.spirv.opt.ll").read_text()), "this kernel no longer exercises narrow integers: pick another"
    assert not {ops[1] for op, ops in S._Spv(spv, k.name).insts if op == 21} & {8, 16}  # OpTypeInt
    out = np.full(cols * 4, -999, np.int32)
    VulkanKernel(k, spv, device).run((1,), {"out": out}, {"cols": cols})
    return out


def test_narrow_integer_arithmetic_is_redone_in_32_bits(device, tmp_path, monkeypatch):
    """LLVM narrows index math of known range to 8- and 16-bit integers, which need shaderInt8 and
    shaderInt16 on Vulkan and which naga takes not at all: the post-pass redoes it in 32 bits (values
    kept zero-extended, sign-extended where an instruction is signed). LLVM's output here has narrow
    arithmetic; the module has no narrow type left, is valid, and computes what numpy does."""
    out = _run_narrowed(
        device, narrowed_index_math, tmp_path, monkeypatch, r"= (add|sub|mul|sdiv|srem|udiv|urem|and|or|xor|shl|lshr|ashr)( nuw| nsw| exact)* i(8|16) "
    )
    c = np.arange(300) % 256
    want = np.stack([c // 32, (c // 64) * 2, c % 32 - 16, (c - (c // 64) * 64) // 32], 1).reshape(-1)
    np.testing.assert_array_equal(out, want)


@kernel(workgroup=(128, 1, 1))
def narrowed_min_max(out: Out[i32], cols: i32):
    for c in range(thread_id(0), cols, 128):
        lane = c % 32  # LLVM takes these minima and maxima in 8 bits (llvm.smin.i8 / smax.i8)
        out[c * 4 + 0] = min(lane // 4, 5)
        out[c * 4 + 1] = max(lane - 16, -3)
        out[c * 4 + 2] = min(lane - 16, 2)
        out[c * 4 + 3] = max(lane // 8, 2)


def test_narrow_minima_and_maxima_are_redone_in_32_bits(device, tmp_path, monkeypatch):
    """GLSL's SMin/SMax (and the other integer extended instructions) on narrowed integers are
    widened too (operands sign-extended for the signed ones), negative values among them: before,
    one such instruction left the whole module narrow (shaderInt8 on Vulkan; naga refused it)."""
    out = _run_narrowed(device, narrowed_min_max, tmp_path, monkeypatch, r"@llvm\.s(min|max)\.i(8|16)\(")
    lane = np.arange(300) % 32
    want = np.stack([np.minimum(lane // 4, 5), np.maximum(lane - 16, -3), np.minimum(lane - 16, 2), np.maximum(lane // 8, 2)], 1).reshape(-1)
    np.testing.assert_array_equal(out, want)
