"""The Gemma 2 and Gemma 3 family (poot-gemma): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights, and a real checkpoint."""

from __future__ import annotations

import pytest

from poot.load.roles import Role
from poot.testing.families import assert_hf_names_map, assert_registered, check_real_checkpoint, check_synthetic, synthetic_cases
from poot_gemma.family import GemmaFamily

FAMILY = GemmaFamily()


def test_registered_through_its_entry_point():
    assert_registered(FAMILY, "gemma", "poot-gemma")


HF_NAMES = {
    "model.layers.3.post_attention_layernorm.weight": Role("attn_post_norm", 3),
    "model.layers.3.pre_feedforward_layernorm.weight": Role("ffn_norm", 3),
    "model.layers.3.post_feedforward_layernorm.weight": Role("ffn_post_norm", 3),
    "model.layers.3.self_attn.q_norm.weight": Role("attn_q_norm", 3),
    "model.layers.3.self_attn.k_norm.weight": Role("attn_k_norm", 3),
    "model.language_model.embed_tokens.weight": Role("token_embd"),
}


def test_its_hf_tensor_names_map_to_roles():
    assert_hf_names_map(FAMILY, HF_NAMES)


@pytest.mark.parametrize("name", synthetic_cases(FAMILY.hf_architectures))
def test_matches_transformers_on_a_synthetic_checkpoint(name, tmp_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
    pytest.importorskip("transformers")
    check_synthetic(name, tmp_path, rng)


@pytest.mark.slow
def test_matches_transformers_on_the_real_checkpoint(gemma3_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for real checkpoints")
    pytest.importorskip("transformers")
    check_real_checkpoint(gemma3_path, "gemma3", rng)
