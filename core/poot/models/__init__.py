"""Model families: the contract and the registry fed by the ``poot_model_families`` hook."""

from .family import ModelFamily, family_for, model_families

__all__ = ["ModelFamily", "family_for", "model_families"]
