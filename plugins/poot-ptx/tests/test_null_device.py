"""null:sm_80 and null:sm_90a: NVIDIA plans and PTX on a machine without the GPU."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from poot.codegen import compile_kernel
from poot.plan import compile_plan
from poot.plugins import host
from poot.runtime import get_device


def _poot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poot.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("model", ["SmolLM2", "gemma3"])
def test_poot_plan_compiles_real_models_for_a_gpu_not_here(smollm2_path, gemma3_path, model, arch):
    """Both real models planned (one token, and a 64-token prompt, which takes the tensor-core
    GEMMs) and compiled for an A100 and an H100/H200 on this machine."""
    for tokens in ("1", "64"):
        r = _poot("plan", model, "--device", f"null:{arch}", "--tokens", tokens, "--compile")
        assert r.returncode == 0, r.stderr
        assert "activation arena" in r.stdout
        assert ("gemv_warp" if tokens == "1" else "gemm_") in r.stdout  # the GPU schedules, not the host's
        m = re.search(rf"compiled (\d+) kernels for nvptx:{arch} in [\d.]+ s: [\d.]+ (KiB|MiB) of ptx", r.stdout)
        assert m and int(m.group(1)) > 10, r.stdout[-500:]


@pytest.mark.parametrize("name,arch", [("null:sm_80", "sm_80"), ("null:sm_90a", "sm_90a")])
def test_null_devices_plan_and_compile_for_their_arch(name, arch):
    """A null device has a real device's capabilities (sm_90a: wgmma and 227 KiB of opt-in
    workgroup memory) and its kernels compile to PTX for its own sm_XY."""
    from poot.graph.builder import GraphBuilder
    from poot.graph.dims import sym
    from poot.graph.passes import DEFAULT_PASSES, PassManager

    dev = get_device(name)
    assert dev.kind == "null" and dev.target == "nvptx" and dev.available()
    assert ("wgmma" in dev.capabilities.matrix_ops) == (arch == "sm_90a")
    b = GraphBuilder()
    x = b.input("x", "f32", [sym("tokens"), 256])
    y = b.linear(b.mul(x, 2.0), b.weight("w", "q4_k", [128, 256]))
    plan = compile_plan(PassManager(DEFAULT_PASSES).run(b.build({"y": y})), dev)
    tgt = host().hook.poot_codegen_target(device=dev)
    assert tgt.key == f"nvptx:{arch}"
    for launch in plan.launches:
        ptx = compile_kernel(launch.kernel, tgt).data.decode()
        assert f".target {arch}" in ptx and ".entry" in ptx, launch.kernel.name


def test_a_null_device_is_compile_only(smollm2_path):
    r = _poot("run", "SmolLM2", "hi", "--device", "null:sm_90a")
    assert r.returncode == 1 and "null:sm_90a is a compile-only device" in r.stderr, r.stderr
