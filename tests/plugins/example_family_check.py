"""Run in a process that has the example plugin installed (``tests/test_plugins.py``): one random
decoder written twice into DIR, with transformers' Llama names and config (``llama/``) and with the
example family's own (``example/``); both opened, mapped to roles and run on the oracle for the same
batch. Prints a JSON report: unknown tensors, the roles found, the largest logit difference, and a
conversation rendered with the example family's chat template."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from poot.eval.model import PagedOracle, oracle_weights
from poot.load import open_checkpoint
from poot.models import StepShapes, family_for
from poot.testing.paged import PagedSequences
from poot.text.chat import ChatTemplate

DIM, HEADS, KV, FFN, VOCAB, LAYERS = 32, 4, 2, 48, 64, 2
# the example family's names for transformers' Llama modules (``ExampleFamily.hf_tensor_names``)
RENAME = {
    "input_layernorm": "norm1",
    "post_attention_layernorm": "norm2",
    "self_attn.q_proj": "attn.wq",
    "self_attn.k_proj": "attn.wk",
    "self_attn.v_proj": "attn.wv",
    "self_attn.o_proj": "attn.wo",
    "mlp.gate_proj": "ffn.w1",
    "mlp.up_proj": "ffn.w3",
    "mlp.down_proj": "ffn.w2",
}


def write(directory: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    hd = DIM // HEADS
    shapes = {
        "input_layernorm": (DIM,),
        "post_attention_layernorm": (DIM,),
        "self_attn.q_proj": (HEADS * hd, DIM),
        "self_attn.k_proj": (KV * hd, DIM),
        "self_attn.v_proj": (KV * hd, DIM),
        "self_attn.o_proj": (DIM, HEADS * hd),
        "mlp.gate_proj": (FFN, DIM),
        "mlp.up_proj": (FFN, DIM),
        "mlp.down_proj": (DIM, FFN),
    }
    llama = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, DIM)), "model.norm.weight": 1 + 0.1 * rng.standard_normal(DIM)}
    llama["lm_head.weight"] = rng.standard_normal((VOCAB, DIM)) * 0.2
    for layer in range(LAYERS):
        for name, shape in shapes.items():
            w = 1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else rng.standard_normal(shape) * 0.2
            llama[f"model.layers.{layer}.{name}.weight"] = w
    llama = {k: v.astype(np.float32) for k, v in llama.items()}
    example = {}
    for k, v in llama.items():
        for hf, own in RENAME.items():
            k = k.replace(f".{hf}.", f".{own}.")
        example[k] = v
    common = {"rope_theta": 10000.0, "max_position_embeddings": 256}
    configs = {
        "llama": {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": DIM,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV,
            "intermediate_size": FFN,
            "vocab_size": VOCAB,
            "num_hidden_layers": LAYERS,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            **common,
        },
        "example": {
            "architectures": ["ExampleForCausalLM"],
            "dim": DIM,
            "n_heads": HEADS,
            "n_kv_heads": KV,
            "ffn_dim": FFN,
            "vocab": VOCAB,
            "n_layers": LAYERS,
            **common,
        },
    }
    for which, tensors in (("llama", llama), ("example", example)):
        d = directory / which
        d.mkdir(parents=True)
        save_file(tensors, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(configs[which]))


def logits(path: Path, seed: int) -> tuple[np.ndarray, list[str], int, str]:
    ck = open_checkpoint(path)
    fam = family_for(ck.architecture)
    model = PagedOracle(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4)), oracle_weights(ck.weights), num_blocks=16)
    rng = np.random.default_rng(seed)
    pages = PagedSequences(16, 4, rng)
    pages.add(), pages.add()
    tokens = [[int(t) for t in rng.integers(0, VOCAB, n)] for n in (11, 5)]
    return model.step(pages.step(tokens, all_logits=True)), list(ck.weights.unknown), len(ck.weights.tensors), fam.name


def main() -> None:
    directory, seed = Path(sys.argv[1]), int(sys.argv[2])
    write(directory, seed)
    mine, unknown, roles, name = logits(directory / "example", seed)
    theirs, _, _, _ = logits(directory / "llama", seed)
    template = ChatTemplate(family_for("ExampleForCausalLM").default_chat_template).render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    print(
        json.dumps(
            {
                "family": name,
                "unknown": unknown,
                "roles": roles,
                "max_diff": float(np.abs(mine - theirs).max()),
                "finite": bool(np.isfinite(mine).all()),
                "chat": template,
            }
        )
    )


if __name__ == "__main__":
    main()
