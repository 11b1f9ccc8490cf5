"""Shared helpers of the planner: what a device lets plans use, value keys, shapes and strides under a
symbol environment."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ParameterError
from ..graph.dims import Dim
from ..graph.ir import Value
from ..kernel.library.elementwise import MAX_RANK

if TYPE_CHECKING:
    from .plan import When

__all__ = ["Env", "Limits", "MATMUL_PRECISIONS", "check_matmul_precision", "key", "shape", "strides", "pad", "between"]

# Where a device multiplies on tensor cores (bf16 inputs, f32 sums), what its f32 activations become,
# after torch.set_float32_matmul_precision: "highest" no tensor cores (f32 arithmetic throughout, as
# the CPU); "high" each activation as two bf16 terms, about 16 bits kept (the default); "medium"
# activations rounded to bf16, one product (what bf16 frameworks compute: half the tensor work).
MATMUL_PRECISIONS = ("highest", "high", "medium")


def check_matmul_precision(value: str) -> str:
    """``value`` if it is one of ``MATMUL_PRECISIONS``, else a ParameterError naming the option."""
    if value not in MATMUL_PRECISIONS:
        raise ParameterError("matmul_precision", f"'{value}' is not one of {', '.join(MATMUL_PRECISIONS)}")
    return value


Env = Mapping[str, int]


@dataclass(frozen=True)
class Limits:
    """What a plan's kernels may use on a device (from its ``Capabilities``)."""

    max_workgroup: int = 1024
    shared_bytes: int = 1 << 20
    dtypes: frozenset[str] = frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"})
    subgroup: int = 1
    matrix: frozenset[str] = frozenset()
    max_buffer_bytes: int | None = None  # the largest buffer a kernel may bind (None: no limit)
    # how f32 activations meet tensor cores (MATMUL_PRECISIONS): chosen by the user, not the device
    matmul_precision: str = "high"
    dynamic_shared: int = 0  # workgroup memory a kernel may take past shared_bytes, asked for at launch

    def __post_init__(self) -> None:
        check_matmul_precision(self.matmul_precision)


def key(v: Value) -> tuple[int, int]:
    return (v.node.id, v.index)


def shape(v: Value, env: Env) -> tuple[int, ...]:
    return tuple(Dim.evaluate(d, env) for d in v.shape)


def strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.insert(0, acc)
        acc *= d
    return out


def pad(xs: list[int], fill: int) -> list[int]:
    return [fill] * (MAX_RANK - len(xs)) + xs


def between(lo: int, hi: int | None, rows: Callable[[Env], int]) -> When:
    """A launch's condition on the rows of x (``rows(env)``): ``lo < rows <= hi`` (no upper bound
    for ``hi`` None, no lower for ``lo`` 0)."""
    from .plan import When

    if hi is None:
        return When(f"rows > {lo}", lambda env: rows(env) > lo)
    if lo == 0:
        return When(f"rows <= {hi}", lambda env: rows(env) <= hi)
    return When(f"{lo} < rows <= {hi}", lambda env: lo < rows(env) <= hi)
