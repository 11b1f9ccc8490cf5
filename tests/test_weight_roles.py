"""Weight roles from GGUF names and from Hugging Face names of every family, with unknown tensors reported."""

from __future__ import annotations

import pytest

from poot.errors import LoadError
from poot.load.roles import Role, WeightMap, gguf_name


class T:
    """A stand-in for LazyTensor: roles only look at names."""

    def __init__(self, name: str) -> None:
        self.name = name


def wm_hf(names):
    return WeightMap.from_hf({n: T(n) for n in names}, "test")


def wm_gguf(names):
    return WeightMap.from_gguf({n: T(n) for n in names}, "test")


LLAMA_HF = {
    "model.embed_tokens.weight": Role("token_embd"),
    "lm_head.weight": Role("output"),
    "model.norm.weight": Role("output_norm"),
    "model.layers.0.input_layernorm.weight": Role("attn_norm", 0),
    "model.layers.0.post_attention_layernorm.weight": Role("ffn_norm", 0),
    "model.layers.0.self_attn.q_proj.weight": Role("attn_q", 0),
    "model.layers.0.self_attn.q_proj.bias": Role("attn_q", 0, None, "bias"),
    "model.layers.0.self_attn.k_proj.weight": Role("attn_k", 0),
    "model.layers.0.self_attn.v_proj.weight": Role("attn_v", 0),
    "model.layers.0.self_attn.o_proj.weight": Role("attn_output", 0),
    "model.layers.0.mlp.gate_proj.weight": Role("ffn_gate", 0),
    "model.layers.0.mlp.up_proj.weight": Role("ffn_up", 0),
    "model.layers.0.mlp.down_proj.weight": Role("ffn_down", 0),
}
GEMMA_HF = {
    "model.layers.3.post_attention_layernorm.weight": Role("attn_post_norm", 3),
    "model.layers.3.pre_feedforward_layernorm.weight": Role("ffn_norm", 3),
    "model.layers.3.post_feedforward_layernorm.weight": Role("ffn_post_norm", 3),
    "model.layers.3.self_attn.q_norm.weight": Role("attn_q_norm", 3),
    "model.layers.3.self_attn.k_norm.weight": Role("attn_k_norm", 3),
    "model.language_model.embed_tokens.weight": Role("token_embd"),
}
MOE_HF = {
    "model.layers.1.block_sparse_moe.gate.weight": Role("ffn_gate_inp", 1),
    "model.layers.1.block_sparse_moe.experts.0.w1.weight": Role("ffn_gate_exps", 1, 0),
    "model.layers.1.block_sparse_moe.experts.1.w1.weight": Role("ffn_gate_exps", 1, 1),
    "model.layers.1.block_sparse_moe.experts.0.w3.weight": Role("ffn_up_exps", 1, 0),
    "model.layers.1.block_sparse_moe.experts.0.w2.weight": Role("ffn_down_exps", 1, 0),
    "model.layers.2.mlp.experts.5.gate_proj.weight": Role("ffn_gate_exps", 2, 5),
    "model.layers.2.mlp.shared_expert.up_proj.weight": Role("ffn_up_shexp", 2),
    "model.layers.2.mlp.shared_expert_gate.weight": Role("ffn_gate_inp_shexp", 2),
    "model.layers.4.mlp.shared_experts.down_proj.weight": Role("ffn_down_shexp", 4),
    "model.layers.4.mlp.gate.e_score_correction_bias": Role("exp_probs_b", 4, None, "bias"),
}
MLA_HF = {
    "model.layers.0.self_attn.q_a_proj.weight": Role("attn_q_a", 0),
    "model.layers.0.self_attn.q_a_layernorm.weight": Role("attn_q_a_norm", 0),
    "model.layers.0.self_attn.q_b_proj.weight": Role("attn_q_b", 0),
    "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": Role("attn_kv_a_mqa", 0),
    "model.layers.0.self_attn.kv_a_layernorm.weight": Role("attn_kv_a_norm", 0),
    "model.layers.0.self_attn.kv_b_proj.weight": Role("attn_kv_b", 0),
}
PHI3_HF = {
    "model.layers.0.self_attn.qkv_proj.weight": Role("attn_qkv", 0),
    "model.layers.0.mlp.gate_up_proj.weight": Role("ffn_up", 0),
}


@pytest.mark.parametrize("table", [LLAMA_HF, GEMMA_HF, MOE_HF, MLA_HF, PHI3_HF], ids=["llama", "gemma", "moe", "mla", "phi3"])
def test_hf_names_map_to_roles(table):
    wm = wm_hf(list(table))
    assert not wm.unknown
    for name, role in table.items():
        assert wm.tensors[role].name == name


def test_unknown_and_ignored_tensors_are_reported():
    wm = wm_hf(["model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.0.weird.thing.weight", "vision_tower.x.weight", "model.norm.weight"])
    assert wm.ignored == ("model.layers.0.self_attn.rotary_emb.inv_freq",)
    assert wm.unknown == ("model.layers.0.weird.thing.weight", "vision_tower.x.weight")


def test_experts_in_order_and_gaps_are_errors():
    wm = wm_hf(list(MOE_HF))
    assert [t.name for t in wm.experts("ffn_gate_exps", 1)] == [
        "model.layers.1.block_sparse_moe.experts.0.w1.weight",
        "model.layers.1.block_sparse_moe.experts.1.w1.weight",
    ]
    with pytest.raises(LoadError, match="not numbered 0..0"):
        wm.experts("ffn_gate_exps", 2)


def test_gguf_names_and_the_reverse_mapping():
    names = [
        "token_embd.weight",
        "output_norm.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_q.bias",
        "blk.7.post_attention_norm.weight",
        "blk.7.post_ffw_norm.weight",
        "blk.2.ffn_gate_exps.weight",
        "blk.2.exp_probs_b.bias",
        "rope_freqs.weight",
        "blk.1.mystery.weight",
        "odd",
    ]
    wm = wm_gguf(names)
    assert wm.unknown == ("blk.1.mystery.weight", "odd")
    assert wm.tied_output and wm.n_layers == 8
    for role, name in wm.names.items():
        assert gguf_name(role) == name
    assert wm.get("attn_post_norm", 7).name == "blk.7.post_attention_norm.weight"
    with pytest.raises(LoadError, match=r"missing tensor for role blk.3.attn_k.weight"):
        wm.require("attn_k", 3)


def test_two_names_for_one_role_is_an_error():
    with pytest.raises(LoadError, match="both map to role"):
        wm_hf(["model.embed_tokens.weight", "language_model.model.embed_tokens.weight"])


def test_real_checkpoints_map_every_tensor(smollm2_path, gemma3_path):
    from poot.load import open_checkpoint

    for path, layers in ((smollm2_path, 30), (gemma3_path, 18)):
        wm = open_checkpoint(path).weights
        assert not wm.unknown, wm.unknown
        assert wm.n_layers == layers and wm.tied_output
        for i in range(layers):
            for r in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                wm.require(r, i)
