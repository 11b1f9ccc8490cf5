"""The AIE targets poot-npu brings (``poot_targets``): one AIE core of an XDNA2 NPU (AIE2P, as in
Ryzen AI 300) and of an XDNA NPU (AIE2, Ryzen 7040/8040). A kernel is lowered in its looped form
(``lowering.AieLowering``: ``grid_to_loops``, then the generic lowering with no threads left), its
workgroup memory is the core's 64 KiB of data memory, and the object is emitted by the AIE
toolchain (``toolchain.emit_core_object``: Peano's clang), which upstream LLVM has no backend for."""

from __future__ import annotations

from poot.backend import Target

__all__ = ["TARGETS", "CORE_MEMORY"]

CORE_MEMORY = 64 * 1024  # an AIE core's data memory (its tile's; neighbours' are reachable but not used here)


def _aie(name: str) -> Target:
    return Target(
        "aie",
        f"{name}-none-unknown-elf",
        name,
        "",
        0,
        0,
        1,
        1024,
        CORE_MEMORY,
        "aie-object",
        (),
        lowering="poot_npu.lowering:AieLowering",
        emit="poot_npu.toolchain:emit_core_object",
    )


TARGETS: dict[str, Target] = {"aie:aie2p": _aie("aie2p"), "aie:aie2": _aie("aie2")}
