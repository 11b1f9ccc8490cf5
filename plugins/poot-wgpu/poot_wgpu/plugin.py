"""Entry point of poot-wgpu: registers the WebGPU adapters that can run compute, runs single kernels
on them for the kernel tests, and runs plans on them (``WgpuExecutor``)."""

from poot import hookimpl
from poot.backend import Device

from .device import wgpu_devices


@hookimpl
def poot_devices() -> list[Device]:
    return wgpu_devices()


@hookimpl
def poot_codegen_target(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "spirv":
        return None
    from poot.backend import spirv_target_for

    return spirv_target_for(device.capabilities)


@hookimpl
def poot_kernel_runner(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "wgpu" or not isinstance(device.index, int):
        return None
    from .runtime import WgpuDevice, kernel_runner

    return kernel_runner(WgpuDevice(device.index))


@hookimpl
def poot_executor(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "wgpu":
        return None
    from .executor import WgpuExecutor

    return WgpuExecutor
