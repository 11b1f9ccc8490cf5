"""Devices by name: gather what every plugin offers, and resolve names people type.

Names are case-insensitive: ``cpu``, ``cuda:0`` (or ``CUDA0``), ``rocm:1``, ``vulkan:0``, ``wgpu:0``,
``npu:xdna2``. A bare kind (``cuda``) means its first available device. The default comes from
``POOT_DEVICE``, else ``cpu``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator

from ..errors import DeviceUnavailable, UnknownDevice
from ..plugins import host
from .device import Device, Unavailable

__all__ = ["list_devices", "null_devices", "get_device", "normalize_name", "DEFAULT_DEVICE", "NULL_KIND"]

NULL_KIND = "null"  # compile-only devices, null:ARCH (`poot devices` lists them)

DEFAULT_DEVICE = "cpu"
_GLUED = re.compile(r"^([a-z]+)(\d+)$")


def normalize_name(name: str) -> str:
    """'CUDA0' -> 'cuda:0', ' Vulkan:1 ' -> 'vulkan:1', 'NPU:XDNA2' -> 'npu:xdna2'."""
    n = name.strip().lower()
    m = _GLUED.match(n)
    return f"{m.group(1)}:{m.group(2)}" if m else n


def list_devices() -> list[Device]:
    """Every device that installed plugins offer, available or not, in plugin order."""
    return list(_each_device())


def _each_device() -> Iterator[Device]:
    """``list_devices`` one plugin at a time: a plugin is probed only when its turn comes."""
    for plugin, result in host().iter_each("poot_devices"):
        if isinstance(result, Exception):
            yield Device(plugin, None, f"plugin {plugin}", unavailable=Unavailable("plugin-error", str(result)), plugin=plugin)
            continue
        for d in result or ():
            if not isinstance(d, Device):
                msg = f"plugin '{plugin}' returned {d!r} from poot_devices, not a Device"
                yield Device(plugin, None, f"plugin {plugin}", unavailable=Unavailable("plugin-error", msg), plugin=plugin)
                continue
            yield dataclasses.replace(d, plugin=plugin)


def null_devices() -> list[Device]:
    """Every compile-only device (``null:ARCH``) that installed backends offer, in plugin order."""
    out: list[Device] = []
    for plugin, result in host().call_each("poot_null_devices"):
        if isinstance(result, Exception):
            continue  # a backend whose null devices fail is simply without them; `poot plugins` shows why it failed to load
        out.extend(dataclasses.replace(d, plugin=plugin) for d in result or () if isinstance(d, Device) and d.kind == NULL_KIND)
    return out


def get_device(name: str | None = None, devices: list[Device] | None = None) -> Device:
    """The available device called ``name`` (else ``POOT_DEVICE``, else cpu); ``null:ARCH`` is a
    backend's compile-only device (``null_devices``).

    Raises ``UnknownDevice`` (listing the known names) or ``DeviceUnavailable`` (with the reason).
    """
    wanted = normalize_name(name or os.environ.get("POOT_DEVICE") or DEFAULT_DEVICE)
    if wanted.split(":", 1)[0] == NULL_KIND and devices is None:
        nulls = null_devices()
        found = [d for d in nulls if d.name.lower() == wanted]
        if not found:
            known = ", ".join(d.name for d in nulls) or "none (no GPU backend plugin is installed)"
            raise UnknownDevice(f"unknown compile-only device '{wanted}'. Known: {known}")
        return found[0]
    kind = wanted.split(":", 1)[0]
    if devices is None:  # plugins probed in order until the device turns up (cpu: no GPU plugin is asked)
        devices = []
        for d in _each_device():
            devices.append(d)
            if d.available() and (d.name.lower() == wanted or (":" not in wanted and d.kind == kind)):
                return d
    exact = [d for d in devices if d.name.lower() == wanted]
    if not exact and ":" not in wanted:
        exact = [d for d in devices if d.kind == kind and d.available()] or [d for d in devices if d.kind == kind]
    if exact:
        d = exact[0]
        if not d.available():
            raise DeviceUnavailable(f"device {d.name} cannot run here: {d.unavailable}")
        return d
    same_kind = [d for d in devices if d.kind == kind]
    if same_kind:
        reasons = "; ".join(f"{d.name}: {d.available()}" for d in same_kind)
        raise DeviceUnavailable(f"no device {wanted}: {reasons}")
    known = ", ".join(sorted({d.name for d in devices})) or "none"
    raise UnknownDevice(f"unknown device '{wanted}'. Known devices: {known}. Run `poot devices` to see which can run here.")
