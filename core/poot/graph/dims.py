"""Shapes with symbolic dimensions.

A dimension is a polynomial with integer coefficients over named symbols ("tokens", "ctx", ...),
so that ``tokens * 8`` heads of width 64 reshape to ``tokens * 512`` and back with exact checks.
Plain ints are the constant polynomials; ``sym("tokens")`` makes a symbol.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Union

__all__ = ["Dim", "DimLike", "Shape", "sym", "as_dim", "as_shape", "shape_str", "numel", "evaluate_shape"]

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers; () is the constant term


@dataclass(frozen=True)
class Dim:
    """A dimension: sum of coefficient * monomial. Immutable and hashable."""

    terms: tuple[tuple[Monomial, int], ...]

    @staticmethod
    def of(terms: Mapping[Monomial, int]) -> "Dim":
        return Dim(tuple(sorted((m, c) for m, c in terms.items() if c != 0)))

    @property
    def is_static(self) -> bool:
        return all(m == () for m, _ in self.terms)

    @property
    def value(self) -> int:
        """The int value of a static dimension."""
        if not self.is_static:
            raise ValueError(f"dimension {self} is symbolic")
        return sum(c for _, c in self.terms)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s in m)

    def _map(self) -> dict[Monomial, int]:
        return dict(self.terms)

    def __add__(self, other: DimLike) -> "Dim":
        out = self._map()
        for m, c in as_dim(other).terms:
            out[m] = out.get(m, 0) + c
        return Dim.of(out)

    __radd__ = __add__

    def __sub__(self, other: DimLike) -> "Dim":
        return self + as_dim(other) * -1

    def __rsub__(self, other: DimLike) -> "Dim":
        return as_dim(other) - self

    def __mul__(self, other: DimLike) -> "Dim":
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in as_dim(other).terms:
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, 0) + c1 * c2
        return Dim.of(out)

    __rmul__ = __mul__

    def exact_div(self, other: DimLike) -> "Dim | None":
        """self / other when other is a single term dividing every term of self exactly, else None."""
        o = as_dim(other)
        if len(o.terms) != 1:
            return None if o != self else as_dim(1)
        ((om, oc),) = o.terms
        out: dict[Monomial, int] = {}
        for m, c in self.terms:
            rest = list(m)
            for s in om:
                if s not in rest:
                    return None
                rest.remove(s)
            if c % oc:
                return None
            out[tuple(rest)] = out.get(tuple(rest), 0) + c // oc
        return Dim.of(out)

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            v = c
            for s in m:
                if s not in bindings:
                    raise KeyError(f"symbolic dimension '{s}' has no value")
                v *= bindings[s]
            total += v
        return total

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            other = as_dim(other)
        return isinstance(other, Dim) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(self.terms)

    def __repr__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in self.terms:
            body = "*".join(m)
            if not body:
                parts.append(str(c))
            elif c == 1:
                parts.append(body)
            else:
                parts.append(f"{c}*{body}")
        return " + ".join(parts)

    __str__ = __repr__


DimLike = Union[int, Dim]
Shape = tuple[Dim, ...]


def sym(name: str) -> Dim:
    """A symbolic dimension named ``name``."""
    if not name.isidentifier():
        raise ValueError(f"symbol name {name!r} must be an identifier")
    return Dim((((name,), 1),))


def as_dim(d: DimLike) -> Dim:
    if isinstance(d, Dim):
        return d
    if isinstance(d, bool) or not isinstance(d, int):
        try:
            import numpy as np

            if isinstance(d, np.integer):
                return as_dim(int(d))
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"a dimension must be an int or a symbolic Dim, got {d!r}")
    return Dim((((), d),)) if d != 0 else Dim(())


def as_shape(dims: Iterable[DimLike]) -> Shape:
    return tuple(as_dim(d) for d in dims)


def numel(shape: Shape) -> Dim:
    total = as_dim(1)
    for d in shape:
        total = total * d
    return total


def shape_str(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def evaluate_shape(shape: Shape, bindings: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(d.evaluate(bindings) for d in shape)
