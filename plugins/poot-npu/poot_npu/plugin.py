"""Entry point of poot-npu: registers the NPUs the kernel's accel drivers expose."""

from poot import hookimpl
from poot.backend import Device

from .device import npu_devices


@hookimpl
def poot_devices() -> list[Device]:
    return npu_devices()
