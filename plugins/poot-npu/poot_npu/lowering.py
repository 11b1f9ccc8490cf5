"""Kernel IR -> LLVM IR for an AIE core: the kernel in its looped form (``grid_to_loops``: its
workgroups and threads as loops in one thread of work, its workgroup arrays in the core's data
memory), then the generic lowering, which has no thread or workgroup ids left to ask the target
for. The entry point takes the kernel's parameters and the looped form's ``GROUPS``."""

from __future__ import annotations

from poot.backend import Kernel, KernelLowering, grid_to_loops

__all__ = ["AieLowering"]


class AieLowering(KernelLowering):
    def __init__(self, k: Kernel, tgt) -> None:  # type: ignore[no-untyped-def]
        super().__init__(grid_to_loops(k), tgt)
