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
    from ..runtime.device import Capabilities

__all__ = ["Target", "TARGETS", "target", "backend_targets", "spirv_target_for", "import_ref", "host_target", "spirv_target", "shared_layout", "SHARED_ALIGN"]


@dataclass(frozen=True)
class Target:
    name: str  # "host" | "spirv" | a backend's ("nvptx", "amdgcn", ...)
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
    # "module:Class" of the KernelLowering subclass that lowers Kernel IR for this target ("": the
    # host's); a backend's own targets name a class of the backend's
    lowering: str = ""
    # "module:function" turning the emitted object into the artifact (function(obj, kernel name) ->
    # bytes: a linker run, say); "": the object (or assembly) is the artifact
    link: str = ""
    reloc: str = "default"  # LLVM's relocation model: "pic" for shared objects
    # "module:function" that turns the kernel's LLVM IR into its artifact with a toolchain of the
    # backend's own (function(ir text, target, kernel name) -> bytes), for a target the LLVM here
    # has no backend for (AIE: AMD's Peano); "": LLVM here optimises and emits it
    emit: str = ""

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
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), feats, 0, 0, 1, 1024, 1 << 30, "object", reloc="pic")


# the core's own targets past the host; backends bring theirs (``poot_targets``)
TARGETS: dict[str, Target] = {
    "spirv:vulkan1.3": Target(
        "spirv",
        "spirv-unknown-vulkan1.3-compute",
        "",
        "",
        11,
        3,
        1,
        1024,
        32 * 1024,
        "spirv",
        lowering="poot.codegen.spirv:SpirvLowerer",
        link="poot.codegen.spirv:post_pass",
    ),
}


def target(name: str) -> Target:
    """A target by name: 'host', 'spirv:vulkan1.3', or one an installed backend brings
    ('nvptx:sm_90', 'amdgcn:gfx942', ...: ``poot_targets``)."""
    if name == "host":
        return host_target()
    if name in TARGETS:
        return TARGETS[name]
    known = backend_targets()
    if name not in known:
        raise Refusal("compile", name, f"unknown target (known: host, {', '.join([*TARGETS, *known])}; a backend plugin brings the others)")
    return known[name]


def spirv_target_for(caps: Capabilities | None) -> Target:
    """The SPIR-V target a Vulkan-like device's kernels compile for: its subgroup width where it
    runs subgroup operations in compute shaders, else the one that serves every device."""
    return spirv_target(caps.subgroup_size if caps is not None and caps.subgroup_ops else 1)


def import_ref(ref: str) -> object:
    """The object a target names by ``"module:name"`` (its lowering class, its link step);
    ImportError or AttributeError where it cannot be loaded."""
    import importlib

    mod, _, name = ref.partition(":")
    return getattr(importlib.import_module(mod), name)


def backend_targets() -> dict[str, Target]:
    """The targets installed backends bring, by key."""
    from ..plugins import host

    return {t.key: t for ts in host().hook.poot_targets() for t in ts}


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


SHARED_ALIGN = 1024  # bytes: each array of dynamic workgroup memory starts at a multiple (a matrix unit's swizzle atom)


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
