"""Weight roles from GGUF names and from Hugging Face names (those every decoder shares, and a family's
own), with unknown tensors reported. Each family's own names are tested with it."""

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
# a family's own names (``ModelFamily.hf_tensor_names``), here a made-up one: they add to the shared
# names and may override them; ``{E}`` is an expert's index, "module.parameter" another parameter
OWN_NAMES = {
    "post_attention_layernorm": "attn_post_norm",
    "block.router": "ffn_gate_inp",
    "block.router.score_bias": "exp_probs_b",
    "block.experts.{E}.w_in": "ffn_up_exps",
}
OWN_HF = {
    "model.layers.2.post_attention_layernorm.weight": Role("attn_post_norm", 2),
    "model.layers.2.block.router.weight": Role("ffn_gate_inp", 2),
    "model.layers.2.block.router.score_bias": Role("exp_probs_b", 2, None, "bias"),
    "model.layers.2.block.experts.0.w_in.weight": Role("ffn_up_exps", 2, 0),
    "model.layers.2.block.experts.1.w_in.weight": Role("ffn_up_exps", 2, 1),
    "model.language_model.embed_tokens.weight": Role("token_embd"),
}


def test_hf_names_every_decoder_shares_map_to_roles():
    wm = wm_hf(list(LLAMA_HF))
    assert not wm.unknown
    for name, role in LLAMA_HF.items():
        assert wm.tensors[role].name == name


def test_a_familys_own_hf_names_add_to_and_override_the_shared_ones():
    wm = WeightMap.from_hf({n: T(n) for n in OWN_HF}, "test", OWN_NAMES)
    assert not wm.unknown
    for name, role in OWN_HF.items():
        assert wm.tensors[role].name == name
    assert [t.name for t in wm.experts("ffn_up_exps", 2)] == ["model.layers.2.block.experts.0.w_in.weight", "model.layers.2.block.experts.1.w_in.weight"]
    # without them, the shared meaning (the FFN's input norm) and the rest unknown, by name
    plain = wm_hf(list(OWN_HF))
    assert plain.tensors[Role("ffn_norm", 2)].name == "model.layers.2.post_attention_layernorm.weight"
    assert "model.layers.2.block.router.weight" in plain.unknown
    with pytest.raises(LoadError, match="roles that do not exist: \\['ffn_nonsense'\\]"):
        WeightMap.from_hf({}, "test", {"x": "ffn_nonsense"})


def test_unknown_and_ignored_tensors_are_reported():
    wm = wm_hf(["model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.0.weird.thing.weight", "vision_tower.x.weight", "model.norm.weight"])
    assert wm.ignored == ("model.layers.0.self_attn.rotary_emb.inv_freq",)
    assert wm.unknown == ("model.layers.0.weird.thing.weight", "vision_tower.x.weight")


def test_experts_in_order_and_gaps_are_errors():
    names = list(OWN_HF) + ["model.layers.3.block.experts.1.w_in.weight"]
    wm = WeightMap.from_hf({n: T(n) for n in names}, "test", OWN_NAMES)
    assert [t.name for t in wm.experts("ffn_up_exps", 2)] == [
        "model.layers.2.block.experts.0.w_in.weight",
        "model.layers.2.block.experts.1.w_in.weight",
    ]
    with pytest.raises(LoadError, match="not numbered 0..0"):
        wm.experts("ffn_up_exps", 3)


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
