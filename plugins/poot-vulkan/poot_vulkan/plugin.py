"""Entry point of poot-vulkan: registers the Vulkan physical devices."""

from poot import hookimpl
from poot.runtime import Device

from .device import vulkan_devices


@hookimpl
def poot_devices() -> list[Device]:
    return vulkan_devices()
