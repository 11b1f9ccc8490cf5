"""The backend SDK: everything a device plugin needs from the core, in one documented module.

A backend plugin (``poot-cpu``, ``poot-ptx``, ``poot-vulkan``, a third party's) imports from here,
from ``poot`` itself (``hookimpl``, the errors) and from ``poot.errors``; the core's other modules
are its internals and may change. ``tests/test_import_contract.py`` checks that every plugin in this
repository keeps to that, and that the core imports no plugin.

What is here, by the stage it serves:

- devices: ``Device``, ``Capabilities``, ``Unavailable``, ``get_device``;
- plans and their storage: ``Plan``, ``WANT_LOGPROBS`` (the symbol that leaves the log-probability
  launch out), ``StoragePlan``, ``plan_storage``, ``storage_dtype``,
  ``stored_nbytes``, ``weight_array``, ``weight_dtype``, ``WeightLayout`` and ``as_read`` (a
  weight as the plan reads it, in ``Plan.layouts``' layout where it names one), and the region helpers executors share
  (``checked_pool``, ``checked_weight``, ``computed_outputs``, ``require_pools``, ``scalar_block``,
  ``value_region``, ``EAGER_READBACK``);
- executing: ``Executor`` (the contract), ``Peak`` (what ``Executor.peak`` returns), ``compile_progress``, ``Assembled`` (what a compile-only
  device's kernel runner raises once a test's kernel is compiled and assembled);
- Kernel IR and codegen: ``Kernel``, ``Buffer``, ``kir`` (the Kernel IR module: its expressions
  and statements), ``TargetStmt`` (the base of a target's own statements, checked through a
  ``StmtCheck``), ``verify_kernel``, ``KernelLowering`` (the generic lowering a target subclasses)
  and ``lower_kernel`` (Kernel IR to an LLVM module for a target), ``grid_to_loops`` (a kernel as
  one thread of work over a range of its workgroups, with ``group_range``/``GROUPS``),
  ``target``/``backend_targets`` (targets by name), ``CompileError``, ``dtypes``, ``kernel``/``Out``/``i32`` (the kernel
  language), ``movement`` (the copy kernels), ``uses_subgroups``, ``compile_kernel`` (``compile_kernels``: many at once), ``Target``,
  ``TARGETS``, ``host_target``, ``spirv_target``, ``spirv_target_for`` (a device's SPIR-V target), ``shared_layout``, ``CODEGEN_VERSION``,
  ``HostKernel`` (a host object loaded in-process), and SPIR-V's binding layout (``SPIRV_ENTRY``,
  ``SPIRV_SCALARS``, ``spirv_bindings``, ``spirv_scalar_words``, ``spirv_for_wgpu``);
- the kernel cache's folder: ``cache_dir``.

Two more public modules serve a backend that brings schedules of its own: ``poot.plan.schedules``
(``Schedules``, returned by ``poot_plan_schedules``, and the planning names its launches are built
from) and ``poot.kernel.build`` (the helpers its Kernel IR kernels are written with).

Names load on first use, so a plugin's entry point that imports only ``Device`` does not pull in
LLVM.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, attribute)
_EXPORTS: dict[str, tuple[str, str]] = {
    # devices
    "Device": ("poot.runtime.device", "Device"),
    "Capabilities": ("poot.runtime.device", "Capabilities"),
    "Unavailable": ("poot.runtime.device", "Unavailable"),
    "get_device": ("poot.runtime.devices", "get_device"),
    # plans and storage
    "Plan": ("poot.plan.plan", "Plan"),
    "WANT_LOGPROBS": ("poot.plan.plan", "WANT_LOGPROBS"),
    "StoragePlan": ("poot.plan.memory", "StoragePlan"),
    "plan_storage": ("poot.plan.memory", "plan_storage"),
    "storage_dtype": ("poot.plan.memory", "storage_dtype"),
    "stored_nbytes": ("poot.plan.memory", "stored_nbytes"),
    "weight_array": ("poot.plan.memory", "weight_array"),
    "weight_dtype": ("poot.plan.memory", "weight_dtype"),
    "WeightLayout": ("poot.plan.layouts", "WeightLayout"),
    "as_read": ("poot.plan.layouts", "as_read"),
    "EAGER_READBACK": ("poot.runtime.regions", "EAGER_READBACK"),
    "checked_pool": ("poot.runtime.regions", "checked_pool"),
    "checked_weight": ("poot.runtime.regions", "checked_weight"),
    "computed_outputs": ("poot.runtime.regions", "computed_outputs"),
    "require_pools": ("poot.runtime.regions", "require_pools"),
    "scalar_block": ("poot.runtime.regions", "scalar_block"),
    "value_region": ("poot.runtime.regions", "value_region"),
    # executing
    "Executor": ("poot.runtime.executor", "Executor"),
    "Peak": ("poot.runtime.executor", "Peak"),
    "Assembled": ("poot.testing.kernels", "Assembled"),
    "compile_progress": ("poot.runtime.progress", "compile_progress"),
    # Kernel IR and codegen
    "Kernel": ("poot.kernel.ir", "Kernel"),
    "kir": ("poot.kernel", "ir"),
    "TargetStmt": ("poot.kernel.ir", "TargetStmt"),
    "StmtCheck": ("poot.kernel.verify", "StmtCheck"),
    "verify_kernel": ("poot.kernel.verify", "verify_kernel"),
    "KernelLowering": ("poot.codegen.lower", "KernelLowering"),
    "lower_kernel": ("poot.codegen.lower", "lower_kernel"),
    "grid_to_loops": ("poot.kernel.loops", "grid_to_loops"),
    "group_range": ("poot.kernel.loops", "group_range"),
    "GROUPS": ("poot.kernel.loops", "GROUPS"),
    "CompileError": ("poot.codegen.compile", "CompileError"),
    "target": ("poot.codegen.targets", "target"),
    "backend_targets": ("poot.codegen.targets", "backend_targets"),
    "Buffer": ("poot.kernel.ir", "Buffer"),
    "dtypes": ("poot.graph", "dtypes"),
    "kernel": ("poot.kernel", "kernel"),
    "Out": ("poot.kernel", "Out"),
    "i32": ("poot.kernel", "i32"),
    "movement": ("poot.kernel.library", "movement"),
    "uses_subgroups": ("poot.kernel.verify", "uses_subgroups"),
    "compile_kernel": ("poot.codegen", "compile_kernel"),
    "compile_kernels": ("poot.codegen", "compile_kernels"),
    "Target": ("poot.codegen", "Target"),
    "TARGETS": ("poot.codegen", "TARGETS"),
    "host_target": ("poot.codegen", "host_target"),
    "spirv_target": ("poot.codegen", "spirv_target"),
    "spirv_target_for": ("poot.codegen.targets", "spirv_target_for"),
    "shared_layout": ("poot.codegen", "shared_layout"),
    "CODEGEN_VERSION": ("poot.codegen.compile", "CODEGEN_VERSION"),
    "HostKernel": ("poot.codegen.host_jit", "HostKernel"),
    "SPIRV_ENTRY": ("poot.codegen.spirv", "ENTRY"),
    "SPIRV_SCALARS": ("poot.codegen.spirv", "SCALARS"),
    "spirv_bindings": ("poot.codegen.spirv", "bindings"),
    "spirv_scalar_words": ("poot.codegen.spirv", "scalar_words"),
    "spirv_for_wgpu": ("poot.codegen.spirv", "for_wgpu"),
    # caches
    "cache_dir": ("poot.load.sources", "cache_dir"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'poot.backend' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
