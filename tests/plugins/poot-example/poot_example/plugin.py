"""Hook implementations of the example plugin, written only against poot's public API."""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from poot import hookimpl
from poot.backend import Device, Unavailable
from poot.models import ConfigError, DecoderConfig, DecoderFamily, ModelFamily
from poot.models.config import check_heads, hf_int, hf_rope, layers_uniform


class ExampleFamily(DecoderFamily):
    """A decoder family of its own: an architecture name, a config.json spelled its own way, tensor
    names of its own (mapped to the roles every decoder has) and a chat template, all through
    ``poot.models`` alone; the shared tracer builds its graph."""

    name = "example"
    gguf_architectures = ("example-arch",)
    hf_architectures = ("ExampleForCausalLM",)
    hf_tensor_names = MappingProxyType(
        {
            "norm1": "attn_norm",
            "norm2": "ffn_norm",
            "attn.wq": "attn_q",
            "attn.wk": "attn_k",
            "attn.wv": "attn_v",
            "attn.wo": "attn_output",
            "ffn.w1": "ffn_gate",
            "ffn.w3": "ffn_up",
            "ffn.w2": "ffn_down",
        }
    )
    default_chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"

    def config_from_hf(self, cfg: Mapping[str, Any], weights: Any) -> DecoderConfig:
        heads, kv, dim = hf_int(cfg, "n_heads"), hf_int(cfg, "n_kv_heads"), hf_int(cfg, "dim")
        check_heads(heads, kv, "config.json")
        rope = hf_rope(cfg, dim // heads)
        return DecoderConfig(
            "example",
            "ExampleForCausalLM",
            hf_int(cfg, "vocab"),
            dim,
            heads,
            kv,
            dim // heads,
            hf_int(cfg, "ffn_dim"),
            layers_uniform(hf_int(cfg, "n_layers"), rope),
            float(cfg.get("norm_eps", 1e-5)),
        )

    def config_from_gguf(self, metadata: Mapping[str, Any], weights: Any) -> DecoderConfig:
        raise ConfigError("the example family reads config.json only")


@hookimpl
def poot_devices() -> list[Device]:
    from .backend import devices

    return [Device("example", 0, "example accelerator", unavailable=Unavailable("no-device", "the example plugin has no hardware")), *devices()]


@hookimpl
def poot_codegen_target(device: Device) -> Any:
    if device.kind != "excpu":
        return None
    from .backend import baseline_target

    return baseline_target()


@hookimpl
def poot_kernel_runner(device: Device) -> Any:
    if device.kind != "excpu":
        return None
    from .backend import kernel_runner

    return kernel_runner()


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [ExampleFamily()]
