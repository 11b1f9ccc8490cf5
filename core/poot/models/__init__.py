"""Model families: the contract, the registry fed by the ``poot_model_families`` hook, the shared
decoder configuration and the tracer every decoder family uses."""

from .config import ConfigError, DecoderConfig, LayerConfig, MlaConfig
from .decoder import STEP_INPUTS, StepShapes, cache_names, trace_decoder
from .family import DecoderFamily, ModelFamily, UnknownArchitecture, family_for, model_families

__all__ = [
    "ModelFamily",
    "DecoderFamily",
    "UnknownArchitecture",
    "family_for",
    "model_families",
    "ConfigError",
    "DecoderConfig",
    "LayerConfig",
    "MlaConfig",
    "STEP_INPUTS",
    "StepShapes",
    "cache_names",
    "trace_decoder",
]
