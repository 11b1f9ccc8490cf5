"""NPUs found through the Linux accel subsystem (/sys/class/accel): amdxdna (AMD XDNA2) and
intel_vpu (Intel NPU4)."""

from __future__ import annotations

from pathlib import Path

from poot.backend import Device, Unavailable

__all__ = ["npu_devices", "DRIVERS"]

# kernel driver -> (device name, description)
DRIVERS = {"amdxdna": ("xdna2", "AMD XDNA2 NPU"), "intel_vpu": ("npu4", "Intel NPU4")}
ACCEL = Path("/sys/class/accel")


def _driver_of(node: Path) -> str:
    try:
        return (node / "device" / "driver").resolve().name
    except OSError:
        return ""


def npu_devices(accel: Path = ACCEL) -> list[Device]:
    found = {}
    for node in sorted(accel.glob("accel*")) if accel.exists() else []:
        drv = _driver_of(node)
        if drv in DRIVERS:
            found[DRIVERS[drv][0]] = (drv, node)
    out = []
    for drv, (key, desc) in DRIVERS.items():
        if key in found:
            why = Unavailable("unsupported", f"{desc} found at /dev/accel/{found[key][1].name}, but poot-npu has no executor for it yet")
        else:
            why = Unavailable(
                "no-driver", f"no NPU driver: no {drv} device under {accel} (this machine has no {desc}, or its {drv} kernel module is not loaded)"
            )
        out.append(Device("npu", key, desc, target=None, unavailable=why))
    return out
