"""The NVPTX targets this backend brings (``poot_targets``; facts: shared/TARGETS.md): PTX for
sm_80, sm_90 and sm_90a (Hopper's own instructions, wgmma among them), lowered by
``lowering.NvptxLowering``."""

from __future__ import annotations

from poot.backend import Target

__all__ = ["TARGETS"]

_LOWERING = "poot_ptx.lowering:NvptxLowering"

TARGETS: dict[str, Target] = {
    "nvptx:sm_80": Target("nvptx", "nvptx64-nvidia-cuda", "sm_80", "+ptx78", 1, 3, 32, 1024, 48 * 1024, "ptx", ("mma.sync",), lowering=_LOWERING),
    "nvptx:sm_90": Target("nvptx", "nvptx64-nvidia-cuda", "sm_90", "+ptx80", 1, 3, 32, 1024, 48 * 1024, "ptx", ("mma.sync",), lowering=_LOWERING),
    # a Hopper SM gives a workgroup up to 227 KiB, past the 48 KiB PTX declares statically
    "nvptx:sm_90a": Target(
        "nvptx", "nvptx64-nvidia-cuda", "sm_90a", "+ptx80", 1, 3, 32, 1024, 227 * 1024, "ptx", ("mma.sync", "wgmma"), 48 * 1024, lowering=_LOWERING
    ),
}
