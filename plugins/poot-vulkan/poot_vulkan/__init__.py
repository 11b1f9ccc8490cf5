"""poot-vulkan: any Vulkan 1.3 GPU through SPIR-V compute pipelines, on the `vulkan` (cffi) binding."""

from .device import vulkan_devices

__all__ = ["vulkan_devices"]
