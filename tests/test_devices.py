"""Devices by name: what `poot devices` shows here, name resolution, and typed errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from poot.errors import DeviceUnavailable, UnknownDevice
from poot.runtime import Capabilities, Device, Unavailable, get_device, list_devices, normalize_name

# CI sets this to the devices that must be available on its machine (lavapipe gives vulkan and wgpu)
EXPECTED = [n for n in os.environ.get("POOT_EXPECT_DEVICES", "cpu").split(",") if n]


def _devices_json() -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "poot.cli", "devices", "--json"], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout)


def test_poot_devices_shows_what_can_run_here_and_why_not():
    devs = {d["name"]: d for d in _devices_json()}
    for name in EXPECTED:
        assert name in devs, f"{name} missing from `poot devices`: {sorted(devs)}"
        assert devs[name]["available"], f"{name} should be available here: {devs[name]['reason']}"
        caps = devs[name]["capabilities"]
        assert caps["max_workgroup_size"] > 0 and caps["shared_memory_bytes"] > 0 and "f32" in caps["dtypes"]
    for d in devs.values():
        if not d["available"]:
            assert d["reason"]["code"] and d["reason"]["message"], d
    table = subprocess.run([sys.executable, "-m", "poot.cli", "devices"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert table.splitlines()[0].split() == ["DEVICE", "STATUS", "PLUGIN", "TARGET", "DETAILS"]
    for name in EXPECTED:
        assert any(line.split()[:2] == [name, "available"] for line in table.splitlines())


@pytest.mark.parametrize("raw,want", [("CUDA0", "cuda:0"), (" Vulkan:1 ", "vulkan:1"), ("cpu", "cpu"), ("NPU:XDNA2", "npu:xdna2"), ("wgpu12", "wgpu:12")])
def test_names_are_case_insensitive_and_accept_ggml_spelling(raw, want):
    assert normalize_name(raw) == want


CAPS = Capabilities(frozenset({"f32"}), 1, 64, 1024, 1, 1 << 30)
FAKE_LIST = [
    Device("cpu", None, "host", "host", CAPS),
    Device("vulkan", 0, "gpu a", "spirv", CAPS),
    Device("vulkan", 1, "old gpu", "spirv", CAPS, Unavailable("unsupported", "Vulkan 1.1 is below 1.3")),
    Device("cuda", None, "NVIDIA GPU", "nvptx", None, Unavailable("no-driver", "no NVIDIA driver")),
]


def test_lookup_resolves_names_kinds_and_default(monkeypatch):
    monkeypatch.delenv("POOT_DEVICE", raising=False)
    assert get_device("VULKAN0", FAKE_LIST).name == "vulkan:0"
    assert get_device("vulkan", FAKE_LIST).name == "vulkan:0"  # a bare kind: its first available device
    assert get_device(None, FAKE_LIST).name == "cpu"
    monkeypatch.setenv("POOT_DEVICE", "Vulkan:0")
    assert get_device(None, FAKE_LIST).name == "vulkan:0"


def test_unavailable_device_gives_its_reason():
    with pytest.raises(DeviceUnavailable, match="vulkan:1 cannot run here: unsupported: Vulkan 1.1 is below 1.3"):
        get_device("vulkan:1", FAKE_LIST)
    with pytest.raises(DeviceUnavailable, match="no device cuda:0: cuda: no-driver: no NVIDIA driver"):
        get_device("cuda:0", FAKE_LIST)


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(UnknownDevice, match=r"unknown device 'tpu:0'. Known devices: cpu, cuda, vulkan:0, vulkan:1"):
        get_device("tpu:0", FAKE_LIST)


def test_cpu_is_always_found_through_the_real_plugins():
    d = get_device("cpu")
    assert d.available() and d.plugin == "cpu" and d.capabilities.compute_units >= 1
    assert any(x.kind == "cpu" for x in list_devices())


def test_a_device_found_early_spares_the_later_plugins_their_probes(monkeypatch):
    # the plugins are asked in order until the device turns up: looking up the CPU device calls no
    # GPU plugin's probe (a Vulkan or wgpu probe takes a second or more on first use)
    from poot.plugins import host

    asked: list[str] = []
    each = host().iter_each

    def counting(hook):  # type: ignore[no-untyped-def]
        for name, res in each(hook):
            asked.append(name)
            yield name, res

    monkeypatch.setattr(host(), "iter_each", counting)
    monkeypatch.delenv("POOT_DEVICE", raising=False)
    assert get_device("cpu").name == "cpu" and asked == ["cpu"]
    asked.clear()
    with pytest.raises(UnknownDevice):
        get_device("tpu:0")
    assert asked == [name for name, _ in each("poot_devices")]  # an unknown name asks every plugin


def test_unavailability_codes_are_checked():
    with pytest.raises(ValueError, match="unknown unavailability code"):
        Unavailable("broken", "x")


def test_compile_only_devices_come_from_the_backends_and_are_listed():
    """null:ARCH names resolve to the backends' compile-only devices (planned for, never run);
    an unknown one lists those there are; `poot devices` names them under the table."""
    from poot.runtime import null_devices

    nulls = {d.name: d for d in null_devices()}
    assert {"null:sm_80", "null:sm_90a", "null:gfx942", "null:gfx1100", "null:vulkan", "null:xdna2"} <= set(nulls)
    assert {d.plugin for d in nulls.values()} == {"ptx", "rocm", "vulkan", "npu"}
    assert get_device("NULL:SM_90A") == nulls["null:sm_90a"] and nulls["null:sm_90a"].target == "nvptx"
    with pytest.raises(UnknownDevice, match=r"unknown compile-only device 'null:sm_70'. Known: (null:\w+, )*null:sm_80, null:sm_90a"):
        get_device("null:sm_70")
    table = subprocess.run([sys.executable, "-m", "poot.cli", "devices"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.search(r"compile-only, for `poot plan MODEL --device NAME --compile`: (null:\w+, )*null:sm_80, null:sm_90a", table)
