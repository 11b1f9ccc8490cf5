"""The DeepSeek-V2 and V3 family (poot-deepseek): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights."""

from __future__ import annotations

import pytest

from poot.load.roles import Role, WeightMap
from poot.models import family_for, model_families
from poot.plugins import host
from poot.testing.families import check_synthetic, synthetic_cases
from poot_deepseek.family import DeepseekFamily

FAMILY = DeepseekFamily()


def test_registered_through_its_entry_point():
    info = {i.name: i for i in host().infos}["deepseek"]
    assert info.status == "loaded" and info.distribution == "poot-deepseek"
    assert [f for p, f in model_families() if p == "deepseek"] and all(
        isinstance(family_for(a), DeepseekFamily) for a in FAMILY.gguf_architectures + FAMILY.hf_architectures
    )


class T:
    """A stand-in for LazyTensor: roles only look at names."""

    def __init__(self, name: str) -> None:
        self.name = name


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
    wm = WeightMap.from_hf({n: T(n) for n in HF_NAMES}, "test", FAMILY.hf_tensor_names)
    assert not wm.unknown, wm.unknown
    for name, role in HF_NAMES.items():
        assert wm.tensors[role].name == name


@pytest.mark.parametrize("name", synthetic_cases(FAMILY.hf_architectures))
def test_matches_transformers_on_a_synthetic_checkpoint(name, tmp_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
    pytest.importorskip("transformers")
    check_synthetic(name, tmp_path, rng)
