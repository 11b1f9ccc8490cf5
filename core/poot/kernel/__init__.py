"""Kernel IR, its verifier, and the ``@kernel`` front end."""

from ..graph.dtypes import bf16, boolean, f16, f32, i8, i32, i64, u8
from .frontend import Const, In, KernelSyntaxError, KernelTemplate, Out, kernel
from .ir import Kernel
from .verify import KernelError, verify_kernel

__all__ = ["kernel", "KernelTemplate", "KernelSyntaxError", "Kernel", "KernelError", "verify_kernel", "In", "Out", "Const",
           "f32", "f16", "bf16", "i32", "i64", "i8", "u8", "boolean"]
