"""The DeepSeek-V2 and V3 family (poot-deepseek): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights."""

from __future__ import annotations

import pytest

from poot.load.roles import Role
from poot.testing.families import assert_hf_names_map, assert_registered, check_synthetic, synthetic_cases
from poot_deepseek.family import DeepseekFamily

FAMILY = DeepseekFamily()


def test_registered_through_its_entry_point():
    assert_registered(FAMILY, "deepseek", "poot-deepseek")


HF_NAMES = {
    "model.layers.0.self_attn.q_a_proj.weight": Role("attn_q_a", 0),
    "model.layers.0.self_attn.q_a_layernorm.weight": Role("attn_q_a_norm", 0),
    "model.layers.0.self_attn.q_b_proj.weight": Role("attn_q_b", 0),
    "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": Role("attn_kv_a_mqa", 0),
    "model.layers.0.self_attn.kv_a_layernorm.weight": Role("attn_kv_a_norm", 0),
    "model.layers.0.self_attn.kv_b_proj.weight": Role("attn_kv_b", 0),
    "model.layers.4.mlp.gate.weight": Role("ffn_gate_inp", 4),
    "model.layers.4.mlp.gate.e_score_correction_bias": Role("exp_probs_b", 4, None, "bias"),
    "model.layers.4.mlp.shared_experts.down_proj.weight": Role("ffn_down_shexp", 4),
    "model.layers.4.mlp.experts.3.up_proj.weight": Role("ffn_up_exps", 4, 3),
}


def test_its_hf_tensor_names_map_to_roles():
    assert_hf_names_map(FAMILY, HF_NAMES)


@pytest.mark.parametrize("name", synthetic_cases(FAMILY.hf_architectures))
def test_matches_transformers_on_a_synthetic_checkpoint(name, tmp_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
    pytest.importorskip("transformers")
    check_synthetic(name, tmp_path, rng)
