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

__all__ = ["ModelFamily", "DecoderFamily", "UnknownArchitecture", "model_families", "family_for", "pre_tokenizer_splits", "hf_tensor_names_for"]


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
    #: the pre-tokenizer splits of byte-level vocabularies this family knows, by GGUF
    #: ``tokenizer.ggml.pre`` name: the regex their merges were learned with (from the models' own
    #: tokenizer.json). Every installed family's are offered to every GGUF (a model of one family may
    #: carry another's vocabulary); a name none knows splits as GPT-2 does.
    pre_tokenizers: Mapping[str, str] = MappingProxyType({})
    #: Hugging Face tensor names of a layer's modules (after ``model.layers.{L}.``, before
    #: ``.weight``/``.bias``) mapped to weight roles, past those every transformers decoder shares
    #: (``poot.load.roles.HF_LAYER_NAMES``; an entry here overrides one there): ``{E}`` stands for
    #: an expert's index, and ``"<module>.<parameter>"`` names a parameter other than weight or bias
    #: (stored as the role's bias).
    hf_tensor_names: Mapping[str, str] = MappingProxyType({})

    def tokenizer(self, checkpoint: Any) -> Any:
        """The checkpoint's tokenizer: from its GGUF arrays read with ``tokenizer_options`` and the
        installed families' ``pre_tokenizers``, or from an HF directory's ``tokenizer.json``."""
        from ..text import Tokenizer

        if checkpoint.format == "gguf":
            return Tokenizer.from_gguf(checkpoint.metadata, pre_splits=pre_tokenizer_splits(), **self.tokenizer_options)
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


def pre_tokenizer_splits() -> dict[str, str]:
    """Every installed family's pre-tokenizer splits by ``tokenizer.ggml.pre`` name (the first family
    to name one wins)."""
    out: dict[str, str] = {}
    for _, fam in model_families():
        for name, regex in fam.pre_tokenizers.items():
            out.setdefault(name, regex)
    return out


def hf_tensor_names_for(architecture: str | None) -> Mapping[str, str]:
    """The Hugging Face tensor names (``ModelFamily.hf_tensor_names``) of the family serving
    ``architecture``; none where no installed family serves it (its tensors then map by the names
    every decoder shares, and ``family_for`` says what is missing when the model is run)."""
    if not architecture:
        return {}
    try:
        return family_for(architecture).hf_tensor_names
    except UnknownArchitecture:
        return {}


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
