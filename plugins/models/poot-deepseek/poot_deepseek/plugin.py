"""Entry point of poot-deepseek: registers the DeepSeek-V2 and V3 (MLA, MoE) family."""

from poot import hookimpl
from poot.models import ModelFamily

from .family import DeepseekFamily


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [DeepseekFamily()]
