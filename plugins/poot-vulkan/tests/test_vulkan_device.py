"""Vulkan physical devices with capabilities read from the driver (lavapipe in CI)."""

import ctypes.util

import pytest

from poot_vulkan.device import vulkan_devices

def _has_loader() -> bool:
    """libvulkan found by the linker's cache, or by the loader's own search (LD_LIBRARY_PATH: a loader
    unpacked from a .deb, as scripts/vulkan-check brings it)."""
    if ctypes.util.find_library("vulkan") is not None:
        return True
    try:
        ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return False
    return True


HAS_LOADER = _has_loader()


@pytest.mark.skipif(not HAS_LOADER, reason="no Vulkan loader (libvulkan1) on this machine; CI installs it with lavapipe")
def test_devices_have_driver_capabilities():
    devs = vulkan_devices()
    usable = [d for d in devs if d.available()]
    assert usable, f"no usable Vulkan device: {[str(d.available()) for d in devs]}"
    for d in usable:
        caps = d.capabilities
        assert d.name == f"vulkan:{d.index}" and d.target == "spirv"
        assert caps.subgroup_size >= 1 and caps.max_workgroup_size >= 128 and caps.shared_memory_bytes >= 16384
        major, minor, _ = (int(x) for x in dict(caps.details)["api"].split("."))
        assert (major, minor) >= (1, 3)


@pytest.mark.skipif(HAS_LOADER, reason="this machine has a Vulkan loader; the no-loader path cannot be seen here")
def test_no_loader_is_reported():
    (d,) = vulkan_devices()
    assert not d.available() and d.unavailable.code in ("no-driver", "no-binding")
