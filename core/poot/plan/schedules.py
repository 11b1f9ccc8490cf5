"""What a backend decides in a GPU plan: ``Schedules``, asked by the planner's generic GPU schedules
at each point where a device's own kernels may serve, and the planning names a backend's schedules
build launches from.

The core plans every op with schedules that Vulkan, WebGPU, CUDA and ROCm share (warp GEMVs over
subgroups, register-tiled GEMMs, attention a workgroup a head). A backend whose devices have more
(matrix instructions, asynchronous copies, a fast path verified there) subclasses ``Schedules`` and
returns it from ``poot_plan_schedules(device)``; the planner makes one per plan, so it may keep
the plan's scratch areas it adds (x split once for every product that reads it, say). Every method
has the generic answer as its default, so a backend overrides only what it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Refusal
from ..graph.ir import Node, Value
from ..quant.bodies import BODIES, LUTS
from .common import Env, Limits, between
from .common import key as value_key
from .common import shape as value_shape
from .plan import Launch, Plan, When
from .quantized_x import QuantizedX

if TYPE_CHECKING:
    from ..kernel.ir import Kernel
    from .attention import AttentionOperands
    from .fused_gemv import Glu

__all__ = [
    "Schedules",
    "GemvChoice",
    "PrefillAttention",
    "AttentionOperands",
    "Glu",
    "Node",
    "Value",
    "Launch",
    "Plan",
    "QuantizedX",
    "When",
    "Limits",
    "Env",
    "Refusal",
    "between",
    "value_key",
    "value_shape",
    "warp_gemv_fits",
    "BODIES",
    "LUTS",
]


@dataclass(frozen=True)
class PrefillAttention:
    """A backend's own prefill attention: ``kernel`` takes ``rows`` query tokens a workgroup (grid
    (ceil(tokens / rows), query heads)) and serves the steps whose sequences average at least
    ``from_tokens`` new tokens each; blocks of 16 query tokens serve shorter prompts (a workgroup
    of many short prompts walks them one by one, which costs a large block more)."""

    kernel: Kernel
    rows: int
    from_tokens: int


@dataclass(frozen=True)
class GemvChoice:
    """How a warp GEMV (``linear_gpu.gemv_warp``) of some rows of x runs on a device: ``wide``
    lanes of 32 quant bytes (else 16), x ``staged`` (quantized once by its own launch for every
    product that reads it, ``QuantizedX``, rather than by each workgroup), and ``shape``: further
    keyword arguments of ``gemv_warp`` for a single staged product (registers capped for so many
    workgroups, rows pipelined, features a warp)."""

    wide: bool = False
    staged: bool = False
    shape: dict[str, Any] = field(default_factory=dict)


class Schedules:
    """A backend's choices in one GPU plan (``plan``, for a device of ``limits``). The defaults are
    the generic schedules': a backend's subclass overrides what its devices do better."""

    def __init__(self, plan: Plan, limits: Limits) -> None:
        self.plan = plan
        self.limits = limits

    def gemv(self, qtype: str, k: int, n: int, rows: int) -> GemvChoice:
        """How the warp GEMV of weights of ``qtype`` ([n, k]) runs for up to ``rows`` rows of x."""
        return GemvChoice()

    def matmul_many_rows(self, n: Node) -> list[Launch] | None:
        """Launches for matmul ``n`` (x @ w^T, a 2-D weight) beyond four rows of x, each under its
        own ``When``; None keeps the generic GEMMs (register tiles, or packed weights dequantized
        in registers)."""
        return None

    def siblings_many_rows(self, ns: Sequence[Node]) -> list[Launch]:
        """Beyond four rows, launches that compute several products of one x together (``ns``: q, k
        and v, found by ``find_siblings``; a gated MLP's gate and up, ``find_glus``), each under its
        own ``When``; the backend's ``matmul_many_rows`` then leaves those rows of each product to
        them. An empty list: each its own."""
        return []

    def glu_split(self, glu: Glu, h: Value, users: Sequence[Node]) -> list[Launch]:
        """Beyond a few rows, launches that compute the gated MLP's product ``h`` (silu(g) * u) in
        the form its ``users`` read it, instead of the generic elementwise kernel; none keeps that."""
        return []

    def warp_decode(self, a: AttentionOperands) -> bool:
        """Whether decode attention takes a warp a position (``attention_gpu.attention_decode``),
        for operands it suits (heads of 64 or 128 values, 32-lane subgroups): where it has been
        verified. The generic answer keeps a thread a position."""
        return False

    def attention_prefill(self, a: AttentionOperands) -> PrefillAttention | None:
        """A prefill attention kernel of the backend's for prompts long enough on average
        (``PrefillAttention``); None keeps blocks of 16 query tokens for every prompt."""
        return None

    def finish(self) -> None:
        """The backend's passes over the finished plan (``self.plan``): fusions across launches
        its own kernels allow."""


def warp_gemv_fits(t: Any, k: int, limits: Limits) -> bool:
    """Whether the warp GEMV runs weights of dtype ``t`` with rows of ``k`` values on a device of
    ``limits``."""
    from .matmul import _warp_gemv_fits

    return _warp_gemv_fits(t, k, limits)


def __getattr__(name: str) -> Any:
    # the planner's types these methods take, loaded on use (they import this module)
    if name == "AttentionOperands":
        from .attention import AttentionOperands

        return AttentionOperands
    if name == "Glu":
        from .fused_gemv import Glu

        return Glu
    raise AttributeError(f"module 'poot.plan.schedules' has no attribute {name!r}")
