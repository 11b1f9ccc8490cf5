"""The core's own quantizations, registered through the same hook a plugin would use.

The layouts live in their own modules: plain floats and 32-value blocks in ``legacy``, the
256-value super-blocks in ``kquants``, and the lookup-table types in ``nonlinear``.
"""

from __future__ import annotations

from ..hookspecs import hookimpl
from .descriptor import Quantization
from .kquants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .legacy import BF16, F16, F32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .nonlinear import IQ4_NL, IQ4_XS, MXFP4

__all__ = ["BUILTIN", "poot_quantizations"]

BUILTIN: tuple[Quantization, ...] = (
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
)


@hookimpl
def poot_quantizations() -> list[Quantization]:
    return list(BUILTIN)
