"""Vulkan SPIR-V: lowering differences from the other GPU targets, and the post-pass over the binary.

(Being written: buffers through resource handles, the barrier-semantics fix and capability
clean-up that shared/TARGETS.md describes.)"""

from __future__ import annotations

from ..errors import Refusal
from .lower import _Lowerer

__all__ = ["SpirvLowerer", "post_pass"]


class SpirvLowerer(_Lowerer):
    def lower(self):  # type: ignore[no-untyped-def]
        raise Refusal(f"kernel {self.k.name}", self.t.key, "the SPIR-V target is not implemented yet")


def post_pass(obj: bytes, name: str) -> bytes:
    raise Refusal(f"kernel {name}", "spirv", "the SPIR-V target is not implemented yet")
