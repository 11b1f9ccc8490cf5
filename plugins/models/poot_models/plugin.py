"""Entry point of poot-models: registers the shipped model families."""

from poot import hookimpl
from poot.models import ModelFamily

from .deepseek import DeepseekFamily
from .gemma import GemmaFamily
from .llama import LlamaFamily
from .phi3 import Phi3Family
from .qwen import QwenFamily


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [LlamaFamily(), QwenFamily(), GemmaFamily(), Phi3Family(), DeepseekFamily()]
