"""Loading host-target artifacts into this process and running their grids.

The object file from the worker is linked into this process by LLVM's ORC JIT with JITLink, each
kernel its own JIT library (MCJIT on Windows, where llvmlite has no JITLink), and the kernel's grid
entry point becomes a ctypes function. JITLink places all of an object's sections in one block: the
code reaches its constants by 32-bit PC-relative offsets, and MCJIT's loader, which maps each section
apart, could place them gigabytes apart in a process with large mappings around (a GPU driver's, a
model's) and then aborted the process.
``ctypes`` calls release the GIL, so Python threads run ranges of workgroups in parallel.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import PootError
from ..graph import dtypes as dt
from ..kernel.ir import Buffer, Kernel
from .compile import Artifact

__all__ = ["HostKernel"]

_CTYPES = {"f32": ctypes.c_float, "f64": ctypes.c_double, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "i8": ctypes.c_int8, "u8": ctypes.c_uint8}


class HostKernel:
    """A compiled host kernel: ``run(grid, buffers=..., scalars=...)``."""

    def __init__(self, kernel: Kernel, artifact: Artifact) -> None:
        import llvmlite.binding as llvm

        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        self.kernel = kernel
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3, reloc="pic")
        packed = f"{kernel.name}_packed"  # for native launch chains: every host lowering emits it
        try:
            jit = llvm.create_lljit_compiler(tm, use_jit_link=True)
        except RuntimeError:  # llvmlite has no JITLink on Windows: MCJIT there (COFF objects, no such layouts)
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(artifact.data))
            self._engine.finalize_object()
            addr, self.packed_address = self._engine.get_function_address(kernel.name), self._engine.get_function_address(packed)
        else:
            lib = llvm.JITLibraryBuilder().add_object_img(artifact.data).add_current_process()
            try:
                # the library holds its JIT; addresses stay valid while this object holds the library
                self._library = lib.export_symbol(kernel.name).export_symbol(packed).link(jit, kernel.name)
            except RuntimeError as e:
                raise PootError(
                    f"kernel {kernel.name}: its object file could not be loaded into this process ({e}; LLVM's diagnostics are on stderr)"
                ) from None
            addr, self.packed_address = self._library[kernel.name], self._library[packed]
        if not addr:
            raise PootError(f"kernel {kernel.name}: the object file has no entry point")
        argtypes = [ctypes.c_void_p if isinstance(p, Buffer) else _CTYPES[p.dtype.name] for p in kernel.params] + [ctypes.c_int32] * 5
        self._fn = ctypes.CFUNCTYPE(None, *argtypes)(addr)

    def run(self, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, float | int] | None = None, threads: int = 1) -> None:
        scalars = scalars or {}
        args: list[object] = []
        for p in self.kernel.params:
            if isinstance(p, Buffer):
                a = buffers[p.name]
                want = np.dtype(np.uint8 if p.dtype == dt.boolean else p.dtype.numpy if p.dtype != dt.bf16 else np.uint16)
                if a.dtype != want or not a.flags.c_contiguous:
                    raise PootError(f"kernel {self.kernel.name}: buffer '{p.name}' must be a C-contiguous {want} array, got {a.dtype}")
                if not p.readonly and not a.flags.writeable:
                    raise PootError(f"kernel {self.kernel.name}: buffer '{p.name}' is written and must be writeable")
                args.append(a.ctypes.data)
            else:
                args.append(scalars[p.name])
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        total = gx * gy * gz
        if threads <= 1 or total < 2:
            self._fn(*args, gx, gy, gz, 0, total)
            return
        step = -(-total // threads)
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda s: self._fn(*args, gx, gy, gz, s, min(total, s + step)), range(0, total, step)))
