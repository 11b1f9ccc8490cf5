"""Entry point of poot-ptx: registers the CUDA devices found by the driver and the compile-only
NVIDIA devices, brings the nvptx targets and NVIDIA's plan schedules, and runs single kernels for
the kernel tests (on a GPU; on a compile-only device, compiled and assembled by ptxas)."""

from poot import hookimpl
from poot.backend import Device

from .device import cuda_devices, null_devices


@hookimpl
def poot_devices() -> list[Device]:
    return cuda_devices()


@hookimpl
def poot_null_devices() -> list[Device]:
    return null_devices()


@hookimpl
def poot_targets() -> list:  # type: ignore[type-arg]
    from .targets import TARGETS

    return list(TARGETS.values())


@hookimpl
def poot_codegen_target(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "nvptx":
        return None
    from .runtime import target_for
    from .targets import TARGETS

    return TARGETS[target_for(device)]


@hookimpl
def poot_plan_schedules(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "nvptx":
        return None
    from .schedules import NvidiaSchedules

    return NvidiaSchedules


@hookimpl
def poot_kernel_runner(device: Device):  # type: ignore[no-untyped-def]
    if device.kind == "null" and device.target == "nvptx":
        from .assembler import assembler

        return assembler(str(device.index))
    if device.kind != "cuda":
        return None
    from .runtime import run_cuda

    return run_cuda(device)


@hookimpl
def poot_executor(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "cuda":
        return None
    from .executor import CudaExecutor

    return CudaExecutor
