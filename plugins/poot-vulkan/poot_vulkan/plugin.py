"""Entry point of poot-vulkan: registers the Vulkan physical devices, runs single kernels on them for
the kernel tests, and runs plans on them (``VulkanExecutor``)."""

from poot import hookimpl
from poot.backend import Device

from .device import vulkan_devices


@hookimpl
def poot_devices() -> list[Device]:
    return vulkan_devices()


@hookimpl
def poot_null_devices() -> list[Device]:
    from .device import null_device

    return [null_device()]


@hookimpl
def poot_codegen_target(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "spirv":
        return None
    from poot.backend import spirv_target_for

    return spirv_target_for(device.capabilities)


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
