"""WebGPU adapters with their limits (lavapipe's Vulkan adapter in CI)."""

import ctypes.util

import pytest

from poot_wgpu.device import wgpu_devices

HAS_VULKAN = ctypes.util.find_library("vulkan") is not None


@pytest.mark.skipif(not HAS_VULKAN, reason="no Vulkan loader on this machine, so wgpu has no compute adapter; CI installs lavapipe")
def test_adapters_have_limits():
    devs = [d for d in wgpu_devices() if d.available()]
    assert devs
    for i, d in enumerate(devs):
        assert d.name == f"wgpu:{i}"
        assert dict(d.capabilities.details)["backend"] in ("Vulkan", "Metal", "D3D12")
        assert d.capabilities.max_workgroup_size >= 256 and d.capabilities.shared_memory_bytes >= 16384


def test_the_subgroup_width_is_measured():
    """The width kernels are compiled for is measured by a probe (WebGPU reports only a range): on a
    Vulkan adapter it is the Vulkan driver's subgroup size, and subgroup operations are then on."""
    dev = next(d for d in wgpu_devices() if d.name.startswith("wgpu:"))
    if not dev.available():
        pytest.skip(f"no wgpu adapter: {dev.available()}")
    caps = dev.capabilities
    assert caps is not None
    if not caps.subgroup_ops:
        pytest.skip("this adapter has no subgroup feature (or the probe found uneven subgroups)")
    n = caps.subgroup_size
    assert n >= 4 and not n & (n - 1)
    try:
        from poot_vulkan.device import vulkan_devices
    except ImportError:
        return
    vk = [d for d in vulkan_devices() if d.capabilities is not None and d.capabilities.subgroup_ops]
    if dict(dev.capabilities.details).get("backend") == "Vulkan" and len(vk) == 1:
        assert vk[0].capabilities.subgroup_size == n
