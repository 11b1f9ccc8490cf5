"""Entry point of poot-llama: registers the Llama, Mistral and Mixtral family."""

from poot import hookimpl
from poot.models import ModelFamily

from .family import LlamaFamily


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [LlamaFamily()]
