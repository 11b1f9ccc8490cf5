"""Entry point of poot-wgpu: registers the WebGPU adapters that can run compute."""

from poot import hookimpl
from poot.runtime import Device

from .device import wgpu_devices


@hookimpl
def poot_devices() -> list[Device]:
    return wgpu_devices()
