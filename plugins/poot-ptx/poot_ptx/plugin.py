"""Entry point of poot-ptx: registers the CUDA devices found by the driver."""

from poot import hookimpl
from poot.runtime import Device

from .device import cuda_devices


@hookimpl
def poot_devices() -> list[Device]:
    return cuda_devices()
