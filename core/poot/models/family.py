"""The ModelFamily contract and lookup by architecture.

A family says which architectures it serves, parses a config from GGUF metadata or ``config.json``,
maps checkpoint tensors to weight roles, builds the tokenizer (with what it knows of its vocabulary),
holds its chat template, and traces the Graph of a forward step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..errors import PluginError, PootError
from ..plugins import host

__all__ = ["ModelFamily", "DecoderFamily", "UnknownArchitecture", "model_families", "family_for"]


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
    def parse_config(self, checkpoint: Any) -> Any:
        """The family's config from a Checkpoint's GGUF metadata or HF ``config.json``."""

    @abstractmethod
    def trace(self, config: Any, weights: Any, shapes: Any = None) -> Any:
        """The Graph of one forward step over a batch of sequences."""

    #: chat template for checkpoints of this family that carry none (jinja source), or None; used
    #: only when asked for (``chat_template="family"``), never guessed for a checkpoint without one
    default_chat_template: str | None = None
    #: how a GGUF's tokenizer arrays are to be read (``Tokenizer.from_gguf``'s keyword options), for
    #: what the file itself does not say: e.g. ``{"sentencepiece_spaces": "plain"}``
    tokenizer_options: Mapping[str, Any] = MappingProxyType({})

    def tokenizer(self, checkpoint: Any) -> Any:
        """The checkpoint's tokenizer: from its GGUF arrays read with ``tokenizer_options``, or from
        an HF directory's ``tokenizer.json``."""
        from ..text import Tokenizer

        if checkpoint.format == "gguf":
            return Tokenizer.from_gguf(checkpoint.metadata, **self.tokenizer_options)
        return Tokenizer.from_hf(checkpoint.path)

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


class DecoderFamily(ModelFamily):
    """A family of decoder-only transformers: parse each source into a ``DecoderConfig`` and trace it
    with the shared tracer. Subclasses implement ``config_from_gguf`` and ``config_from_hf``."""

    def parse_config(self, checkpoint: Any) -> Any:
        from ..errors import LoadError
        from .config import ConfigError

        try:
            if checkpoint.format == "gguf":
                return self.config_from_gguf(checkpoint.metadata, checkpoint.weights)
            return self.config_from_hf(checkpoint.metadata, checkpoint.weights)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{checkpoint.path}: cannot read the {self.name} config: {type(e).__name__}: {e}") from None
        except LoadError:
            raise

    def config_from_gguf(self, metadata: Mapping[str, Any], weights: Any) -> Any:
        raise NotImplementedError(f"the {self.name} family does not read GGUF files")

    def config_from_hf(self, config: Mapping[str, Any], weights: Any) -> Any:
        raise NotImplementedError(f"the {self.name} family does not read Hugging Face checkpoints")

    def trace(self, config: Any, weights: Any, shapes: Any = None) -> Any:
        from .decoder import trace_decoder

        return trace_decoder(config, weights, shapes)
