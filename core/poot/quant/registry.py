"""Quantization lookup by name, gathered from every plugin's ``poot_quantizations`` hook."""

from __future__ import annotations

from functools import lru_cache

from ..errors import PluginError
from ..plugins import PluginHost, host
from .descriptor import Quantization

__all__ = ["quantizations", "quantization"]


@lru_cache(maxsize=4)
def _collect(h: PluginHost) -> dict[str, Quantization]:
    found: dict[str, tuple[str, Quantization]] = {}
    for plugin, result in h.call_each("poot_quantizations"):
        if isinstance(result, Exception):
            raise result
        for q in result or ():
            if not isinstance(q, Quantization):
                raise PluginError(f"plugin '{plugin}' returned {q!r} from poot_quantizations, not a Quantization")
            if q.name in found:
                raise PluginError(f"quantization '{q.name}' is defined by both '{found[q.name][0]}' and '{plugin}'")
            found[q.name] = (plugin, q)
    return {name: q for name, (_, q) in found.items()}


def quantizations() -> dict[str, Quantization]:
    """Every registered quantization by name."""
    return dict(_collect(host()))


def quantization(name: str) -> Quantization:
    """The quantization called ``name`` (case-insensitive); KeyError lists the known ones."""
    table = _collect(host())
    key = name.lower()
    if key not in table:
        raise KeyError(f"unknown quantization '{name}' (known: {', '.join(sorted(table))})")
    return table[key]
