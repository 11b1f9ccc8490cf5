"""x quantized once for every product that reads it (``QuantizedX``): the GPU's dp4a GEMVs and
integer tensor-core products (``quantize_q8x2``'s two int8 terms) and the host's integer products
(``quantize_x_host``'s records)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..graph.ir import Node, Value
from ..kernel.library import linear_gpu, linear_q8_host
from .common import Env
from .common import key as _key
from .plan import Launch, Plan, When

__all__ = ["QuantizedX"]


@dataclass
class QuantizedX:
    """x quantized to the Q4_K GEMV's two int8 terms (``quantize_q8x2``) once for all the one-row
    GEMVs that stage it (``GemvChoice.staged``: q, k and v in one launch, gate and up in another, o, down, the
    output head), or for a backend's own products (one instance of its own: the quantizing launch
    runs under its first reader's condition): three scratch areas of the plan's by x, written by
    one launch placed before the first of them."""

    plan: Plan
    areas: dict[tuple[int, int], dict[str, tuple[int, int]]] = field(default_factory=dict)

    def of(self, n: Node, x: Value, k: int, rows: Callable[[Env], int], when: When) -> tuple[dict[str, tuple[int, int]], list[Launch]]:
        """The GEMV's buffers of x quantized (``xq_in``, ``xr_in``, ``xds_in``), and the launch that
        writes them (none when one already does)."""
        xk = _key(x)
        if xk in self.areas:
            return self.areas[xk], []
        bufs = self.area(x, k, rows)
        kern = linear_gpu.quantize_q8x2(k)
        return bufs, [
            Launch(
                n,
                kern,
                {"x": xk, "xq": bufs["xq_in"], "xr": bufs["xr_in"], "xds": bufs["xds_in"]},
                lambda env: (-(-rows(env) * k // 4 // linear_gpu.Q8_THREADS),),
                lambda env: {"m": rows(env)},
                when,
                label="quantize_x",
            )
        ]

    def area(self, x: Value, k: int, rows: Callable[[Env], int]) -> dict[str, tuple[int, int]]:
        """New scratch areas for x quantized (``xq_in``, ``xr_in``, ``xds_in``: 4-byte words), found
        by ``of`` after: for a launch of the caller's own that writes them."""
        add = self.plan.add_scratch
        bufs = self.areas[_key(x)] = {
            "xq_in": add(lambda env: rows(env) * k // 4),
            "xr_in": add(lambda env: rows(env) * k // 4),
            "xds_in": add(lambda env: rows(env) * k // 16),
        }
        return bufs

    def host(self, n: Node, x: Value, k: int, rows: Callable[[Env], int]) -> tuple[dict[str, tuple[int, int]], list[Launch]]:
        """For the host's integer products: x's scratch area of ``quantize_x_host`` records
        (``xq``), and the launch that writes it (none when one already does)."""
        xk = _key(x)
        if xk in self.areas:
            return self.areas[xk], []
        bufs = self.areas[xk] = {"xq": self.plan.add_scratch(lambda env: rows(env) * (k // 32) * linear_q8_host.XW)}
        return bufs, [
            Launch(
                n,
                linear_q8_host.quantize_x_host.instantiate(),
                {"x": xk, "xq": bufs["xq"]},
                lambda env: (rows(env),),
                lambda env: {"k": k},
                label="quantize_x_host",
            )
        ]
