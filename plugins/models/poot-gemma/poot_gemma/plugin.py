"""Entry point of poot-gemma: registers the Gemma 2 and Gemma 3 family."""

from poot import hookimpl
from poot.models import ModelFamily

from .family import GemmaFamily


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [GemmaFamily()]
