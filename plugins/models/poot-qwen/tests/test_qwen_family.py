"""The Qwen2, Qwen3 and their MoE variants family (poot-qwen): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights."""

from __future__ import annotations

import pytest

from poot.load.roles import Role
from poot.testing.families import assert_hf_names_map, assert_registered, check_synthetic, synthetic_cases
from poot_qwen.family import QwenFamily

FAMILY = QwenFamily()


def test_registered_through_its_entry_point():
    assert_registered(FAMILY, "qwen", "poot-qwen")


HF_NAMES = {
    "model.layers.0.self_attn.q_norm.weight": Role("attn_q_norm", 0),
    "model.layers.0.self_attn.k_norm.weight": Role("attn_k_norm", 0),
    "model.layers.0.self_attn.q_proj.bias": Role("attn_q", 0, None, "bias"),
    "model.layers.2.mlp.gate.weight": Role("ffn_gate_inp", 2),
    "model.layers.2.mlp.experts.5.gate_proj.weight": Role("ffn_gate_exps", 2, 5),
    "model.layers.2.mlp.shared_expert.up_proj.weight": Role("ffn_up_shexp", 2),
    "model.layers.2.mlp.shared_expert_gate.weight": Role("ffn_gate_inp_shexp", 2),
}


def test_its_hf_tensor_names_map_to_roles():
    assert_hf_names_map(FAMILY, HF_NAMES)


@pytest.mark.parametrize("name", synthetic_cases(FAMILY.hf_architectures))
def test_matches_transformers_on_a_synthetic_checkpoint(name, tmp_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
    pytest.importorskip("transformers")
    check_synthetic(name, tmp_path, rng)
