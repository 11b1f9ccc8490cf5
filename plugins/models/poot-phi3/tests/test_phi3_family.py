"""The Phi-3 family (poot-phi3): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights."""

from __future__ import annotations

import pytest

from poot.load.roles import Role
from poot.testing.families import assert_hf_names_map, assert_registered, check_synthetic, synthetic_cases
from poot_phi3.family import Phi3Family

FAMILY = Phi3Family()


def test_registered_through_its_entry_point():
    assert_registered(FAMILY, "phi3", "poot-phi3")


HF_NAMES = {
    "model.layers.0.self_attn.qkv_proj.weight": Role("attn_qkv", 0),
    "model.layers.0.mlp.gate_up_proj.weight": Role("ffn_up", 0),
}


def test_its_hf_tensor_names_map_to_roles():
    assert_hf_names_map(FAMILY, HF_NAMES)


@pytest.mark.parametrize("name", synthetic_cases(FAMILY.hf_architectures))
def test_matches_transformers_on_a_synthetic_checkpoint(name, tmp_path, rng):
    pytest.importorskip("torch", reason="transformers (with torch) is the oracle for the families")
    pytest.importorskip("transformers")
    check_synthetic(name, tmp_path, rng)
