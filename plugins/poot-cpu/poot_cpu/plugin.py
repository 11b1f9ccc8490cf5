"""Entry point of poot-cpu: registers the host device and its executor."""

from typing import Any

from poot import hookimpl
from poot.backend import Device

from .device import host_device


@hookimpl
def poot_devices() -> list[Device]:
    return [host_device()]


@hookimpl
def poot_codegen_target(device: Device) -> Any:
    if device.kind != "cpu":  # another plugin's host-target device compiles for its own host target
        return None
    from poot.backend import host_target

    return host_target()


@hookimpl
def poot_executor(device: Device) -> Any:
    if device.kind != "cpu":
        return None
    from .executor import HostExecutor

    return HostExecutor
