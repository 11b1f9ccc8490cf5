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
