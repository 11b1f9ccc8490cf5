"""Entry point of poot-vulkan: registers the Vulkan physical devices, runs single kernels on them for
the kernel tests, and runs plans on them (``VulkanExecutor``)."""

from poot import hookimpl
from poot.runtime import Device

from .device import vulkan_devices


@hookimpl
def poot_devices() -> list[Device]:
    return vulkan_devices()


@hookimpl
def poot_kernel_runner(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "vulkan" or not isinstance(device.index, int):
        return None
    from .runtime import VulkanDevice, kernel_runner

    return kernel_runner(VulkanDevice(device.index))


@hookimpl
def poot_executor(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "vulkan":
        return None
    from .executor import VulkanExecutor

    return VulkanExecutor
