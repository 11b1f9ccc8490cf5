"""The Phi-3 family (poot-phi3): registered through its entry point, its Hugging Face tensor
names, and every synthetic checkpoint of its architectures against transformers' forward of the
same weights."""

from __future__ import annotations

import pytest

from poot.load.roles import Role, WeightMap
from poot.models import family_for, model_families
from poot.plugins import host
from poot.testing.families import check_synthetic, synthetic_cases
from poot_phi3.family import Phi3Family

FAMILY = Phi3Family()


def test_registered_through_its_entry_point():
    info = {i.name: i for i in host().infos}["phi3"]
    assert info.status == "loaded" and info.distribution == "poot-phi3"
    assert [f for p, f in model_families() if p == "phi3"] and all(
        isinstance(family_for(a), Phi3Family) for a in FAMILY.gguf_architectures + FAMILY.hf_architectures
    )


class T:
    """A stand-in for LazyTensor: roles only look at names."""

    def __init__(self, name: str) -> None:
        self.name = name


HF_NAMES = {
    "model.layers.0.self_attn.qkv_proj.weight": Role("attn_qkv", 0),
    "model.layers.0.mlp.gate_up_proj.weight": Role("ffn_up", 0),
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
