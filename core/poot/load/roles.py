"""Weight roles: what each checkpoint tensor is for, whatever it was called.

Canonical role names follow GGUF's tensor names (``token_embd``, ``attn_q``, ``ffn_gate_exps`` ...),
the de-facto vocabulary of the field. GGUF names map directly; Hugging Face names map through the
names every transformers decoder shares (below) and the model family's own
(``ModelFamily.hf_tensor_names``). Tensors that match no role are reported by name, never silently
dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import LoadError
from .tensor import LazyTensor

__all__ = ["Role", "WeightMap", "GLOBAL_ROLES", "LAYER_ROLES", "EXPERT_ROLES", "HF_GLOBAL_NAMES", "HF_LAYER_NAMES", "gguf_name"]

GLOBAL_ROLES = frozenset({"token_embd", "token_embd_norm", "output", "output_norm", "rope_freqs"})
LAYER_ROLES = frozenset(
    {
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_qkv",
        "attn_output",
        "attn_q_norm",
        "attn_k_norm",
        "attn_post_norm",
        "ffn_norm",
        "ffn_post_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "ffn_gate_inp",
        "exp_probs_b",
        "ffn_gate_inp_shexp",
        "ffn_gate_shexp",
        "ffn_up_shexp",
        "ffn_down_shexp",
        "attn_q_a",
        "attn_q_a_norm",
        "attn_q_b",
        "attn_kv_a_mqa",
        "attn_kv_a_norm",
        "attn_kv_b",
        "attn_k_b",
        "attn_v_b",
        "rope_factors_long",
        "rope_factors_short",
    }
)
EXPERT_ROLES = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
_GGUF_ALIASES = {"attn_post_norm": "post_attention_norm", "ffn_post_norm": "post_ffw_norm"}
_GGUF_TO_ROLE = {v: k for k, v in _GGUF_ALIASES.items()}


@dataclass(frozen=True, order=True)
class Role:
    """A tensor's purpose: role name, layer (None for global tensors), expert (HF per-expert
    tensors; GGUF stacks experts into one tensor), and 'weight' or 'bias'."""

    name: str
    layer: int | None = None
    expert: int | None = None
    param: str = "weight"

    def __str__(self) -> str:
        return gguf_name(self)


def gguf_name(role: Role) -> str:
    """The GGUF tensor name of a role (per-expert roles get an expert suffix GGUF does not have)."""
    base = _GGUF_ALIASES.get(role.name, role.name)
    s = base if role.layer is None else f"blk.{role.layer}.{base}"
    if role.expert is not None:
        s += f".{role.expert}"
    return f"{s}.{role.param}"


_GGUF_RE = re.compile(r"^(?:blk\.(?P<layer>\d+)\.)?(?P<name>[a-z0-9_]+)\.(?P<param>weight|bias)$")


def _from_gguf(name: str) -> Role | None:
    m = _GGUF_RE.match(name)
    if not m:
        return None
    role = _GGUF_TO_ROLE.get(m["name"], m["name"])
    layer = int(m["layer"]) if m["layer"] is not None else None
    if layer is None and role in GLOBAL_ROLES or layer is not None and (role in LAYER_ROLES or role in EXPERT_ROLES):
        return Role(role, layer, None, m["param"])
    return None


# Hugging Face names every transformers decoder shares, after stripping a multimodal wrapper prefix:
# global modules, and a layer's (after ``model.layers.{L}.``). A family adds its own
# (``ModelFamily.hf_tensor_names``), which may override these.
HF_GLOBAL_NAMES = {
    "model.embed_tokens": "token_embd",
    "lm_head": "output",
    "model.norm": "output_norm",
}
HF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)\.(?P<param>[a-z_]+)$")


@dataclass(frozen=True)
class _HfNames:
    """A family's layer names joined to the shared ones: plain names, per-expert patterns
    (``{E}``), and parameters other than weight and bias (``module.parameter``)."""

    layer: dict[str, str]
    experts: tuple[tuple[re.Pattern[str], str], ...]

    @classmethod
    def of(cls, extra: Mapping[str, str]) -> "_HfNames":
        merged = {**HF_LAYER_NAMES, **extra}
        unknown = sorted(set(merged.values()) - LAYER_ROLES - EXPERT_ROLES)
        if unknown:
            raise LoadError("model family", f"hf_tensor_names maps to roles that do not exist: {unknown}")
        experts = tuple((re.compile("^" + re.escape(k).replace(r"\{E\}", r"(?P<expert>\d+)") + "$"), v) for k, v in merged.items() if "{E}" in k)
        return cls({k: v for k, v in merged.items() if "{E}" not in k}, experts)


def _from_hf(name: str, names: _HfNames) -> Role | None:
    if name.startswith("model.language_model."):  # multimodal wrappers around the text model
        name = "model." + name[len("model.language_model.") :]
    elif name.startswith("language_model."):
        name = name[len("language_model.") :]
    base, _, param = name.rpartition(".")
    if base in HF_GLOBAL_NAMES and param == "weight":
        return Role(HF_GLOBAL_NAMES[base], None, None, "weight")
    m = _HF_LAYER_RE.match(name)
    if not m:
        return None
    layer, rest, param = int(m["layer"]), m["rest"], m["param"]
    if param not in ("weight", "bias"):  # another parameter of a module: the role's bias, where named
        role = names.layer.get(f"{rest}.{param}")
        return Role(role, layer, None, "bias") if role else None
    if rest in names.layer:
        return Role(names.layer[rest], layer, None, param)
    for rx, role in names.experts:
        e = rx.match(rest)
        if e:
            return Role(role, layer, int(e["expert"]), param)
    return None


@dataclass
class WeightMap:
    """Roles to checkpoint tensors, plus what matched no role."""

    tensors: dict[Role, LazyTensor]
    unknown: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    names: dict[Role, str] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def from_gguf(cls, tensors: Mapping[str, LazyTensor], source: str = "") -> "WeightMap":
        roles: dict[Role, LazyTensor] = {}
        names: dict[Role, str] = {}
        unknown = []
        for name, t in tensors.items():
            r = _from_gguf(name)
            if r is None:
                unknown.append(name)
            else:
                roles[r], names[r] = t, name
        return cls(roles, tuple(sorted(unknown)), (), names, source)

    @classmethod
    def from_hf(cls, tensors: Mapping[str, LazyTensor], source: str = "", names: Mapping[str, str] | None = None) -> "WeightMap":
        """Roles of Hugging Face tensors: the names every decoder shares, and ``names`` (the model
        family's ``hf_tensor_names``)."""
        table = _HfNames.of(names or {})
        roles: dict[Role, LazyTensor] = {}
        names: dict[Role, str] = {}
        unknown, ignored = [], []
        for name, t in tensors.items():
            r = _from_hf(name, table)
            if r is None:
                (ignored if _HF_IGNORED.search(name) else unknown).append(name)
                continue
            if r in roles:
                raise LoadError(source or name, f"tensors '{names[r]}' and '{name}' both map to role {r}")
            roles[r], names[r] = t, name
        return cls(roles, tuple(sorted(unknown)), tuple(sorted(ignored)), names, source)

    # -- lookup ------------------------------------------------------------------------------------
    def get(self, name: str, layer: int | None = None, param: str = "weight") -> LazyTensor | None:
        return self.tensors.get(Role(name, layer, None, param))

    def require(self, name: str, layer: int | None = None, param: str = "weight") -> LazyTensor:
        t = self.get(name, layer, param)
        if t is None:
            raise LoadError(self.source or "checkpoint", f"missing tensor for role {Role(name, layer, None, param)} (no such tensor in the checkpoint)")
        return t

    def experts(self, name: str, layer: int) -> list[LazyTensor]:
        """Per-expert tensors of a role (HF layout), in expert order; empty if the experts are stacked."""
        found = sorted((r.expert, t) for r, t in self.tensors.items() if r.name == name and r.layer == layer and r.expert is not None)
        if [e for e, _ in found] != list(range(len(found))):
            raise LoadError(self.source or "checkpoint", f"experts of {name} in layer {layer} are not numbered 0..{len(found) - 1}: {[e for e, _ in found]}")
        return [t for _, t in found]

    @property
    def tied_output(self) -> bool:
        """True when the output head reuses the token embedding (no separate output tensor)."""
        return Role("output") not in self.tensors

    @property
    def n_layers(self) -> int:
        layers = [r.layer for r in self.tensors if r.layer is not None]
        return max(layers) + 1 if layers else 0

    def missing(self, required: Iterable[Role]) -> list[Role]:
        return [r for r in required if r not in self.tensors]

    def role_of(self, tensor_name: str) -> Role | None:
        for r, n in self.names.items():
            if n == tensor_name:
                return r
        return None
