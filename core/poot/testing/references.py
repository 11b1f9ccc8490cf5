"""transformers as the oracle of real checkpoints, built once per test run: a GGUF file's tokenizer
and its f32 model take seconds to build (the model dequantizes every tensor), and several test
modules compare against the same ones. Test-side only; poot itself never imports torch.

gguf's reader parses a header's arrays an element at a time (Gemma 3's 262,144-token vocabulary:
about 25 s on a 2-core machine), and transformers opens one per tokenizer and two per model. One
parsed reader a file (``gguf_reader``) serves them all, and the tests that compare with gguf."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["gguf_reader", "hf_tokenizer", "hf_model", "hf_greedy"]


def gguf_reader(path: str | Path) -> Any:
    """gguf's ``GGUFReader`` of the file at ``path``, parsed once per process (read-only: callers
    must not write through its arrays)."""
    return _parsed(Path(path).resolve())


@cache
def _parsed(path: Path) -> Any:
    from gguf.gguf_reader import GGUFReader  # the class itself (``gguf.GGUFReader`` may be the stand-in below)

    return GGUFReader(str(path), "r")


@contextmanager
def _shared_readers() -> Iterator[None]:
    """transformers' GGUF loading (which imports ``gguf.GGUFReader`` as it runs) given the parsed
    reader of each file instead of a new one."""
    import gguf

    cls = gguf.GGUFReader

    def reader(path: Any, mode: str = "r") -> Any:
        return gguf_reader(path) if mode == "r" else cls(path, mode)

    gguf.GGUFReader = reader  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader = cls  # type: ignore[misc]


@cache
def hf_tokenizer(path: Path) -> Any:
    """transformers' tokenizer of the GGUF file at ``path``."""
    import transformers

    with _shared_readers():
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@cache
def hf_model(path: Path) -> Any:
    """transformers' model of the GGUF file at ``path``, in f32, in eval mode. Callers must not
    change it."""
    import torch
    import transformers

    with _shared_readers():
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
