"""CUDA devices as cuda-python's driver API reports them; with no driver, the typed reason."""

import ctypes

import pytest

from poot_ptx.device import MIN_COMPUTE_CAPABILITY, cuda_devices


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_has_libcuda(), reason="this machine has an NVIDIA driver; the no-driver path cannot be seen here")
def test_no_driver_is_reported_with_its_reason():
    (d,) = cuda_devices()
    assert d.name == "cuda" and not d.available()
    assert d.unavailable.code == "no-driver"
    assert "NVIDIA driver" in d.unavailable.message


@pytest.mark.skipif(not _has_libcuda(), reason="no NVIDIA driver (libcuda.so.1) on this machine")
def test_gpus_are_listed_with_capabilities():
    devs = cuda_devices()
    assert devs and all(d.kind == "cuda" for d in devs)
    for i, d in enumerate(devs):
        assert d.index == i and d.capabilities.subgroup_size == 32
        major, minor = (int(x) for x in dict(d.capabilities.details)["compute capability"].split("."))
        assert bool(d.available()) == ((major, minor) >= MIN_COMPUTE_CAPABILITY)
        assert d.capabilities.memory_bytes > 1 << 30 and d.capabilities.shared_memory_bytes >= 48 * 1024
