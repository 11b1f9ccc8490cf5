"""Entry point of poot-rocm: registers the HIP devices found by the runtime."""

from poot import hookimpl
from poot.runtime import Device

from .device import rocm_devices


@hookimpl
def poot_devices() -> list[Device]:
    return rocm_devices()
