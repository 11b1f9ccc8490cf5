"""Hook specifications: the things a plugin can give poot (devices, compile-only devices, codegen
targets, executors, kernel runners, model families, quantizations).

A plugin is a module (or object) with functions named like these hooks and marked with
``poot.hookimpl``; it is found through the ``poot`` entry-point group of its package::

    [project.entry-points.poot]
    mydevice = "my_package.plugin"

Hooks are checked when a plugin registers: an implementation whose name or arguments do not match a
spec below is rejected with the plugin's name, before any call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from .models.family import ModelFamily
    from .quant.descriptor import Quantization
    from .runtime.device import Device

__all__ = ["hookspec", "hookimpl", "PROJECT"]

PROJECT = "poot"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -------------------------------------------------------------------------------------------------
# devices and executors
# -------------------------------------------------------------------------------------------------


@hookspec
def poot_devices() -> "list[Device]":
    """Return the devices this plugin offers on this machine.

    Called once per plugin when devices are listed or one is looked up by name. Probe with the real
    binding; a device that cannot run here is still returned, with ``available()`` giving the typed
    reason (no driver, no device, wrong architecture). A backend that finds no device at all returns
    one placeholder ``Device`` of its kind (index ``None``) whose reason says why, so that
    ``poot devices`` can tell the user. Never raise for a missing driver.
    """


@hookspec(firstresult=True)
def poot_executor(device: "Device") -> Any:
    """Return an Executor for ``device`` if this plugin owns it, else None.

    Called when a plan is loaded onto a device. Stops at first non-None result.
    """


@hookspec
def poot_null_devices() -> "list[Device]":
    """Return compile-only devices: a target this plugin compiles for, with the capabilities of a
    real device of it (``Device("null", "vulkan", ...)``) and no hardware behind it.

    ``poot plan MODEL --device null:ARCH`` plans (and with ``--compile`` compiles) a model for the
    target on any machine, as tinygrad's null device and IREE's null driver do; nothing runs there.
    """


@hookspec(firstresult=True)
def poot_codegen_target(device: "Device") -> Any:
    """Return the codegen ``Target`` (``poot.backend.Target``) this plugin compiles ``device``'s
    kernels for (its own devices and its null devices), or None if the device is not this plugin's.
    """


@hookspec
def poot_targets() -> "list[Any]":
    """Return the codegen ``Target`` objects this plugin brings, by name (``amdgcn:gfx942``,
    ``amdgcn:gfx1100``): each names its LLVM triple, CPU and features, the lowering class that turns
    Kernel IR into LLVM IR for it (``Target.lowering``, a ``poot.backend.KernelLowering``
    subclass) and, where the emitted object needs one, the step that makes it an artifact
    (``Target.link``). ``poot.backend.target(name)`` finds them here.
    """


@hookspec(firstresult=True)
def poot_plan_schedules(device: "Device") -> Any:
    """Return the ``Schedules`` subclass (``poot.plan.schedules``) whose choices plan ``device``'s
    GPU plans (its own kernels for many-row products and long prompts, how its GEMVs read x, its
    passes over the finished plan), or None to plan it with the generic GPU schedules alone.
    """


@hookspec(firstresult=True)
def poot_plan_report(device: "Device", plan: Any, env: Any, compile: bool) -> Any:
    """Return what ``poot plan`` prints after the plan's listing for ``device`` (the launches an
    offloading device takes, how far its compile stages go, where they stop and why), or None. With
    ``compile`` (``poot plan --compile``) the backend compiles what it takes itself, and the other
    launches are compiled for the host.
    """


@hookspec(firstresult=True)
def poot_kernel_runner(device: "Device") -> Any:
    """Return ``run(kernel, grid, buffers, scalars)`` that runs one Kernel IR kernel on ``device``
    with numpy arrays in and out (outputs copied back into the arrays given), or None.

    Used by the kernel tests: ``POOT_TEST_DEVICE=cuda:0 pytest tests/test_kernels_host.py`` checks
    every synthesized kernel on that device against the CPU oracle.
    """


# -------------------------------------------------------------------------------------------------
# model families
# -------------------------------------------------------------------------------------------------


@hookspec
def poot_model_families() -> "list[ModelFamily]":
    """Return the model families this plugin serves.

    Called once when a model is opened or families are listed. A family says which architectures it
    serves (GGUF ``general.architecture`` and HF ``architectures``); the first family that claims an
    architecture serves it.
    """


# -------------------------------------------------------------------------------------------------
# quantizations
# -------------------------------------------------------------------------------------------------


@hookspec
def poot_quantizations() -> "list[Quantization]":
    """Return the packed quantization descriptors this plugin defines.

    Called once when the quantization registry is first used. The core registers its own types
    (F32, F16, BF16, Q4_0, ... MXFP4) through this same hook. Two plugins defining the same name is
    an error naming both.
    """
