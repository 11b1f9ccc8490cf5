"""AMD GPUs as hip-python reports them; with no ROCm runtime, the typed reason."""

import ctypes

import pytest

from poot_rocm.device import rocm_devices


def _has_hip() -> bool:
    try:
        ctypes.CDLL("libamdhip64.so")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_has_hip(), reason="this machine has a ROCm runtime; the no-driver path cannot be seen here")
def test_no_runtime_is_reported_with_its_reason():
    (d,) = rocm_devices()
    assert d.name == "rocm" and not d.available()
    assert d.unavailable.code == "no-driver" and "libamdhip64" in d.unavailable.message


@pytest.mark.skipif(not _has_hip(), reason="no ROCm runtime (libamdhip64.so) on this machine")
def test_runtime_present_gives_devices_or_no_device():
    devs = rocm_devices()
    assert devs
    for d in devs:
        if d.available():
            assert d.capabilities.subgroup_size in (32, 64)
        else:
            assert d.unavailable.code in ("no-device", "unsupported", "no-driver")


@pytest.mark.parametrize("arch,wave", [("gfx942", 64), ("gfx1100", 32)])
def test_poot_plan_compiles_real_models_for_an_amd_gpu_not_here(smollm2_path, gemma3_path, arch, wave):
    """null:gfx942 (an MI300, wave64) and null:gfx1100 (an RX 7900, wave32) carry the capabilities
    those GPUs report, no matrix instructions (MFMA and WMMA have no lowering yet), and their codegen
    targets: SmolLM2 and Gemma 3 are planned with the subgroup GPU schedules at the wave's width and
    every launch links into an AMDGPU code object (ELF); nothing here can run them."""
    import re
    import subprocess
    import sys

    from poot.plugins import host
    from poot.runtime import get_device

    dev = get_device(f"null:{arch}")
    assert dev.target == "amdgcn" and dev.capabilities.subgroup_size == wave and not dev.capabilities.matrix_ops
    tgt = host().hook.poot_codegen_target(device=dev)
    assert tgt.key == f"amdgcn:{arch}" and tgt.subgroup == wave and not tgt.matrix
    for model in ("SmolLM2", "gemma3"):
        r = subprocess.run(
            [sys.executable, "-m", "poot.cli", "plan", model, "--device", f"null:{arch}", "--compile"], capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        assert f"SUBGROUP{wave}" in r.stdout  # norms reduce across the wave's lanes
        m = re.search(rf"compiled (\d+) kernels for amdgcn:{arch} in [\d.]+ s: [\d.]+ (KiB|MiB) of code-object", r.stdout)
        assert m and int(m.group(1)) > 10, r.stdout[-500:]
