"""The model-family contract as the core uses it: a family is found by architecture (or the error names
the installed ones and the hook), its pre-tokenizer splits serve every GGUF whose
``tokenizer.ggml.pre`` names them, and its Hugging Face tensor names map a safetensors checkpoint of
its architecture."""

from __future__ import annotations

import numpy as np
import pytest

from poot.load import open_checkpoint
from poot.models import family_for
from poot.models.family import UnknownArchitecture, hf_tensor_names_for, pre_tokenizer_splits
from poot.testing.checkpoints import write_gguf
from poot.text.tokenizer import Tokenizer, byte_level_alphabet


def test_unknown_architecture_names_families_and_the_hook(tmp_path):
    write_gguf(tmp_path / "m.gguf", "mamba", {}, [("token_embd.weight", "f32", (4, 32), np.ones((4, 32), np.float32))])
    ck = open_checkpoint(tmp_path / "m.gguf")
    with pytest.raises(UnknownArchitecture, match=r"'mamba'.*gemma \(gemma2.*llama \(llama, mistral.*poot_model_families"):
        family_for(ck.architecture)
    assert hf_tensor_names_for("mamba") == {} and hf_tensor_names_for(None) == {}


def _byte_level(pre: str, splits: dict[str, str] | None) -> Tokenizer:
    """A byte-level vocabulary of single bytes (no merges), its GGUF naming pre-tokenizer ``pre``."""
    tokens = list(byte_level_alphabet().values())
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [], "tokenizer.ggml.pre": pre}
    return Tokenizer.from_gguf(md, pre_splits=splits)


def test_a_gguf_splits_by_the_pre_tokenizer_its_family_brings():
    """Qwen2's vocabularies split digits one by one, Llama 3's in threes, a name no family knows as
    GPT-2 does (runs of digits): the splits come from the installed families."""
    splits = pre_tokenizer_splits()
    assert {"qwen2", "llama-bpe", "llama3"} <= set(splits)
    text = "year 20245!"

    def pieces(pre: str, given: dict[str, str] | None) -> list[str]:
        return [p for p, _ in _byte_level(pre, given).backend.pre_tokenizer.pre_tokenize_str(text)]

    assert pieces("qwen2", splits) == ["year", "Ġ", "2", "0", "2", "4", "5", "!"]
    assert pieces("llama-bpe", splits) == ["year", "Ġ", "202", "45", "!"]
    assert pieces("nobody-knows", splits) == ["year", "Ġ20245", "!"]
    assert pieces("qwen2", None) == pieces("nobody-knows", splits)  # no families given: GPT-2's split


def test_the_meta_package_installs_every_family_here():
    """poot-models (plugins/models) holds no code and requires each family distribution beside it."""
    import tomllib
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "plugins" / "models"
    meta = tomllib.loads((models / "pyproject.toml").read_text())["project"]
    families = sorted(tomllib.loads((d / "pyproject.toml").read_text())["project"]["name"] for d in models.glob("poot-*"))
    assert len(families) >= 5 and sorted(r.split(">=")[0] for r in meta["dependencies"]) == families
