"""Entry point of poot-cpu: registers the host device."""

from poot import hookimpl
from poot.runtime import Device

from .device import host_device


@hookimpl
def poot_devices() -> list[Device]:
    return [host_device()]
