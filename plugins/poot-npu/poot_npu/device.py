"""NPUs found through the Linux accel subsystem (/sys/class/accel): amdxdna (AMD XDNA2) and
intel_vpu (Intel NPU4), each with the runtime library it is driven through (XRT's
``libxrt_coreutil`` for XDNA2, Level Zero's ``libze_loader`` for NPU4) and, for XDNA2, the AIE
toolchain that compiles its kernels. A device is reported with the first thing missing, in that
order; one with everything is still not offered while poot-npu has no executor for it. The
compile-only ``null:xdna2`` plans and compiles for an XDNA2 NPU that is not there."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from poot.backend import Capabilities, Device, Unavailable

__all__ = ["npu_devices", "null_devices", "runtime_library", "DRIVERS", "RUNTIMES"]

# kernel driver -> (device name, description)
DRIVERS = {"amdxdna": ("xdna2", "AMD XDNA2 NPU"), "intel_vpu": ("npu4", "Intel NPU4")}
# device name -> (library, what installs it)
RUNTIMES = {
    "xdna2": ("xrt_coreutil", "XRT with its amdxdna plugin (the xdna-driver project's packages), or set XILINX_XRT"),
    "npu4": ("ze_loader", "the Level Zero loader (apt install libze1) and Intel's NPU user-mode driver (intel-level-zero-npu)"),
}
ACCEL = Path("/sys/class/accel")


def _driver_of(node: Path) -> str:
    try:
        return (node / "device" / "driver").resolve().name
    except OSError:
        return ""


def runtime_library(key: str) -> str | None:
    """The runtime library an NPU is driven through, where it loads; None where it does not."""
    lib, _ = RUNTIMES[key]
    names = [ctypes.util.find_library(lib)]
    if key == "xdna2" and os.environ.get("XILINX_XRT"):
        names.insert(0, str(Path(os.environ["XILINX_XRT"]) / "lib" / f"lib{lib}.so"))
    for name in names:
        if name:
            try:
                ctypes.CDLL(name)
                return name
            except OSError:
                continue
    return None


def npu_devices(accel: Path = ACCEL) -> list[Device]:
    found = {}
    for node in sorted(accel.glob("accel*")) if accel.exists() else []:
        drv = _driver_of(node)
        if drv in DRIVERS:
            found[DRIVERS[drv][0]] = (drv, node)
    out = []
    for drv, (key, desc) in DRIVERS.items():
        if key not in found:
            why = Unavailable(
                "no-driver", f"no NPU driver: no {drv} device under {accel} (this machine has no {desc}, or its {drv} kernel module is not loaded)"
            )
        elif runtime_library(key) is None:
            why = Unavailable(
                "no-driver",
                f"{desc} found at /dev/accel/{found[key][1].name}, but its runtime (lib{RUNTIMES[key][0]}) is not installed: install {RUNTIMES[key][1]}",
            )
        elif key == "xdna2" and _toolchain() is None:
            from .toolchain import INSTALL

            why = Unavailable("unsupported", f"{desc} found at /dev/accel/{found[key][1].name}, but no AIE toolchain compiles its kernels: {INSTALL}")
        elif key == "npu4":
            why = Unavailable(
                "unsupported",
                f"{desc} found at /dev/accel/{found[key][1].name}, but poot has no compiler for it (Intel's NPU takes kernels only through its driver's graph compiler)",
            )
        else:
            why = Unavailable("unsupported", f"{desc} found at /dev/accel/{found[key][1].name}, but poot-npu has no executor for it yet")
        out.append(Device("npu", key, desc, target=None, unavailable=why))
    return out


def _toolchain():  # type: ignore[no-untyped-def]
    from .toolchain import find_toolchain

    return find_toolchain()


def null_devices() -> list[Device]:
    """``null:xdna2``: an XDNA2 NPU's cores as the planner sees them (AIE2P: one instruction stream
    a core, no subgroups, 64 KiB of data memory, f32/bf16/int8 arithmetic, halves converted), for ``poot plan``."""
    from .targets import CORE_MEMORY

    caps = Capabilities(
        dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "bool"}),  # halves in scalar code (the host's launches read the f16 KV cache)
        compute_units=32,
        max_workgroup_size=256,
        shared_memory_bytes=CORE_MEMORY,
        subgroup_size=1,
        subgroup_ops=False,
        memory_bytes=0,
        details=(("arch", "aie2p"), ("compile only", "yes")),
    )
    return [Device("null", "xdna2", "compile-only AMD XDNA2 NPU (aie2p): plans and AIE stages, no hardware", target="aie", capabilities=caps)]
