"""Generation: a model loaded onto a device (``ModelHandle``, ``poot.load``), the driver's step over
many sequences (``Engine``), paged KV slots with prefix sharing, and sampling parameters."""

from .engine import Engine, Event
from .handle import Completion, ModelHandle, load, parse_bytes
from .kv import BlockPool, BlockTable, OutOfBlocks
from .params import MAX_LOGPROBS, ParameterError, SamplingParams

__all__ = [
    "BlockPool",
    "BlockTable",
    "Completion",
    "Engine",
    "Event",
    "MAX_LOGPROBS",
    "ModelHandle",
    "OutOfBlocks",
    "ParameterError",
    "SamplingParams",
    "load",
    "parse_bytes",
]
