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


def test_poot_plan_compiles_real_models_for_an_mi300_without_one(smollm2_path, gemma3_path):
    """null:gfx942 carries an MI300's capabilities (wave64) and its codegen target: SmolLM2 and
    Gemma 3 are planned with the subgroup GPU schedules and compile to AMDGPU code objects (ELF);
    nothing here can run them."""
    import re
    import subprocess
    import sys

    from poot.plugins import host
    from poot.runtime import get_device

    dev = get_device("null:gfx942")
    assert dev.target == "amdgcn" and dev.capabilities.subgroup_size == 64
    assert host().hook.poot_codegen_target(device=dev).key == "amdgcn:gfx942"
    for model in ("SmolLM2", "gemma3"):
        r = subprocess.run(
            [sys.executable, "-m", "poot.cli", "plan", model, "--device", "null:gfx942", "--compile"], capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        m = re.search(r"compiled (\d+) kernels for amdgcn:gfx942 in [\d.]+ s: [\d.]+ (KiB|MiB) of code-object", r.stdout)
        assert m and int(m.group(1)) > 10, r.stdout[-500:]
