"""Entry point of poot-npu: registers the NPUs the kernel's accel drivers expose and the
compile-only ``null:xdna2``, brings the AIE targets, plans an NPU's products and norms for it (the
rest on the host CPU), reports its compile stages in ``poot plan``, and runs the kernel tests on
``null:xdna2`` in the looped form its cores would run, on the host."""

from typing import Any

from poot import hookimpl
from poot.backend import Device

from .device import npu_devices, null_devices


@hookimpl
def poot_devices() -> list[Device]:
    return npu_devices()


@hookimpl
def poot_null_devices() -> list[Device]:
    return null_devices()


@hookimpl
def poot_targets() -> list:  # type: ignore[type-arg]
    from .targets import TARGETS

    return list(TARGETS.values())


@hookimpl
def poot_codegen_target(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "aie":
        return None
    from .targets import TARGETS

    arch = dict(device.capabilities.details).get("arch", "") if device.capabilities else ""
    return TARGETS.get(f"aie:{arch}")


@hookimpl
def poot_plan_schedules(device: Device):  # type: ignore[no-untyped-def]
    if device.target != "aie":
        return None
    from .offload import NpuSchedules

    return NpuSchedules


@hookimpl
def poot_plan_report(device: Device, plan: Any, env: Any, compile: bool):  # type: ignore[no-untyped-def]
    if device.target != "aie":
        return None
    from .offload import report

    return report(plan, env, poot_codegen_target(device), compile)


@hookimpl
def poot_kernel_runner(device: Device):  # type: ignore[no-untyped-def]
    if device.kind != "null" or device.target != "aie":
        return None
    from .runner import run_looped

    return run_looped
