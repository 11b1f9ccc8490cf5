"""Compositions (norms, activations, RoPE in every layout and scaling, gated MLPs, MoE routing, the
attention block) against numpy formulas written here, structured differently from the graph versions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from poot.eval import evaluate
from poot.graph import GraphBuilder, LinearScaling, Llama3Scaling, RopeConfig, YarnScaling, apply_rope, sym
from poot.graph.compose import (
    AttentionConfig,
    AttentionWeights,
    KvState,
    MlpWeights,
    MoeConfig,
    MoeWeights,
    activation,
    attention_block,
    gated_mlp,
    layer_norm,
    moe,
    rms_norm,
    softmax,
)

T = sym("tokens")


def f64(x):
    return np.asarray(x, dtype=np.float64)


@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm(unit_offset, rng):
    x, w = rng.standard_normal((5, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    b = GraphBuilder()
    g = b.build({"y": rms_norm(b, b.input("x", "f32", [T, 48]), b.weight("w", "f32", [48]), 1e-6, unit_offset)})
    y = evaluate(g, {"x": x}, {"w": w})["y"]
    scale = (1 + f64(w)) if unit_offset else f64(w)
    ref = np.stack([row / math.sqrt(sum(v * v for v in row) / len(row) + 1e-6) for row in f64(x)]) * scale
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_layer_norm_and_softmax(rng):
    x = rng.standard_normal((4, 33)).astype(np.float32) * 3 + 1
    w, bias = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    b = GraphBuilder()
    bx = b.input("x", "f32", [T, 33])
    g = b.build({"ln": layer_norm(b, bx, b.weight("w", "f32", [33]), b.weight("b", "f32", [33]), 1e-5), "sm": softmax(b, bx)})
    r = evaluate(g, {"x": x}, {"w": w, "b": bias})
    xd = f64(x)
    mu, var = xd.mean(1, keepdims=True), xd.var(1, keepdims=True)
    np.testing.assert_allclose(r["ln"], (xd - mu) / np.sqrt(var + 1e-5) * w + bias, rtol=1e-5, atol=1e-5)
    e = np.exp(xd)
    np.testing.assert_allclose(r["sm"], e / e.sum(1, keepdims=True), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["silu", "gelu", "gelu_tanh", "relu"])
def test_activations(kind, rng):
    x = rng.standard_normal((6, 10)).astype(np.float32) * 2
    b = GraphBuilder()
    y = evaluate(b.build({"y": activation(b, b.input("x", "f32", [T, 10]), kind)}), {"x": x})["y"]
    ref = {
        "silu": lambda v: v / (1 + math.exp(-v)),
        "gelu": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
        "gelu_tanh": lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "relu": lambda v: max(v, 0.0),
    }[kind]
    np.testing.assert_allclose(y, np.vectorize(ref)(f64(x)), rtol=1e-5, atol=1e-6)


# -- RoPE: reference by complex rotation, frequencies by per-dimension loops -----------------------


def ref_inv_freq(cfg: RopeConfig):
    d, base = cfg.dim, cfg.theta
    freqs = [base ** (-(2 * i) / d) for i in range(d // 2)]
    s, factor = cfg.scaling, 1.0
    if isinstance(s, LinearScaling):
        return [f / s.factor for f in freqs], 1.0
    if isinstance(s, Llama3Scaling):  # Llama 3.1 reference: per-frequency band rule
        out = []
        for f in freqs:
            wl = 2 * math.pi / f
            if wl < s.original_max_position / s.high_freq_factor:
                out.append(f)
            elif wl > s.original_max_position / s.low_freq_factor:
                out.append(f / s.factor)
            else:
                sm = (s.original_max_position / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                out.append((1 - sm) * f / s.factor + sm * f)
        return out, 1.0
    if isinstance(s, YarnScaling):  # YaRN, arXiv:2309.00071, section 3.2 "NTK-by-parts" + 3.4 temperature

        def dim_for(rot):
            return d * math.log(s.original_max_position / (rot * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = max(math.floor(dim_for(s.beta_fast)), 0), min(math.ceil(dim_for(s.beta_slow)), d - 1)
        out = []
        for i, f in enumerate(freqs):
            r = 0.0 if i < lo else 1.0 if i > hi else (i - lo) / (hi - lo)  # 0: keep, 1: interpolate
            out.append((1 - r) * f + r * f / s.factor)
        factor = 0.1 * math.log(s.factor) + 1.0
        return out, factor
    return freqs, factor


def ref_rope(x, pos, cfg: RopeConfig):
    inv, af = ref_inv_freq(cfg)
    out = f64(x).copy()
    half = cfg.dim // 2
    for t in range(x.shape[0]):
        for i in range(half):
            rot = complex(math.cos(pos[t] * inv[i]), math.sin(pos[t] * inv[i])) * af
            a, c = (i, i + half) if cfg.layout == "neox" else (2 * i, 2 * i + 1)
            z = (x[t, :, a].astype(np.float64) + 1j * x[t, :, c]) * rot
            out[t, :, a], out[t, :, c] = z.real, z.imag
    return out


ROPES = {
    "neox": RopeConfig(32, 10000.0, "neox"),
    "interleaved": RopeConfig(32, 500000.0, "interleaved"),
    "partial-neox": RopeConfig(16, 10000.0, "neox"),
    "partial-interleaved": RopeConfig(8, 10000.0, "interleaved"),
    "linear": RopeConfig(32, 10000.0, "neox", LinearScaling(4.0)),
    "llama3": RopeConfig(32, 500000.0, "neox", Llama3Scaling(8.0, 1.0, 4.0, 8192)),
    "yarn": RopeConfig(32, 10000.0, "neox", YarnScaling(4.0, 4096)),
    "yarn-interleaved": RopeConfig(32, 10000.0, "interleaved", YarnScaling(40.0, 4096, beta_fast=32, beta_slow=1)),
}


@pytest.mark.parametrize("name", sorted(ROPES))
def test_rope(name, rng):
    cfg = ROPES[name]
    x = rng.standard_normal((6, 3, 32)).astype(np.float32)
    pos = rng.integers(0, 20000, size=6).astype(np.int32)
    b = GraphBuilder()
    y = apply_rope(b, b.input("x", "f32", [T, 3, 32]), b.input("pos", "i32", [T]), cfg)
    got = evaluate(b.build({"y": y}), {"x": x, "pos": pos})["y"]
    # float32 angles at positions up to 2e4 carry ~1e-3 absolute phase error, as in every f32 implementation
    np.testing.assert_allclose(got, ref_rope(x, pos, cfg), rtol=0, atol=5e-3)
    got64 = evaluate(b.build({"y": y}), {"x": x, "pos": pos}, float64=True)["y"]
    np.testing.assert_allclose(got64, ref_rope(x, pos, cfg), rtol=0, atol=5e-3)
    small = pos % 64
    np.testing.assert_allclose(evaluate(b.build({"y": y}), {"x": x, "pos": small})["y"], ref_rope(x, small, cfg), rtol=0, atol=2e-5)


# -- MLP and MoE ------------------------------------------------------------------------------------


def ref_glu(x, gate, up, down, act):
    a = {"silu": lambda v: v / (1 + np.exp(-v)), "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))}[act]
    return (a(f64(x) @ f64(gate).T) * (f64(x) @ f64(up).T)) @ f64(down).T


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gated_mlp(act, rng):
    D, F = 24, 40
    x = rng.standard_normal((5, D)).astype(np.float32)
    ws = {n: rng.standard_normal(s).astype(np.float32) * 0.3 for n, s in (("g", (F, D)), ("u", (F, D)), ("d", (D, F)))}
    b = GraphBuilder()
    w = MlpWeights(b.weight("g", "f32", [F, D]), b.weight("u", "f32", [F, D]), b.weight("d", "f32", [D, F]))
    y = evaluate(b.build({"y": gated_mlp(b, b.input("x", "f32", [T, D]), w, act)}), {"x": x}, ws)["y"]
    np.testing.assert_allclose(y, ref_glu(x, ws["g"], ws["u"], ws["d"], act), rtol=1e-4, atol=1e-4)


def ref_moe(x, ws, cfg: MoeConfig):
    out = np.zeros((x.shape[0], x.shape[1]))
    for t in range(x.shape[0]):
        logits = f64(ws["router"]) @ f64(x[t])
        scores = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum() if cfg.score == "softmax" else 1 / (1 + np.exp(-logits))
        choice = scores + (f64(ws["bias"]) if "bias" in ws else 0)
        allowed = list(range(cfg.experts))
        if cfg.groups > 1:
            per = cfg.experts // cfg.groups

            def gscore(g):
                vals = sorted(choice[g * per : (g + 1) * per], reverse=True)
                return vals[0] if cfg.group_score == "max" else vals[0] + vals[1]

            best = sorted(range(cfg.groups), key=lambda g: (-gscore(g), g))[: cfg.topk_groups]
            allowed = [e for e in allowed if e // per in best]
        chosen = sorted(allowed, key=lambda e: (-choice[e], e))[: cfg.top_k]
        wts = np.array([scores[e] for e in chosen])
        if cfg.normalize:
            wts = wts / wts.sum()
        wts = wts * cfg.scale
        for e, wt in zip(chosen, wts):
            out[t] += wt * ref_glu(x[t : t + 1], ws["gate"][e], ws["up"][e], ws["down"][e], cfg.act)[0]
        if "sg" in ws:
            s = ref_glu(x[t : t + 1], ws["sg"], ws["su"], ws["sd"], cfg.act)[0]
            if "sgate" in ws:
                s = s / (1 + np.exp(-(f64(ws["sgate"]) @ f64(x[t]))[0]))
            out[t] += s
    return out


MOES = {
    "mixtral": (MoeConfig(8, 2), dict()),
    "qwen2-moe": (MoeConfig(6, 2, normalize=False), dict(shared=True, shared_gate=True)),
    "deepseek-v2": (MoeConfig(8, 3, normalize=False, scale=2.5, groups=4, topk_groups=2, group_score="max"), dict(shared=True)),
    "deepseek-v3": (MoeConfig(8, 3, score="sigmoid", normalize=True, scale=2.5, groups=4, topk_groups=2, group_score="top2"), dict(shared=True, bias=True)),
}


@pytest.mark.parametrize("name", sorted(MOES))
def test_moe_routing_and_mixing(name, rng):
    cfg, extra = MOES[name]
    E, D, F = cfg.experts, 16, 12
    x = rng.standard_normal((7, D)).astype(np.float32)
    ws = {
        "router": rng.standard_normal((E, D)).astype(np.float32),
        "gate": rng.standard_normal((E, F, D)).astype(np.float32) * 0.3,
        "up": rng.standard_normal((E, F, D)).astype(np.float32) * 0.3,
        "down": rng.standard_normal((E, D, F)).astype(np.float32) * 0.3,
    }
    b = GraphBuilder()
    wv = {n: b.weight(n, "f32", list(a.shape)) for n, a in ws.items()}
    shared = sg = bias = None
    if extra.get("shared"):
        for n, s in (("sg", (F, D)), ("su", (F, D)), ("sd", (D, F))):
            ws[n] = rng.standard_normal(s).astype(np.float32) * 0.3
        shared = MlpWeights(*(b.weight(n, "f32", list(ws[n].shape)) for n in ("sg", "su", "sd")))
    if extra.get("shared_gate"):
        ws["sgate"] = rng.standard_normal((1, D)).astype(np.float32)
        sg = b.weight("sgate", "f32", [1, D])
    if extra.get("bias"):
        ws["bias"] = rng.standard_normal(E).astype(np.float32) * 0.5
        bias = b.weight("bias", "f32", [E])
    w = MoeWeights(wv["router"], wv["gate"], wv["up"], wv["down"], choice_bias=bias, shared=shared, shared_gate=sg)
    y = evaluate(b.build({"y": moe(b, b.input("x", "f32", [T, D]), w, cfg)}), {"x": x}, ws)["y"]
    np.testing.assert_allclose(y, ref_moe(x, ws, cfg), rtol=1e-4, atol=1e-4)


# -- the attention block ----------------------------------------------------------------------------


@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_block_writes_pool_and_attends(qk_norm, rng):
    D, H, Hkv, Dh, bs, NB = 32, 4, 2, 8, 4, 6
    cfg = AttentionConfig(H, Hkv, Dh, RopeConfig(Dh, 10000.0, "neox"), qk_norm_eps=1e-6 if qk_norm else None)
    # one sequence of 5 prompt tokens, prefilled in one step into shuffled blocks
    n = 5
    order = rng.permutation(NB)
    tables = np.array([[order[0], order[1]]], np.int32)
    pos = np.arange(n, dtype=np.int32)
    slots = (tables[0, pos // bs] * bs + pos % bs).astype(np.int32)
    x = rng.standard_normal((n, D)).astype(np.float32)
    ws = {
        k: rng.standard_normal(s).astype(np.float32) * 0.3
        for k, s in (("q", (H * Dh, D)), ("k", (Hkv * Dh, D)), ("v", (Hkv * Dh, D)), ("o", (D, H * Dh)), ("qn", (Dh,)), ("kn", (Dh,)))
    }
    pool = rng.standard_normal((NB, bs, Hkv, Dh)).astype(np.float32)

    b = GraphBuilder()
    w = AttentionWeights(
        *(b.weight(k, "f32", list(ws[k].shape)) for k in ("q", "k", "v", "o")),
        q_norm=b.weight("qn", "f32", [Dh]) if qk_norm else None,
        k_norm=b.weight("kn", "f32", [Dh]) if qk_norm else None,
    )
    kv = KvState(
        b.input("kp", "f32", list(pool.shape)),
        b.input("vp", "f32", list(pool.shape)),
        b.input("slots", "i32", [T]),
        b.input("pos", "i32", [T]),
        b.input("seq", "i32", [T]),
        b.input("ctx", "i32", [1]),
        b.input("bt", "i32", [1, 2]),
    )
    out, kp, vp = attention_block(b, b.input("x", "f32", [T, D]), w, cfg, kv)
    if not qk_norm:
        ws.pop("qn"), ws.pop("kn")
    r = evaluate(
        b.build({"out": out, "kp": kp, "vp": vp}),
        dict(x=x, kp=pool, vp=pool.copy(), slots=slots, pos=pos, seq=np.zeros(n, np.int32), ctx=np.array([n], np.int32), bt=tables),
        ws,
    )

    def norm(z, wn):
        return z / np.sqrt((z * z).mean(-1, keepdims=True) + 1e-6) * wn if qk_norm else z

    q = norm((f64(x) @ f64(ws["q"]).T).reshape(n, H, Dh), ws.get("qn"))
    k = norm((f64(x) @ f64(ws["k"]).T).reshape(n, Hkv, Dh), ws.get("kn"))
    v = (f64(x) @ f64(ws["v"]).T).reshape(n, Hkv, Dh)
    q, k = ref_rope(q, pos, cfg.rope), ref_rope(k, pos, cfg.rope)
    flat_k = r["kp"].reshape(NB * bs, Hkv, Dh)
    np.testing.assert_allclose(flat_k[slots], k, rtol=1e-4, atol=1e-4)
    untouched = np.setdiff1d(np.arange(NB * bs), slots)
    np.testing.assert_array_equal(flat_k[untouched], pool.reshape(NB * bs, Hkv, Dh)[untouched])
    att = np.zeros((n, H, Dh))
    for h in range(H):
        s = q[:, h] @ k[:, h // 2].T / math.sqrt(Dh)
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        att[:, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // 2]
    np.testing.assert_allclose(r["out"], att.reshape(n, H * Dh) @ f64(ws["o"]).T, rtol=1e-4, atol=1e-4)
