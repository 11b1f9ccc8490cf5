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


@pytest.mark.skipif(not HAS_LOADER, reason="no Vulkan loader (libvulkan1) on this machine; CI installs it with lavapipe")
def test_the_planner_and_the_runtime_agree_on_the_subgroup_width():
    """Plans choose subgroup schedules from the capabilities; the runtime compiles them for its own
    width: both come from one rule (subgroup_width), and a device with the operations gets them."""
    from poot_vulkan.runtime import VulkanDevice

    d = next(d for d in vulkan_devices() if d.available())
    with VulkanDevice(d.index) as dev:
        if d.capabilities.subgroup_ops:
            assert dev.subgroup == d.capabilities.subgroup_size > 1
        else:
            assert dev.subgroup == 1 and not dev.full_subgroups


@pytest.mark.skipif(HAS_LOADER, reason="this machine has a Vulkan loader; the no-loader path cannot be seen here")
def test_no_loader_is_reported():
    (d,) = vulkan_devices()
    assert not d.available() and d.unavailable.code in ("no-driver", "no-binding")


@pytest.mark.skipif(not HAS_LOADER, reason="no Vulkan loader (libvulkan1) on this machine; CI installs it with lavapipe")
def test_pipelines_go_through_a_cache_kept_on_disk(tmp_path, monkeypatch):
    """Pipelines are created through the device's VkPipelineCache, written under poot's cache
    directory when the device closes (the driver's header names this device) and read back by the
    next run."""
    import numpy as np

    from poot.codegen import TARGETS, compile_kernel
    from poot.kernel.library import norms
    from poot_vulkan.runtime import VulkanDevice, VulkanKernel

    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    k = norms.rms_norm.instantiate(BLOCK=64)
    spirv = compile_kernel(k, TARGETS["spirv:vulkan1.3"]).data
    dev = VulkanDevice(0)
    VulkanKernel(k, spirv, dev)
    path = dev.pipeline_cache_path()
    props = dev.vk.vkGetPhysicalDeviceProperties(dev.physical)
    dev.close()
    header = np.frombuffer(path.read_bytes()[:16], np.uint32)
    assert path.parent == tmp_path / "vulkan" and header[1] == 1 and (header[2], header[3]) == (props.vendorID, props.deviceID)
    dev = VulkanDevice(0)  # seeded from the file
    y = np.full((2, 100), np.nan, np.float32)
    x = np.random.default_rng(0).standard_normal((2, 100)).astype(np.float32)
    VulkanKernel(k, spirv, dev).run((2,), {"x": x, "w": np.ones(100, np.float32), "y": y}, {"cols": 100, "eps": 1e-5})
    dev.close()
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5), rtol=1e-5)
