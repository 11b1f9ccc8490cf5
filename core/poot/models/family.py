"""The ModelFamily contract and lookup by architecture.

A family says which architectures it serves, parses a config from GGUF metadata or ``config.json``,
maps checkpoint tensors to weight roles, and traces the Graph of a forward step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from ..errors import PluginError, PootError
from ..plugins import host

__all__ = ["ModelFamily", "UnknownArchitecture", "model_families", "family_for"]


class UnknownArchitecture(PootError):
    """No installed family serves a checkpoint's architecture."""


class ModelFamily(ABC):
    """One family of model architectures. Subclass it in a plugin and return instances from the
    ``poot_model_families`` hook."""

    #: short family name, e.g. "llama"
    name: str = ""
    #: GGUF ``general.architecture`` values served, e.g. ("llama",)
    gguf_architectures: tuple[str, ...] = ()
    #: HF ``config.json`` ``architectures`` entries served, e.g. ("LlamaForCausalLM",)
    hf_architectures: tuple[str, ...] = ()

    @abstractmethod
    def parse_config(self, metadata: Mapping[str, Any]) -> Any:
        """The family's config from GGUF metadata or an HF ``config.json`` mapping."""

    @abstractmethod
    def trace(self, config: Any, weights: Any) -> Any:
        """The Graph of one forward step over a batch of sequences."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {', '.join(self.gguf_architectures + self.hf_architectures)}>"


def model_families() -> list[tuple[str, ModelFamily]]:
    """(plugin name, family) for every installed family, in plugin order."""
    out: list[tuple[str, ModelFamily]] = []
    for plugin, result in host().call_each("poot_model_families"):
        if isinstance(result, Exception):
            raise result
        for f in result or ():
            if not isinstance(f, ModelFamily):
                raise PluginError(f"plugin '{plugin}' returned {f!r} from poot_model_families, not a ModelFamily")
            out.append((plugin, f))
    return out


def family_for(architecture: str) -> ModelFamily:
    """The first installed family serving ``architecture`` (a GGUF or HF architecture name)."""
    fams = model_families()
    for _, f in fams:
        if architecture in f.gguf_architectures or architecture in f.hf_architectures:
            return f
    listed = "; ".join(f"{f.name} ({', '.join(f.gguf_architectures + f.hf_architectures)}) from {p}" for p, f in fams) or "none"
    raise UnknownArchitecture(
        f"no installed model family serves architecture '{architecture}'. Installed: {listed}. "
        "Add one with a plugin implementing the poot_model_families hook (see docs/PLUGINS.md)."
    )
