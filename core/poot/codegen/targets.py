"""Targets as data: what each LLVM backend needs to lower Kernel IR (facts: shared/TARGETS.md).

Every target compiles with no hardware present. ``subgroup`` is the subgroup width kernels see
(1 on the host, where a workgroup's threads run as a loop on one core and LLVM vectorises the loop).
A Vulkan device's subgroup width is the driver's (8 on lavapipe, 32 on NVIDIA, 64 or 32 on AMD):
``spirv_target(n)`` is the SPIR-V target whose kernels may use subgroup operations of that width;
``spirv:vulkan1.3`` (width 1) is the one that serves every Vulkan device and uses none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..errors import Refusal

if TYPE_CHECKING:
    from ..kernel.ir import Kernel

__all__ = ["Target", "TARGETS", "target", "host_target", "spirv_target", "shared_layout", "SHARED_ALIGN"]


@dataclass(frozen=True)
class Target:
    name: str  # "host" | "nvptx" | "amdgcn" | "spirv"
    triple: str
    cpu: str
    features: str = ""
    global_as: int = 0
    shared_as: int = 0
    subgroup: int = 1
    max_threads: int = 1024
    max_shared: int = 1 << 30
    artifact: str = "object"  # object | ptx | code-object | spirv
    matrix: tuple[str, ...] = ()
    # workgroup memory a kernel may declare statically; beyond it (up to max_shared) its arrays are
    # placed in the launch's dynamic workgroup memory (``shared_layout``). None: max_shared
    static_shared: int | None = None

    @property
    def key(self) -> str:
        """Short name for messages (and compile-cache keys): 'host:znver4', 'nvptx:sm_90', 'spirv:subgroup32'."""
        if self.name == "spirv" and self.subgroup > 1:
            return f"spirv:subgroup{self.subgroup}"
        return f"{self.name}:{self.cpu}" if self.cpu else self.name


def host_target() -> Target:
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    feats = llvm.get_host_cpu_features().flatten()
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), feats, 0, 0, 1, 1024, 1 << 30, "object")


TARGETS: dict[str, Target] = {
    "nvptx:sm_80": Target("nvptx", "nvptx64-nvidia-cuda", "sm_80", "+ptx78", 1, 3, 32, 1024, 48 * 1024, "ptx", ("mma.sync",)),
    "nvptx:sm_90": Target("nvptx", "nvptx64-nvidia-cuda", "sm_90", "+ptx80", 1, 3, 32, 1024, 48 * 1024, "ptx", ("mma.sync",)),
    # a Hopper SM gives a workgroup up to 227 KiB, past the 48 KiB PTX declares statically
    "nvptx:sm_90a": Target("nvptx", "nvptx64-nvidia-cuda", "sm_90a", "+ptx80", 1, 3, 32, 1024, 227 * 1024, "ptx", ("mma.sync", "wgmma"), 48 * 1024),
    "amdgcn:gfx90a": Target("amdgcn", "amdgcn-amd-amdhsa", "gfx90a", "", 1, 3, 64, 1024, 64 * 1024, "code-object", ("mfma",)),
    "amdgcn:gfx942": Target("amdgcn", "amdgcn-amd-amdhsa", "gfx942", "", 1, 3, 64, 1024, 64 * 1024, "code-object", ("mfma",)),
    "amdgcn:gfx1100": Target("amdgcn", "amdgcn-amd-amdhsa", "gfx1100", "", 1, 3, 32, 1024, 64 * 1024, "code-object", ("wmma",)),
    "spirv:vulkan1.3": Target("spirv", "spirv-unknown-vulkan1.3-compute", "", "", 11, 3, 1, 1024, 32 * 1024, "spirv"),
}


def target(name: str) -> Target:
    """A target by name: 'host', 'nvptx:sm_90', 'amdgcn:gfx942', 'spirv:vulkan1.3', ..."""
    if name == "host":
        return host_target()
    if name not in TARGETS:
        raise Refusal("compile", name, f"unknown target (known: host, {', '.join(TARGETS)})")
    return TARGETS[name]


def spirv_target(subgroup: int = 1) -> Target:
    """The Vulkan SPIR-V target for a device whose subgroups are ``subgroup`` lanes wide and run
    reductions and shuffles in compute shaders (GroupNonUniformArithmetic and -Shuffle); 1 (or 0):
    kernels use no subgroup operations, the module serves any Vulkan device."""
    base = TARGETS["spirv:vulkan1.3"]
    if subgroup <= 1:
        return base
    if subgroup & (subgroup - 1) or subgroup > 128:
        raise Refusal("compile", "spirv", f"a subgroup of {subgroup} lanes (Vulkan subgroups are powers of two up to 128)")
    return replace(base, subgroup=subgroup)


SHARED_ALIGN = 1024  # bytes: each array of dynamic workgroup memory starts at a multiple (a wgmma swizzle atom)


def shared_layout(k: Kernel, tgt: Target) -> tuple[dict[str, int], int]:
    """Where kernel ``k``'s workgroup arrays lie in dynamic workgroup memory on ``tgt``: ({array: byte
    offset}, bytes to ask for at launch), or ({}, 0) where they are declared statically (their total
    within the target's static limit). The lowering and the runtime that launches both read it."""
    total = sum(s.size * max(1, s.dtype.bits // 8) for s in k.shared)
    if tgt.static_shared is None or total <= tgt.static_shared:
        return {}, 0
    offsets, at = {}, 0
    for s in k.shared:
        offsets[s.name] = at
        at += -(-s.size * max(1, s.dtype.bits // 8) // SHARED_ALIGN) * SHARED_ALIGN
    return offsets, at
