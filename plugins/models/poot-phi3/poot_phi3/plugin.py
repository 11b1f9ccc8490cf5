"""Entry point of poot-phi3: registers the Phi-3 family."""

from poot import hookimpl
from poot.models import ModelFamily

from .family import Phi3Family


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [Phi3Family()]
