"""The @kernel front end: a user-written kernel (a fused activation with a shared-memory reduction)
compiles for every target and runs on the host against numpy; Python outside the subset is an error
naming the file and line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from poot.codegen import compile_kernel, target
from poot.kernel import Const, In, KernelError, KernelSyntaxError, Out, f16, f32, i32, inline, kernel
from poot.testing.kernels import poisoned, run_host
from poot_rocm.targets import find_lld


@kernel(workgroup=("BLOCK", 1, 1))
def silu_then_normalize(x: In[f32], y: Out[f32], cols: i32, BLOCK: Const = 64):
    """y = silu(x) / sum(|silu(x)|) per row: an activation fused with a shared-memory reduction."""
    row = group_id(0)
    t = thread_id(0)
    part = shared(f32, BLOCK)
    acc = 0.0
    for c in range(t, cols, BLOCK):
        v = x[row * cols + c]
        s = v / (1.0 + exp(-v))
        y[row * cols + c] = s
        acc += abs(s)
    part[t] = acc
    barrier()
    step = BLOCK // 2
    for _ in static_range(ilog2(BLOCK)):
        if t < step:
            part[t] += part[t + step]
        barrier()
        step = step // 2
    inv = 1.0 / part[0]
    for c in range(t, cols, BLOCK):
        y[row * cols + c] = y[row * cols + c] * inv


def test_user_kernel_runs_on_host_against_numpy(rng):
    rows, cols = 5, 203
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = poisoned((rows, cols))
    run_host(silu_then_normalize.instantiate(BLOCK=64), (rows,), {"x": x, "y": y}, {"cols": cols})
    s = x / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(y, s / np.abs(s).sum(1, keepdims=True), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", ["nvptx:sm_80", "nvptx:sm_90", "amdgcn:gfx942", "amdgcn:gfx1100", "spirv:vulkan1.3"])
def test_user_kernel_compiles_for_gpu_targets(name):
    if name.startswith("amdgcn") and find_lld() is None:
        pytest.skip("no ld.lld from LLVM 20+ to link AMDGPU code objects (pip install ziglang)")
    art = compile_kernel(silu_then_normalize.instantiate(BLOCK=128), target(name))
    assert art.data


@inline
def softsign(v: f32) -> f32:
    return v / (1.0 + abs(v))


@inline
def scaled(v, times):  # untyped: ``times`` stays a compile-time constant when one is passed
    out = v
    for _ in static_range(times):  # unrolled: needs ``times`` known at compile time
        out = out * 2.0
    if out > 100.0:
        out = 100.0
    return softsign(out) + 0.0 * v  # calls another inline function


@inline
def count_down(n: i32) -> i32:
    return count_down(n - 1)


def reads_a_kernel_name(v: f32) -> f32:  # not decorated here: the test does, and expects the error
    return v * cols  # noqa: F821


@inline
def bad_type(v: f32) -> i32:
    return v + 1.0


@kernel(workgroup=(32, 1, 1))
def inline_calls(x: In[f32], y: Out[f32], cols: i32, TIMES: Const = 3):
    row = group_id(0)
    for c in range(thread_id(0), cols, 32):
        v = x[row * cols + c]
        if softsign(v) > 0.25:  # in a condition: its statements come before the if
            y[row * cols + c] = scaled(v, TIMES)
        else:
            y[row * cols + c] = softsign(softsign(v)) - scaled(-v, 1)


def test_inline_functions_expand_in_place_and_run_on_host(rng):
    rows, cols = 3, 77
    x = (rng.standard_normal((rows, cols)) * 30).astype(np.float32)
    y = poisoned((rows, cols))
    k = inline_calls.instantiate(TIMES=3)
    run_host(k, (rows,), {"x": x, "y": y}, {"cols": cols})
    ss = lambda v: v / (1 + np.abs(v))  # noqa: E731
    sc = lambda v, t: ss(np.minimum(v * 2.0**t, 100.0))  # noqa: E731
    want = np.where(ss(x) > 0.25, sc(x, 3), ss(ss(x)) - sc(-x, 1))
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
    art = compile_kernel(k, target("nvptx:sm_80"))
    assert art.data


def test_inline_function_errors_name_the_function_and_its_line():
    def recursive(y: Out[i32]):
        y[0] = count_down(3)

    with pytest.raises(KernelSyntaxError, match=r"count_down calls itself \(count_down -> count_down\)"):
        kernel(recursive).instantiate()
    with pytest.raises(
        KernelSyntaxError,
        match=rf"{__file__}:{_line_of(reads_a_kernel_name, 'v * cols')}: inline function "
        r"reads_a_kernel_name uses 'cols', which is not its parameter",
    ):
        inline(reads_a_kernel_name)

    def wrong_count(x: In[f32], y: Out[f32]):
        y[0] = softsign(x[0], 2.0)

    with pytest.raises(KernelSyntaxError, match=r"softsign\(\) takes 1 arguments, got 2"):
        kernel(wrong_count).instantiate()

    def wrong_type(x: In[i32], y: Out[f32]):
        y[0] = softsign(x[0])

    with pytest.raises(KernelSyntaxError, match=r"parameter 'v' is f32, got i32 \(cast it"):
        kernel(wrong_type).instantiate()

    def returns_wrong(x: In[f32], y: Out[i32]):
        y[0] = bad_type(x[0])

    with pytest.raises(KernelSyntaxError, match=rf"{_line_of(bad_type.fn, 'return v + 1.0')}: bad_type returns f32, annotated i32"):
        kernel(returns_wrong).instantiate()

    def no_return(v: f32) -> f32:
        w = v * 2.0  # noqa: F841

    with pytest.raises(KernelSyntaxError, match="inline function no_return must end with 'return value'"):
        inline(no_return)
    with pytest.raises(TypeError, match="called from kernels only"):
        softsign(1.0)


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_python_outside_the_subset_names_file_and_line():
    def uses_a_list(x: In[f32], y: Out[f32]):
        vals = [1.0, 2.0]  # not in the kernel subset  # noqa: F841
        y[0] = x[0]

    with pytest.raises(KernelSyntaxError) as e:
        kernel(uses_a_list).instantiate()
    assert f"{__file__}:{_line_of(uses_a_list, 'vals = [1.0')}" in str(e.value) and "List" in str(e.value)

    def calls_numpy(x: In[f32], y: Out[f32]):
        y[0] = np.sum(x[0])

    with pytest.raises(KernelSyntaxError, match=rf"{_line_of(calls_numpy, 'np.sum')}: only plain function calls"):
        kernel(calls_numpy).instantiate()

    def mixes_types(x: In[f32], y: Out[f32], n: i32):
        y[0] = x[0] + n

    with pytest.raises(KernelSyntaxError, match=r"operands differ: f32 add i32 \(cast one"):
        kernel(mixes_types).instantiate()

    def unknown_name(x: In[f32], y: Out[f32]):
        y[0] = x[0] * undefined_thing  # noqa: F821

    with pytest.raises(KernelSyntaxError, match="'undefined_thing' is not a parameter"):
        kernel(unknown_name).instantiate()

    def argmax_of_unequal_arrays(x: In[f32], y: Out[f32]):
        v = shared(f32, 64)
        ids = shared(f32, 64)  # ids must be i32
        reduce_argmax(v, ids)  # noqa: F821
        y[0] = v[0]

    with pytest.raises(KernelSyntaxError, match=rf"{_line_of(argmax_of_unequal_arrays, 'reduce_argmax(v')}: reduce_argmax\(values, ids\) needs"):
        kernel(argmax_of_unequal_arrays, workgroup=(64, 1, 1)).instantiate()


def test_verifier_refuses_divergent_barriers_and_readonly_stores():
    def divergent(x: In[f32], y: Out[f32]):
        if thread_id(0) < 3:
            barrier()
        y[0] = x[0]

    with pytest.raises(KernelError, match="barrier under control flow that differs between threads"):
        kernel(divergent).instantiate()

    def writes_input(x: In[f32]):
        x[0] = 1.0

    with pytest.raises(KernelError, match="'x' is read-only"):
        kernel(writes_input).instantiate()


@kernel(workgroup=(32, 1, 1))
def scale4(x: In[f32], y: Out[f32], n4: i32, alpha: f32):
    i = group_id(0) * 32 + thread_id(0)
    if i < n4:
        a, b, c, d = vload(x, i * 4)
        vstore(y, i * 4, a * alpha, b * alpha, c * alpha, d * alpha)


def test_vector_loads_and_stores(rng):
    n = 4 * 45
    x = rng.standard_normal(n).astype(np.float32)
    y = poisoned((n,))
    run_host(scale4.instantiate(), (2,), {"x": x, "y": y}, {"n4": n // 4, "alpha": 1.5})
    np.testing.assert_array_equal(y, x * np.float32(1.5))
    ptx = compile_kernel(scale4.instantiate(), target("nvptx:sm_90")).data.decode()
    import re

    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx) and re.search(r"st\.global\.v4\.(f32|b32)", ptx)  # 16-byte accesses


@kernel(workgroup=(64, 1, 1))
def histogram(x: In[i32], h: Out[i32], n: i32):
    i = group_id(0) * 64 + thread_id(0)
    if i < n:
        atomic_add(h, x[i], 1)


def test_atomics_on_host_threads(rng):
    x = rng.integers(0, 10, 1000).astype(np.int32)
    h = np.zeros(10, np.int32)
    run_host(histogram.instantiate(), (16,), {"x": x, "h": h}, {"n": 1000}, threads=2)
    np.testing.assert_array_equal(h, np.bincount(x, minlength=10))


@kernel(workgroup=(64, 1, 1))
def warp_sum(x: In[f32], y: Out[f32]):
    t = group_id(0) * 64 + thread_id(0)
    s = subgroup_add(x[t])
    if lane_id() == 0:
        y[t // subgroup_size()] = s


def test_subgroup_reduce_follows_the_target_width(rng):
    x = rng.standard_normal(128).astype(np.float32)
    y = poisoned((128,))
    run_host(warp_sum.instantiate(), (2,), {"x": x, "y": y})  # the host's subgroups are one lane wide
    np.testing.assert_array_equal(y, x)
    ptx = compile_kernel(warp_sum.instantiate(), target("nvptx:sm_90")).data.decode()
    assert ptx.count("shfl.sync.bfly") == 5  # log2(32) butterfly steps


@kernel(workgroup=(32, 1, 1))
def tile_mma(out: Out[f32]):
    a = shared(f16, 256)
    b = shared(f16, 256)
    c = shared(f32, 256)
    for i in range(thread_id(0), 256, 32):
        a[i] = f16(f32(i % 7))
        b[i] = f16(f32(i % 5))
        c[i] = 0.0
    barrier()
    mma_tile(a, b, c)
    barrier()
    for i in range(thread_id(0), 256, 32):
        out[i] = c[i]


def test_matrix_tile_lowers_to_tensor_cores_or_refuses():
    from poot.codegen import host_target
    from poot.errors import Refusal

    k = tile_mma.instantiate()
    ptx = compile_kernel(k, target("nvptx:sm_80")).data.decode()
    assert "mma.sync.aligned" in ptx or "wmma.mma.sync.aligned" in ptx
    for t in (host_target(), target("amdgcn:gfx942")):
        with pytest.raises(Refusal, match="no matrix multiply-accumulate"):
            compile_kernel(k, t)


def test_poot_kernel_is_the_decorator():
    import poot

    @poot.kernel(workgroup=(8, 1, 1))
    def double(x: In[f32], y: Out[f32], n: i32):
        i = thread_id(0)
        if i < n:
            y[i] = x[i] * 2.0

    k = double.instantiate()
    y = poisoned((5,))
    run_host(k, (1,), {"x": np.arange(5, dtype=np.float32), "y": y}, {"n": 5})
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
