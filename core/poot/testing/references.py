"""transformers as the oracle of real checkpoints, built once per test run: a GGUF file's tokenizer
and its f32 model take seconds to build (the model dequantizes every tensor), and several test
modules compare against the same ones. Test-side only; poot itself never imports torch."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["hf_tokenizer", "hf_model", "hf_greedy"]


@cache
def hf_tokenizer(path: Path) -> Any:
    """transformers' tokenizer of the GGUF file at ``path``."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@cache
def hf_model(path: Path) -> Any:
    """transformers' model of the GGUF file at ``path``, in f32, in eval mode. Callers must not
    change it."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@cache
def hf_greedy(path: Path, prompts: tuple[tuple[int, ...], ...], n: int) -> tuple[tuple[list[int], list[Any]], ...]:
    """transformers' greedy continuation of each prompt (token ids) by ``n`` tokens, with its KV
    cache: (tokens, the logits row each token was chosen from) per prompt."""
    import torch

    ref = hf_model(path)
    outs = []
    with torch.no_grad():
        for prompt in prompts:
            out = ref(torch.tensor([list(prompt)]), use_cache=True)
            toks, logits = [], []
            for _ in range(n):
                row = out.logits[0, -1].numpy()
                toks.append(int(row.argmax()))
                logits.append(row)
                out = ref(torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            outs.append((toks, logits))
    return tuple(outs)
