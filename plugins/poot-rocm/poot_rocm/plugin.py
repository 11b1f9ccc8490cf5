"""Entry point of poot-rocm: registers the HIP devices found by the runtime."""

from poot import hookimpl
from poot.backend import Device

from .device import null_devices, rocm_devices


@hookimpl
def poot_devices() -> list[Device]:
    return rocm_devices()


@hookimpl
def poot_null_devices() -> list[Device]:
    return null_devices()


@hookimpl
def poot_targets() -> list:  # type: ignore[type-arg]
    from .targets import TARGETS

    return list(TARGETS.values())


@hookimpl
def poot_codegen_target(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "amdgcn":
        return None
    from .targets import TARGETS

    arch = dict(device.capabilities.details).get("arch", "") if device.capabilities else ""
    return TARGETS.get(f"amdgcn:{arch}")
