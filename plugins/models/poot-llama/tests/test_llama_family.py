"""The Llama, Mistral and Mixtral family (poot-llama): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights, and a real checkpoint."""

from __future__ import annotations

import pytest

from poot.load.roles import Role
from poot.testing.families import assert_hf_names_map, assert_registered, check_real_checkpoint, check_synthetic, synthetic_cases
from poot_llama.family import LlamaFamily

FAMILY = LlamaFamily()


def test_registered_through_its_entry_point():
    assert_registered(FAMILY, "llama", "poot-llama")


HF_NAMES = {
    "model.layers.1.block_sparse_moe.gate.weight": Role("ffn_gate_inp", 1),
    "model.layers.1.block_sparse_moe.experts.0.w1.weight": Role("ffn_gate_exps", 1, 0),
    "model.layers.1.block_sparse_moe.experts.1.w1.weight": Role("ffn_gate_exps", 1, 1),
    "model.layers.1.block_sparse_moe.experts.0.w3.weight": Role("ffn_up_exps", 1, 0),
    "model.layers.1.block_sparse_moe.experts.0.w2.weight": Role("ffn_down_exps", 1, 0),
    "model.layers.1.post_attention_layernorm.weight": Role("ffn_norm", 1),
}


def test_its_hf_tensor_names_map_to_roles():
    assert_hf_names_map(FAMILY, HF_NAMES)


@pytest.mark.parametrize("name", synthetic_cases(FAMILY.hf_architectures))
def test_matches_transformers_on_a_synthetic_checkpoint(name, tmp_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
    pytest.importorskip("transformers")
    check_synthetic(name, tmp_path, rng)


@pytest.mark.slow
def test_matches_transformers_on_the_real_checkpoint(smollm2_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for real checkpoints")
    pytest.importorskip("transformers")
    check_real_checkpoint(smollm2_path, "smollm2", rng)
