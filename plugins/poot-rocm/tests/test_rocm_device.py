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


def test_the_null_gfx942_device_is_refused_by_the_planner_by_name():
    """null:gfx942 carries an MI300's capabilities and its codegen target; the planner has no AMDGCN
    schedules yet, and says so as a typed refusal naming the device and the target."""
    from poot.errors import Refusal
    from poot.graph.builder import GraphBuilder
    from poot.plan import compile_plan
    from poot.plugins import host
    from poot.runtime import get_device

    dev = get_device("null:gfx942")
    assert dev.target == "amdgcn" and dev.capabilities.subgroup_size == 64
    assert host().hook.poot_codegen_target(device=dev).key == "amdgcn:gfx942"
    b = GraphBuilder()
    graph = b.build({"y": b.mul(b.input("x", "f32", [4]), 2.0)})
    with pytest.raises(Refusal, match="null:gfx942 refuses plan: .*target 'amdgcn'"):
        compile_plan(graph, dev)
