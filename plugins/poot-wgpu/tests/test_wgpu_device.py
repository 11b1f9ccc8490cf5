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


def test_a_probe_that_could_not_run_is_not_remembered(tmp_path, monkeypatch):
    """A probe that raised (naga, the driver, a lost device) gives width 1 now and is tried again
    next time; a measured width is kept in the cache."""
    wgpu = pytest.importorskip("wgpu")
    from poot_wgpu import subgroups

    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # noqa: BLE001 - no adapter at all
        pytest.skip(f"no wgpu adapter: {e}")
    if subgroups.FEATURE not in adapter.features:
        pytest.skip("this adapter has no subgroup feature")
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    real = subgroups._measure
    monkeypatch.setattr(subgroups, "_measure", lambda a: None)
    assert subgroups.subgroup_width(adapter) == 1
    assert not (tmp_path / "wgpu" / "subgroups.json").exists()
    monkeypatch.setattr(subgroups, "_measure", real)
    n = subgroups.subgroup_width(adapter)
    assert (tmp_path / "wgpu" / "subgroups.json").exists()
    monkeypatch.setattr(subgroups, "_measure", lambda a: pytest.fail("a measured width is measured again"))
    assert subgroups.subgroup_width(adapter) == n
