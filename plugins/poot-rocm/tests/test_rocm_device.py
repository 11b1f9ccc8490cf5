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
