"""naga translates every kernel poot may hand it, subgroup operations included. naga panics abort
the process (a Rust panic in a function that cannot unwind), so the modules are made in a child
process: a panic fails this test instead of ending the run."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("wgpu")

CHILD = textwrap.dedent("""
    import sys, wgpu
    from poot.codegen import compile_kernel, spirv_target
    from poot.codegen.spirv import for_wgpu
    from poot.kernel.library import catalogue, norms
    from poot.kernel.library.linear_gpu import gemv_warp, gemv_warp_packed, gemv_warp_q6_k, quantize_q8x2
    try:
        a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        d = a.request_device_sync(required_features=["subgroup"])
    except Exception as e:
        print("SKIP", e); sys.exit(0)
    kernels = [(k, 1) for k in catalogue()]
    kernels += [(k, 32) for k in (gemv_warp("bf16", 4096, 1), gemv_warp("bf16", 4096, 4), gemv_warp("bf16", 4096, 1, glu=True),
                                  gemv_warp("bf16", 4096, 4, glu=True), gemv_warp("bf16", 4096, 1, parts=(64, 16, 16)),
                                  gemv_warp("bf16", 4096, 4, parts=(64, 16, 16)))]
    kernels += [(k, 32) for k in (gemv_warp("q4_k", 1024, 1), gemv_warp("q4_k", 1024, 2), gemv_warp("q4_k", 1024, 4), gemv_warp("q4_k", 1792, 4, unroll=4),
                                  gemv_warp("q4_k", 1024, 4, glu=True), gemv_warp("q4_k", 1024, 4, parts=(64, 16, 16)),
                                  gemv_warp("q4_k", 4096, 4, 8, xglobal=True), quantize_q8x2(4096))]
    kernels += [(norms.add_rms_norm.instantiate(BLOCK=1024, SUBGROUP=n), n) for n in (8, 32)]
    kernels += [(k, n) for n in (8, 32) for k in (gemv_warp_packed("q6_k", 4096, 1, n), gemv_warp_packed("q4_1", 576, 4, n),
                                                  gemv_warp_q6_k(4096, 1, n), gemv_warp_q6_k(2048, 4, n),
                                                  gemv_warp_q6_k(4096, 1, n, wide=True), gemv_warp_q6_k(2048, 4, n, wide=True))]
    for k, n in kernels:
        print(k.name, flush=True)
        d.create_shader_module(code=for_wgpu(compile_kernel(k, spirv_target(n)).data))
    print("DONE", len(kernels))
""")


def test_naga_takes_every_kernel_and_the_subgroup_schedules():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=1500)
    if r.stdout.startswith("SKIP"):
        pytest.skip(f"no wgpu adapter with subgroups: {r.stdout[5:].strip()}")
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "(nothing)"
    assert r.returncode == 0 and last.startswith("DONE"), f"naga stopped at {last}: {r.stderr[-1500:]}"
