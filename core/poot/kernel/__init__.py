"""Kernel IR, its verifier, and the ``@kernel`` front end."""

import sys as _sys
import types as _types

from ..graph.dtypes import bf16, boolean, f16, f32, i8, i32, i64, u8
from .frontend import Const, In, InlineFunction, KernelSyntaxError, KernelTemplate, Out, inline, kernel
from .ir import Kernel
from .verify import KernelError, verify_kernel


class _CallableModule(_types.ModuleType):
    """``@poot.kernel`` decorates kernels while ``poot.kernel`` stays the package of the kernel layer."""

    def __call__(self, fn=None, **options):  # type: ignore[no-untyped-def]
        return kernel(fn, **options)


_sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "kernel",
    "inline",
    "InlineFunction",
    "KernelTemplate",
    "KernelSyntaxError",
    "Kernel",
    "KernelError",
    "verify_kernel",
    "In",
    "Out",
    "Const",
    "f32",
    "f16",
    "bf16",
    "i32",
    "i64",
    "i8",
    "u8",
    "boolean",
]
