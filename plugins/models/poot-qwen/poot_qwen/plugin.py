"""Entry point of poot-qwen: registers the Qwen2, Qwen3 and their MoE variants family."""

from poot import hookimpl
from poot.models import ModelFamily

from .family import QwenFamily


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [QwenFamily()]
