"""Every synthesized kernel compiles for every GPU target with no GPU present: PTX accepted by ptxas
(resources reported, no spills in GEMV and attention), AMDGPU code objects linked with their amdhsa
metadata; the cache, the crash isolation and typed refusals."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from poot.codegen import CompileError, compile_kernel, target
from poot.errors import Refusal
from poot.graph import GraphBuilder
from poot.graph import dtypes as dt
from poot.kernel import ir as K
from poot.kernel.library import catalogue
from poot_ptx.assembler import find_ptxas, ptxas_usage
from poot_ptx.statements import Wgmma
from poot_rocm.targets import find_lld

KERNELS = catalogue()
IDS = [k.name for k in KERNELS]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas is not installed here (pip install nvidia-cuda-nvcc-cu12, or the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_ptx_accepted_by_ptxas(arch, tmp_path):
    report = []
    for k in KERNELS:
        art = compile_kernel(k, target(f"nvptx:{arch}"))
        assert art.kind == "ptx" and b".entry" in art.data
        regs, spills, out = ptxas_usage(art.data, arch)  # (refused PTX fails there, with ptxas's message)
        if k.name.startswith(("gemv", "attention")):
            assert not spills, f"{k.name} spills on {arch}: {out}"
        report.append(f"{k.name}: {regs} regs, {spills} bytes spilled")
    print("\n".join(report))


@pytest.mark.skipif(find_lld() is None, reason="no ld.lld from LLVM 20+ (pip install ziglang, or apt install lld-22)")
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx1100"])
def test_amdgpu_code_objects_link_with_metadata(arch, tmp_path):
    readelf = shutil.which("llvm-readelf") or shutil.which("readelf")
    for k in KERNELS:
        art = compile_kernel(k, target(f"amdgcn:{arch}"))
        assert art.data[:4] == b"\x7fELF"
        if readelf and "llvm" in readelf:
            obj = tmp_path / "k.hsaco"
            obj.write_bytes(art.data)
            notes = subprocess.run([readelf, "--notes", str(obj)], capture_output=True, text=True).stdout
            assert "amdhsa.kernels" in notes and f".name:           {k.name}" in notes, notes[:500]
            assert f"amdgcn-amd-amdhsa--{arch}" in notes


def test_second_compile_is_a_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    k = KERNELS[0]
    first = compile_kernel(k, target("nvptx:sm_90"))
    second = compile_kernel(k, target("nvptx:sm_90"))
    assert not first.cached and second.cached and first.data == second.data


def test_kernels_compiled_together_are_the_ones_compiled_alone(tmp_path, monkeypatch):
    # compile_kernels runs several workers at once: every artifact comes back in the kernels' order,
    # with the bytes a lone compile gives, and lands in the cache
    from poot.codegen import compile_kernels

    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "together"))
    ks, tgt = KERNELS[:6], target("nvptx:sm_90")
    together = compile_kernels(ks, tgt, jobs=3)
    assert [a.kernel for a in together] == [k.name for k in ks] and not any(a.cached for a in together)
    assert all(a.cached for a in compile_kernels(ks, tgt, jobs=3))
    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "alone"))
    assert [a.data for a in together] == [compile_kernel(k, tgt).data for k in ks]


def test_compile_jobs_come_from_the_environment(monkeypatch):
    from poot.codegen.compile import compile_jobs
    from poot.errors import PootError

    monkeypatch.setenv("POOT_COMPILE_JOBS", "3")
    assert compile_jobs() == 3
    monkeypatch.setenv("POOT_COMPILE_JOBS", "none")
    with pytest.raises(PootError, match="POOT_COMPILE_JOBS='none'"):
        compile_jobs()


def test_a_kernel_without_the_loop_vectorizer_is_its_own_artifact(tmp_path, monkeypatch):
    # the loop vectorizer's switch is not in the IR text, so it is in the cache key: the two
    # compiles of one kernel differ (the host's 16-lane loop stays scalar without it) and neither
    # is the other's cache hit
    import dataclasses

    from poot.codegen import host_target

    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    loop = K.For(
        "i", K.const(0), K.Ref("n", K.i32), (K.Store("y", K.Ref("i", K.i32), K.Bin("mul", K.Load("x", K.Ref("i", K.i32), dt.f32), K.Const(2.0, dt.f32))),)
    )
    params = (K.Buffer("x", dt.f32), K.Buffer("y", dt.f32, readonly=False), K.ScalarParam("n", K.i32))
    k = K.Kernel("scale", params, (loop,), (1, 1, 1))
    plain = dataclasses.replace(k, loop_vectorize=False)
    a, b = compile_kernel(k, host_target()), compile_kernel(plain, host_target())
    assert not a.cached and not b.cached and a.data != b.data
    assert compile_kernel(plain, host_target()).cached


def test_dump_stages(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_DUMP", str(tmp_path))
    compile_kernel(KERNELS[0], target("nvptx:sm_90"), use_cache=False)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{KERNELS[0].name}.nvptx.{s}" for s in ("ll", "opt.ll", "ptx"))


def test_llvm_crash_becomes_a_typed_error():
    # wgmma is only in sm_90a: asking sm_90's backend for it aborts LLVM (shared/TARGETS.md);
    # the crash must stay in the worker and come back as a CompileError naming kernel and target
    from poot.codegen.compile import _POOL

    ir_text = (
        'target triple = "nvptx64-nvidia-cuda"\n'
        "declare void @llvm.nvvm.wgmma.fence.sync.aligned()\n"
        "define ptx_kernel void @k() {\n  call void @llvm.nvvm.wgmma.fence.sync.aligned()\n  ret void\n}\n"
    )
    with pytest.raises(CompileError, match="kernel k.*nvptx:sm_80"):
        _POOL.run(ir_text, target("nvptx:sm_80"), "k")
    # and the next compile works with a fresh worker
    assert compile_kernel(KERNELS[0], target("nvptx:sm_90"), use_cache=False).data


def test_refusals_are_typed():
    big = K.Kernel("big", (K.Buffer("y", K.i32, readonly=False),), (K.Store("y", K.Builtin("thread_id"), K.Builtin("thread_id")),), (1024, 2, 1))
    with pytest.raises(Exception, match="1..1024 threads"):
        compile_kernel(big, target("nvptx:sm_90"))
    huge = K.Kernel("huge", (K.Buffer("y", K.i32, readonly=False),), (K.Store("y", K.const(0), K.const(1)),), (32, 1, 1), (K.Shared("s", K.i32, 20000),))
    with pytest.raises(Refusal, match="workgroup memory exceed"):
        compile_kernel(huge, target("nvptx:sm_90"))
    with pytest.raises(Refusal, match="unknown target"):
        target("tpu:v5")


def test_kernels_wait_for_the_launch_before_where_launches_can_overlap():
    """sm_90+ PTX waits for the launch before (griddepcontrol) at a kernel's entry, or where the
    kernel places its ``AwaitPrior`` (after loads of weights only); other targets have no such wait.
    The wait is refused under control flow and twice."""
    from poot.kernel.verify import KernelError, verify_kernel

    f32 = K.Buffer("x", dt.f32), K.Buffer("y", dt.f32, readonly=False)
    tid = K.Builtin("thread_id", 0)
    plain = K.Kernel("plain", f32, (K.Store("y", tid, K.Load("x", tid, dt.f32)),), (32, 1, 1), ())
    placed = K.Kernel("placed", f32, (K.Let("w", K.Load("x", tid, dt.f32)), K.AwaitPrior(), K.Store("y", tid, K.Ref("w", dt.f32))), (32, 1, 1), ())
    for k in (plain, placed):
        verify_kernel(k)
        ptx = compile_kernel(k, target("nvptx:sm_90a"), use_cache=False).data.decode()
        body = ptx[ptx.index(k.name) :]
        assert body.count("griddepcontrol.wait") == 1 and body.count("griddepcontrol.launch_dependents") == 1
        if k is placed:  # the load comes before the wait, the store after it
            assert body.index("ld.global") < body.index("griddepcontrol.wait") < body.index("st.global")
        assert "griddepcontrol" not in compile_kernel(k, target("nvptx:sm_80"), use_cache=False).data.decode()
    nested = K.Kernel("nested", f32, (K.If(K.Bin("lt", tid, K.Const(4, K.i32)), (K.AwaitPrior(),)),), (32, 1, 1), ())
    twice = K.Kernel("twice", f32, (K.AwaitPrior(), K.AwaitPrior()), (32, 1, 1), ())
    for bad, why in ((nested, "top level"), (twice, "more than once")):
        with pytest.raises(KernelError, match=why):
            verify_kernel(bad)


def test_prefetches_go_to_the_bulk_copy_engine_on_hopper_and_to_the_l2_on_the_host(tmp_path, monkeypatch):
    """``Prefetch`` of a range before the wait: one ``cp.async.bulk.prefetch.L2`` of the given
    bytes, ahead of ``griddepcontrol.wait``, on sm_90+; none on sm_80; on the host one
    ``llvm.prefetch`` of locality 2 (into the L2, not the L1) for each of its first 16 lines; SPIR-V
    compiles it away (a hint). A prefetch of a workgroup array or with a float count is refused."""
    from poot.codegen.targets import spirv_target
    from poot.kernel.verify import KernelError, verify_kernel

    bufs = K.Buffer("x", dt.f32), K.Buffer("y", dt.f32, readonly=False)
    tid = K.Builtin("thread_id", 0)
    body = (K.Prefetch("x", K.Bin("mul", tid, K.Const(64, K.i32)), K.Const(4096, K.i32)), K.AwaitPrior(), K.Store("y", tid, K.Load("x", tid, dt.f32)))
    k = K.Kernel("ask_first", bufs, body, (32, 1, 1), ())
    verify_kernel(k)
    ptx = compile_kernel(k, target("nvptx:sm_90a"), use_cache=False).data.decode()
    body_ptx = ptx[ptx.index(".entry") :]
    assert body_ptx.count("cp.async.bulk.prefetch.L2.global") == 1 and "4096" in body_ptx
    assert body_ptx.index("cp.async.bulk.prefetch") < body_ptx.index("griddepcontrol.wait") < body_ptx.index("ld.global")
    assert "prefetch" not in compile_kernel(k, target("nvptx:sm_80"), use_cache=False).data.decode()
    monkeypatch.setenv("POOT_DUMP", str(tmp_path))
    assert compile_kernel(k, target("host"), use_cache=False) is not None
    host_ir = (tmp_path / "ask_first.host.ll").read_text()
    asks = [ln for ln in host_ir.splitlines() if "call void" in ln and "llvm.prefetch" in ln]
    assert len(asks) == 16 and all(ln.rstrip().endswith("i32 0, i32 2, i32 1)") for ln in asks), asks[:2]
    if shutil.which("spirv-opt"):  # (SPIR-V goes through SPIRV-Tools: installed where the Vulkan backend is tested)
        assert compile_kernel(k, spirv_target(1), use_cache=False).data[:4] == b"\x03\x02\x23\x07"  # SPIR-V's magic number
    shared = K.Kernel("ask_shared", bufs, (K.Prefetch("s", K.Const(0, K.i32), K.Const(16, K.i32)),), (32, 1, 1), (K.Shared("s", dt.f32, 64),))
    floaty = K.Kernel("ask_float", bufs, (K.Prefetch("x", K.Const(0, K.i32), K.Const(16.0, dt.f32)),), (32, 1, 1), ())
    for bad, why in ((shared, "reads a buffer"), (floaty, "byte count must be i32")):
        with pytest.raises(KernelError, match=why):
            verify_kernel(bad)


def test_a_kernel_asking_for_workgroups_an_sm_gets_launch_bounds_in_its_ptx():
    """``Kernel.min_groups``: NVPTX declares the workgroup size and the workgroups an SM wants
    (``.maxntid``, ``.minnctapersm``: ptxas caps registers for them); without it neither, and the
    host ignores it (the same values either way)."""
    f32 = K.Buffer("x", dt.f32), K.Buffer("y", dt.f32, readonly=False)
    tid = K.Builtin("thread_id", 0)
    body = (K.Store("y", tid, K.Load("x", tid, dt.f32)),)
    for groups in (0, 3):
        k = K.Kernel(f"bounds{groups}", f32, body, (256, 1, 1), (), min_groups=groups)
        ptx = compile_kernel(k, target("nvptx:sm_90a"), use_cache=False).data.decode()
        if groups:
            assert re.search(r"\.maxntid 256\b", ptx) and re.search(r"\.minnctapersm 3\b", ptx), ptx[:2000]
        else:
            assert ".maxntid" not in ptx and ".minnctapersm" not in ptx
    assert compile_kernel(K.Kernel("bounds_host", f32, body, (256, 1, 1), (), min_groups=3), target("host"), use_cache=False).data


def test_the_last_workgroup_to_count_sees_every_workgroups_writes():
    """``Fence`` and ``AtomicAdd``'s old value: each of 16 workgroups writes its values, fences and
    counts; the one that counts last (old value 15) sums every workgroup's values and leaves the
    count zero. Run on the host (workgroups on two threads); NVPTX fences at device scope around the
    count. Every thread reads the last workgroup's test from workgroup memory: a tail with a
    barrier only thread 0 reaches is refused."""
    import numpy as np

    from poot.kernel.verify import KernelError, verify_kernel
    from poot.testing.kernels import run_host

    groups, width = 16, 64
    i32, tid, gid = dt.i32, K.Builtin("thread_id", 0), K.Builtin("group_id", 0)
    c = lambda v: K.Const(v, i32)  # noqa: E731
    at = K.Bin("add", K.Bin("mul", gid, c(width)), tid)
    acc = K.Bin("add", K.Ref("acc", dt.f32), K.Load("y", K.Bin("add", K.Bin("mul", K.Ref("g", i32), c(width)), tid), dt.f32))
    tail = (
        K.Fence(),
        K.Let("acc", K.Const(0.0, dt.f32)),
        K.For("g", c(0), c(groups), (K.Assign("acc", acc),)),
        K.Barrier(),
        K.Store("out", tid, K.Ref("acc", dt.f32)),
        K.If(K.Bin("eq", tid, c(0)), (K.Store("done", c(0), c(0)),)),
    )
    body = (
        K.Store("y", at, K.Cast(at, dt.f32)),
        K.Fence(),
        K.Barrier(),
        K.If(K.Bin("eq", tid, c(0)), (K.AtomicAdd("done", c(0), c(1), old="before"), K.Store("flag", c(0), K.Ref("before", i32)))),
        K.Barrier(),
        K.Let("last", K.Load("flag", c(0), i32)),
        K.If(K.Bin("eq", K.Ref("last", i32), c(groups - 1)), tail),
    )
    params = (K.Buffer("y", dt.f32, readonly=False), K.Buffer("out", dt.f32, readonly=False), K.Buffer("done", i32, readonly=False))
    k = K.Kernel("last_group_sums", params, body, (width, 1, 1), (K.Shared("flag", i32, 1),))
    verify_kernel(k)
    y, out, done = np.full(groups * width, np.nan, np.float32), np.full(width, np.nan, np.float32), np.zeros(1, np.int32)
    for _ in range(2):  # the count left zero: a second launch does it again
        out[:] = np.nan
        run_host(k, (groups,), {"y": y, "out": out, "done": done})
        np.testing.assert_array_equal(out, np.arange(groups * width, dtype=np.float32).reshape(groups, width).sum(0))
        assert done[0] == 0
    ptx = compile_kernel(k, target("nvptx:sm_90a"), use_cache=False).data.decode()
    assert ptx.count("fence.acq_rel.gpu") == 2 and "atom.global.add" in ptx
    with pytest.raises(KernelError, match="barrier"):
        verify_kernel(K.Kernel("divergent", params, body[:-1] + (K.If(K.Bin("eq", tid, c(0)), tail),), (width, 1, 1), (K.Shared("flag", i32, 1),)))


def test_asynchronous_copies_land_whole_on_every_target():
    """``CopyAsync`` of 16 bytes a thread into workgroup memory, read back by another thread after
    the wait and a barrier: ``cp.async`` on NVPTX; four loads and stores on the host (run here:
    every element where it belongs, an i32 buffer into an f32 array bit for bit), on AMDGPU and on
    SPIR-V (whose LLVM backend lowers neither a vector load through a cast pointer nor a loaded
    value's bitcast: a copy between arrays of two element types is refused there by name)."""
    import numpy as np

    from poot.codegen.targets import spirv_target
    from poot.kernel.verify import verify_kernel
    from poot.testing.kernels import run_host

    width, i32, tid = 32, dt.i32, K.Builtin("thread_id", 0)
    c = lambda v: K.Const(v, i32)  # noqa: E731
    four = K.Bin("mul", tid, c(4))
    other = K.Bin("rem", K.Bin("add", tid, c(5)), c(width))  # a chunk another thread copied
    body = (
        K.CopyAsync("s", four, "x", K.Bin("add", four, c(8))),
        K.CopyAsyncSync("commit"),
        K.CopyAsyncSync("wait"),
        K.Barrier(),
        K.VecLoad(tuple(f"v{i}" for i in range(4)), "s", K.Bin("mul", other, c(4)), dt.f32),
        K.VecStore("y", four, tuple(K.Ref(f"v{i}", dt.f32) for i in range(4))),
    )
    k = K.Kernel("copy_and_swap", (K.Buffer("x", i32), K.Buffer("y", dt.f32, readonly=False)), body, (width, 1, 1), (K.Shared("s", dt.f32, 4 * width),))
    verify_kernel(k)
    x = np.random.default_rng().integers(-(2**31), 2**31 - 1, 4 * width + 8, dtype=np.int64).astype(np.int32)
    y = np.full(4 * width, np.nan, np.float32)
    run_host(k, (1,), {"x": x, "y": y})
    want = x[8:].reshape(width, 4)[(np.arange(width) + 5) % width].reshape(-1)
    np.testing.assert_array_equal(y.view(np.int32), want)
    ptx = compile_kernel(k, target("nvptx:sm_80"), use_cache=False).data.decode()
    assert ptx.count("cp.async.cg.shared.global") == 1 and "cp.async.wait_group" in ptx
    assert compile_kernel(k, target("amdgcn:gfx942"), use_cache=False) is not None
    with pytest.raises(Refusal, match="one element type"):  # SPIR-V: i32 into f32 refused by name, not an LLVM crash
        compile_kernel(k, spirv_target(1), use_cache=False)
    same = K.Kernel(
        "copy_and_swap_i32",
        (K.Buffer("x", i32), K.Buffer("y", i32, readonly=False)),
        body[:4]
        + (
            K.VecLoad(tuple(f"v{i}" for i in range(4)), "s", K.Bin("mul", other, c(4)), i32),
            K.VecStore("y", four, tuple(K.Ref(f"v{i}", i32) for i in range(4))),
        ),
        (width, 1, 1),
        (K.Shared("s", i32, 4 * width),),
    )
    if shutil.which("spirv-opt"):  # (SPIR-V goes through SPIRV-Tools: installed where the Vulkan backend is tested)
        assert compile_kernel(same, spirv_target(1), use_cache=False).data[:4] == b"\x03\x02\x23\x07"
        from poot.kernel.library.linear_gpu import gemv_warp  # a GEMV whose weights are copied ahead, as Vulkan on an NVIDIA GPU runs it

        assert compile_kernel(gemv_warp("q4_k", 2048, 1, 4, staged=True, copied=1), spirv_target(32), use_cache=False).data[:4] == b"\x03\x02\x23\x07"


def _wgmma_kernel() -> K.Kernel:
    acc = tuple(f"a{i}" for i in range(4))
    body = tuple(K.Let(nm, K.Const(0.0, dt.f32)) for nm in acc) + (Wgmma(acc, "sa", K.Const(0, dt.i32), "sb", K.Const(0, dt.i32), 128, 256),)
    return K.Kernel("one_wgmma", (K.Buffer("y", dt.f32, readonly=False),), body, (128, 1, 1), (K.Shared("sa", dt.i32, 512), K.Shared("sb", dt.i32, 256)))


def test_a_targets_own_statement_is_refused_elsewhere_by_name():
    """A ``TargetStmt`` lowers where its target's lowering has ``lower_<name>`` (wgmma on sm_90a)
    and is refused by name everywhere else, not miscompiled."""
    from poot.codegen import host_target

    k = _wgmma_kernel()
    assert "wgmma.mma_async" in compile_kernel(k, target("nvptx:sm_90a"), use_cache=False).data.decode()
    for t in (host_target(), target("spirv:vulkan1.3")):
        with pytest.raises(Refusal, match="cannot lower Wgmma"):
            compile_kernel(k, t, use_cache=False)
    with pytest.raises(Refusal, match="wgmma"):
        compile_kernel(k, target("nvptx:sm_80"), use_cache=False)


def test_targets_come_from_backends_and_name_their_lowering():
    """Targets past the host and SPIR-V are the backends' (``poot_targets``); one whose lowering
    cannot be loaded is refused with what to do, and an unknown name lists the known ones."""
    from dataclasses import replace

    from poot.codegen.targets import TARGETS, backend_targets

    theirs = backend_targets()
    assert {"nvptx:sm_90a", "nvptx:sm_80", "amdgcn:gfx942"} <= set(theirs) and not set(theirs) & set(TARGETS)
    assert theirs["nvptx:sm_90a"].lowering == "poot_ptx.lowering:NvptxLowering"
    k = catalogue()[0]
    with pytest.raises(Refusal, match="cannot be loaded.*backend installed"):
        compile_kernel(k, replace(theirs["nvptx:sm_90"], lowering="poot_nowhere.lowering:Nothing"), use_cache=False)
    with pytest.raises(Refusal, match=r"unknown target \(known: host, spirv:vulkan1.3, .*nvptx:sm_90a"):
        target("metal:m3")


def test_the_hosts_log_is_within_two_ulp_and_keeps_its_specials():
    """The host computes ln x in vectorizable f32 arithmetic (the exponent from the bits and a
    polynomial, not a libm call per element): within 2 ulp of the correctly rounded value from the
    smallest subnormal to the largest float, and -inf at 0, NaN below it, inf at inf, NaN kept."""
    from poot.graph.dims import sym
    from poot.plan import compile_plan
    from poot.plugins import host
    from poot.runtime import get_device

    b = GraphBuilder()
    g = b.build({"y": b.log(b.input("x", "f32", [sym("tokens")]))})
    dev = get_device("cpu")
    ex = host().hook.poot_executor(device=dev)(compile_plan(g, dev))
    rng = np.random.default_rng()
    bits = rng.integers(1, 0x7F800000, 400_000, dtype=np.int64).astype(np.int32)  # every positive finite float, subnormals included
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1.0, 2.0, 0.5, 0.70710677, 0.7071068, 1e-45, 3.4028235e38]
    x = np.concatenate([bits.view(np.float32), rng.uniform(0.5, 2.0, 100_000).astype(np.float32), np.float32(special)]).astype(np.float32)
    y = ex.run({"x": x}, {})["y"]
    ex.close()
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log(x.astype(np.float64)).astype(np.float32)
    assert (np.isnan(y) == np.isnan(want)).all()
    assert (np.isinf(y) == np.isinf(want)).all() and (np.sign(y[np.isinf(y)]) == np.sign(want[np.isinf(want)])).all()
    fin = np.isfinite(want)
    ulp = np.abs(y[fin].view(np.int32).astype(np.int64) - want[fin].view(np.int32).astype(np.int64))
    assert ulp.max() <= 2, f"{ulp.max()} ulp at x = {x[fin][ulp.argmax()]}"
    tail = y[-len(special) :]
    assert tail[0] == tail[1] == -np.inf and tail[2] == np.inf and np.isnan(tail[3]) and np.isnan(tail[5]) and tail[6] == 0.0


def test_the_hosts_exp_is_within_one_ulp_and_keeps_its_specials():
    """The host computes e^x in vectorizable f32 arithmetic (range reduction and a polynomial, not a
    libm call per element): within 1 ulp of the correctly rounded value over the whole f32 range,
    subnormals included; inf past 88.72, 0 below -103.97, NaN kept."""
    from poot.graph.dims import sym
    from poot.plan import compile_plan
    from poot.plugins import host
    from poot.runtime import get_device

    b = GraphBuilder()
    g = b.build({"y": b.exp(b.input("x", "f32", [sym("tokens")]))})
    dev = get_device("cpu")
    ex = host().hook.poot_executor(device=dev)(compile_plan(g, dev))
    rng = np.random.default_rng()
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72283, 88.72284, 89.5, -87.3, -87.4, -103.9, -104.0, -200.0, 1e-30, -1e-30]
    x = np.concatenate([rng.uniform(-104, 89, 300_000), rng.uniform(-1, 1, 100_000), special]).astype(np.float32)
    y = ex.run({"x": x}, {})["y"]
    ex.close()
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all() and not np.isnan(y[~nan]).any()
    assert (np.isinf(y) == np.isinf(want)).all()
    fin = np.isfinite(want)
    ulp = np.abs(y[fin].view(np.int32).astype(np.int64) - want[fin].view(np.int32).astype(np.int64))
    assert ulp.max() <= 1, f"{ulp.max()} ulp at x = {x[fin][ulp.argmax()]}"
    tail = y[-len(special) :]
    assert tail[0] == tail[1] == tail[-2] == tail[-1] == 1.0 and tail[2] == np.inf and tail[3] == 0.0 and tail[-3] == 0.0
