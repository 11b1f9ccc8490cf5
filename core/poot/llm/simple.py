"""A first generation loop: load a model, compile its step for a device, and decode greedily one
sequence at a time, streaming text. (Batching, sampling on the device, prefix
sharing and the rest of the driver come with the generation work.)"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from ..errors import PootError
from ..graph.passes import DEFAULT_PASSES, PassManager
from ..load import open_model
from ..models import StepShapes, family_for
from ..models.decoder import StepBatch
from ..plan import compile_plan
from ..plugins import host
from ..runtime import get_device
from ..runtime.executor import step_env
from ..text import Tokenizer
from ..text.chat import chat_template_for
from ..text.detok import StreamingDetokenizer

__all__ = ["SimpleGenerator"]


class SimpleGenerator:
    def __init__(self, model: str, device: str | None = None, max_context: int = 1024, block_size: int = 16) -> None:
        self.device = get_device(device)
        factory = host().hook.poot_executor(device=self.device)
        if factory is None:
            raise PootError(f"no installed plugin can run plans on {self.device.name}")
        ck = open_model(model)
        self.family = family_for(ck.architecture)
        cfg = self.family.parse_config(ck)
        self.tokenizer = Tokenizer.from_gguf(ck.metadata) if ck.format == "gguf" else Tokenizer.from_hf(ck.path)
        self.template = chat_template_for(ck.chat_template or self.family.default_chat_template, ck.architecture, self.tokenizer.special_tokens)
        self.block_size = block_size
        self.stats: dict[str, float] = {}
        self.blocks = -(-max_context // block_size)
        graph = PassManager(DEFAULT_PASSES).run(self.family.trace(cfg, ck.weights, StepShapes(block_size=block_size)))
        self.executor = factory(compile_plan(graph, self.device))
        # weights stay as stored: zero-copy views of the mapped file (bf16, which kernels read as f32 here, excepted)
        self.weights = {t.name: (t.dequantize() if t.storage == "bf16" else t.raw()) for t in ck.weights.tensors.values()}
        self._pools = {}
        for name in self.executor.pool_names():
            v = graph.inputs()[name]
            self._pools[name] = np.zeros((self.blocks,) + tuple(d.value for d in v.shape[1:]), np.float32)
        self.executor.bind(self.weights, self._pools)

    def prompt(self, text: str, raw: bool = False) -> list[int]:
        if raw or self.template is None:
            return self.tokenizer.encode(text)
        rendered = self.template.render([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.tokenizer.encode(rendered, add_special_tokens=False)

    def _step(self, tokens: list[int], start: int) -> int:
        n = len(tokens)
        pos = np.arange(start, start + n, dtype=np.int32)
        slots = pos  # one sequence owning blocks 0, 1, 2 ... in order
        batch = StepBatch(np.array(tokens), pos, np.zeros(n), slots, np.array([start + n]), np.arange(self.blocks).reshape(1, -1), np.array([n - 1]))
        inputs = batch.as_inputs()
        step = self.executor.capture(step_env(self.executor.plan, {**inputs, **self._pools}))  # once per shape
        self.executor.replay(step, inputs)
        return int(np.argmax(self.executor.read(step, "logits")[0]))

    def generate(self, ids: list[int], max_tokens: int = 64) -> Iterator[str]:
        """Greedy decoding; yields text pieces as they become final."""
        if len(ids) + max_tokens > self.blocks * self.block_size:
            raise PootError(f"prompt of {len(ids)} tokens + {max_tokens} new ones exceed the context of {self.blocks * self.block_size}")
        detok = StreamingDetokenizer(self.tokenizer, skip_special_tokens=True)
        t0 = time.perf_counter()
        tok = self._step(ids, 0)
        self.stats = {"prompt_tokens": len(ids), "prefill_s": time.perf_counter() - t0, "new_tokens": 0, "decode_s": 0.0}
        pos = len(ids)
        for _ in range(max_tokens):
            if tok in self.tokenizer.stop_ids:
                break
            piece = detok.push(tok)
            if piece:
                yield piece
            t0 = time.perf_counter()
            tok = self._step([tok], pos)
            self.stats["decode_s"] += time.perf_counter() - t0
            self.stats["new_tokens"] += 1
            pos += 1
        rest = detok.finish()
        if rest:
            yield rest
