"""Entry point of poot-rocm: registers the AMD GPUs HIP finds and the compile-only AMD devices,
brings the AMDGCN targets, runs plans on a GPU through the AQL executor, and runs single kernels
for the kernel tests (on a GPU; on a compile-only device, compiled, linked and read back)."""

from poot import hookimpl
from poot.backend import Device

from .device import null_devices, rocm_devices


@hookimpl
def poot_devices() -> list[Device]:
    return rocm_devices()


@hookimpl
def poot_null_devices() -> list[Device]:
    return null_devices()


@hookimpl
def poot_targets() -> list:  # type: ignore[type-arg]
    from .targets import TARGETS

    return list(TARGETS.values())


@hookimpl
def poot_codegen_target(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "amdgcn":
        return None
    from .targets import TARGETS

    arch = dict(device.capabilities.details).get("arch", "") if device.capabilities else ""
    return TARGETS.get(f"amdgcn:{arch}")


@hookimpl
def poot_executor(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "rocm":
        return None
    from .executor import RocmExecutor

    return RocmExecutor


@hookimpl
def poot_kernel_runner(device: Device):  # type: ignore[no-untyped-def]
    if device.kind == "null" and device.target == "amdgcn":
        from .kernel_runner import linker

        return linker(str(device.index))
    if device.kind != "rocm":
        return None
    from .kernel_runner import run_rocm

    return run_rocm(device)
