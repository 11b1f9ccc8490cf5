"""Codegen: Kernel IR -> LLVM IR -> host object | PTX | AMDGPU code object | SPIR-V, as named stages."""

from .compile import Artifact, CompileError, compile_kernel, compile_kernels
from .lower import lower_kernel
from .targets import TARGETS, Target, host_target, shared_layout, spirv_target, target

__all__ = [
    "Artifact",
    "CompileError",
    "compile_kernel",
    "compile_kernels",
    "lower_kernel",
    "TARGETS",
    "Target",
    "host_target",
    "shared_layout",
    "spirv_target",
    "target",
]
