"""Synthesized kernels on the host target against the CPU oracle: fresh random inputs, poisoned
outputs (every element must be written), sizes that are not multiples of the tile sizes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from poot.eval import evaluate
from poot.graph import GraphBuilder, RopeConfig, YarnScaling, apply_rope, rope_frequencies
from poot.graph.compose import layer_norm as g_layer_norm
from poot.graph.compose import rms_norm as g_rms_norm
from poot.graph.compose import softmax as g_softmax
from poot.kernel.library import gather, linear, norms, rope
from poot.quant import quantization
from poot.quant.bodies import BODIES, LUTS
from poot.testing.kernels import assert_draws_match, poisoned, run_host


def oracle(build, inputs, weights=None):
    b = GraphBuilder()
    out = build(b)
    return evaluate(b.build({"y": out}), inputs, weights or {})["y"]


@pytest.mark.parametrize("rows,cols,block,unit", [(3, 77, 32, False), (5, 300, 128, True), (1, 1, 64, False)])
def test_rms_norm(rng, rows, cols, block, unit):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    y = poisoned((rows, cols))
    run_host(norms.rms_norm.instantiate(BLOCK=block, UNIT_OFFSET=unit), (rows,), {"x": x, "w": w, "y": y}, {"cols": cols, "eps": 1e-5})
    want = oracle(lambda b: g_rms_norm(b, b.input("x", "f32", [rows, cols]), b.weight("w", "f32", [cols]), 1e-5, unit), {"x": x}, {"w": w})
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    "rows,cols,block,unit,lanes",
    [(3, 77, 32, False, False), (5, 300, 128, True, False), (2, 4096, 1024, False, False), (3, 77, 1, False, True), (4, 300, 1, True, True)],
)
def test_add_rms_norm(rng, rows, cols, block, unit, lanes):
    """The residual add and the norm of its sum in one kernel: both outputs against the oracle."""
    a, b = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(cols).astype(np.float32)
    h, y = poisoned((rows, cols)), poisoned((rows, cols))
    k = norms.add_rms_norm_lanes.instantiate(UNIT_OFFSET=unit) if lanes else norms.add_rms_norm.instantiate(BLOCK=block, UNIT_OFFSET=unit)
    run_host(k, (rows,), {"a": a, "b": b, "w": w, "h": h, "y": y}, {"cols": cols, "eps": 1e-5})
    np.testing.assert_array_equal(h, a + b)
    want = oracle(lambda g: g_rms_norm(g, g.input("x", "f32", [rows, cols]), g.weight("w", "f32", [cols]), 1e-5, unit), {"x": a + b}, {"w": w})
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("wt,cols,add", [("bf16", 301, False), ("f16", 300, False), ("bf16", 256, True)])
def test_norms_read_16_bit_weights_as_stored(rng, wt, cols, add):
    """RMSNorm weights bound as their 16-bit values (an odd count too): SPIR-V reads them as halves of
    32-bit words, other targets as 16-bit loads."""
    rows = 3
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w32 = (rng.standard_normal(cols) * 0.5 + 1).astype(np.float32)
    stored = (w32.view(np.uint32) >> 16).astype(np.uint16) if wt == "bf16" else w32.astype(np.float16)
    wide = (stored.astype(np.uint32) << 16).view(np.float32) if wt == "bf16" else stored.astype(np.float32)
    y = poisoned((rows, cols))
    if add:
        b, h = rng.standard_normal((rows, cols)).astype(np.float32), poisoned((rows, cols))
        run_host(norms.add_rms_norm.instantiate(BLOCK=64, WT=wt), (rows,), {"a": x - b, "b": b, "w": stored, "h": h, "y": y}, {"cols": cols, "eps": 1e-5})
        x = h
    else:
        run_host(norms.rms_norm.instantiate(BLOCK=64, WT=wt), (rows,), {"x": x, "w": stored, "y": y}, {"cols": cols, "eps": 1e-5})
    want = oracle(lambda g: g_rms_norm(g, g.input("x", "f32", [rows, cols]), g.weight("w", "f32", [cols]), 1e-5, False), {"x": x}, {"w": wide})
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("rows,cols", [(4, 50), (2, 513)])
def test_layer_norm(rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 3 + 1).astype(np.float32)
    w, bias = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    y = poisoned((rows, cols))
    run_host(norms.layer_norm.instantiate(BLOCK=64), (rows,), {"x": x, "w": w, "b": bias, "y": y}, {"cols": cols, "eps": 1e-5})
    want = oracle(
        lambda b: g_layer_norm(b, b.input("x", "f32", [rows, cols]), b.weight("w", "f32", [cols]), b.weight("b", "f32", [cols]), 1e-5),
        {"x": x},
        {"w": w, "b": bias},
    )
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("cols,softcap", [(37, 0.0), (1000, 0.0), (129, 4.0)])
def test_softmax(rng, cols, softcap):
    rows = 3
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    y = poisoned((rows, cols))
    run_host(norms.softmax.instantiate(BLOCK=64, SOFTCAP=softcap), (rows,), {"x": x, "y": y}, {"cols": cols, "scale": 0.7})

    def build(b):
        v = b.mul(b.input("x", "f32", [rows, cols]), 0.7)
        if softcap:
            v = b.mul(b.tanh(b.mul(v, 1 / softcap)), softcap)
        return g_softmax(b, v)

    np.testing.assert_allclose(y, oracle(build, {"x": x}), rtol=1e-5, atol=1e-7)


def test_argmax_with_ties(rng):
    rows, cols = 6, 301
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[2, 17] = x[2, 250] = 9.0  # a tie: the lower index wins, as in the oracle
    out = poisoned((rows,), np.int32)
    run_host(norms.argmax.instantiate(BLOCK=64), (rows,), {"x": x, "out": out}, {"cols": cols})
    b = GraphBuilder()
    want = evaluate(b.build({"y": b.argmax(b.input("x", "f32", [rows, cols]))}), {"x": x})["y"]
    np.testing.assert_array_equal(out, want)


def _packed(rng, qtype, n, k):
    q = quantization(qtype)
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = q.quantize(w)
    lut = LUTS.get(qtype, np.zeros(1, np.float32))
    return raw, lut, q


@pytest.mark.parametrize("qtype", sorted(BODIES))
def test_gemv_packed_every_type(rng, qtype):
    bs, _, _ = BODIES[qtype]
    m, n, k = 3, 19, bs * 3
    raw, lut, q = _packed(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    run_host(linear.gemv_packed.instantiate(QTYPE=qtype, BLOCK=64), (n, m), {"x": x, "w": raw, "lut": lut, "y": y}, {"n": n, "k": k, "row_bytes": raw.shape[1]})
    b = GraphBuilder()
    if qtype in ("f16", "bf16"):  # plain float storage: the graph casts the weight, the kernel reads its bytes
        w = b.cast(b.weight("w", qtype, [n, k]), "f32")
        weights = {"w": q.dequantize(raw)}
    else:
        w, weights = b.weight("w", qtype, [n, k]), {"w": raw}
    want = evaluate(b.build({"y": b.linear(b.input("x", "f32", [m, k]), w)}), {"x": x}, weights)["y"]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k", "q6_k", "iq4_xs", "mxfp4"])
@pytest.mark.parametrize("m,n", [(1, 17), (21, 33)])
def test_gemm_packed(rng, qtype, m, n):
    bs, _, _ = BODIES[qtype]
    k = bs * 2
    raw, lut, q = _packed(rng, qtype, n, k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    c = poisoned((m, n))
    run_host(
        linear.gemm_packed.instantiate(QTYPE=qtype),
        (-(-n // 16), -(-m // 16)),
        {"a": a, "w": raw, "lut": lut, "c": c},
        {"m": m, "n": n, "k": k, "row_bytes": raw.shape[1]},
    )
    np.testing.assert_allclose(c, a.astype(np.float64) @ q.dequantize(raw).astype(np.float64).T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("qtype", sorted(BODIES))
def test_gemm_simt_every_packed_type(rng, qtype):
    """The register-tiled GEMM dequantizing packed weights once per workgroup: 64 x 64 tiles, rows
    and features not multiples of them, K in steps of 32 (16 for the 16-bit floats)."""
    from poot.kernel.library.linear_simt import SIMT_TILE, gemm_simt

    bs, _, _ = BODIES[qtype]
    m, n, k = 70, 37, max(bs, 32) * 2
    raw, lut, q = _packed(rng, qtype, n, k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    kern = gemm_simt(k, 16 if bs == 1 else 32, qtype, words=False)
    run_host(kern, (-(-n // SIMT_TILE), -(-m // SIMT_TILE)), {"x": a, "w": raw, "lut": lut, "y": y}, {"m": m, "n": n, "row_bytes": raw.shape[1]})
    np.testing.assert_allclose(y, a.astype(np.float64) @ q.dequantize(raw).astype(np.float64).T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m,n,k", [(1, 5, 7), (19, 35, 40), (33, 16, 16)])
def test_gemm_and_gemv_f32(rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    c = poisoned((m, n))
    run_host(linear.gemm_f32.instantiate(), (-(-n // 16), -(-m // 16)), {"a": a, "w": w, "c": c}, {"m": m, "n": n, "k": k})
    np.testing.assert_allclose(c, a.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    y = poisoned((m, n))
    run_host(linear.gemv_f32.instantiate(BLOCK=32), (n, m), {"x": a, "w": w, "y": y}, {"n": n, "k": k})
    np.testing.assert_allclose(y, c, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_1", "q6_k", "iq4_nl"])
def test_embedding_gather(rng, qtype):
    """Rows at token ids as the oracle gathers them; an id past the table (what a sampler with no
    token leaves, fed to a queued step) reads the nearest row, never memory past the table."""
    vocab, cols, t = 11, 2 * 256 if qtype in ("q6_k",) else 96, 7
    ids = rng.integers(0, vocab, t).astype(np.int32)
    ids[-2:] = [vocab, -1]
    inside = np.clip(ids, 0, vocab - 1)
    out = poisoned((t, cols))
    table = rng.standard_normal((vocab, cols)).astype(np.float32)
    if qtype == "f32":
        run_host(gather.gather_f32.instantiate(BLOCK=32), (t,), {"table": table, "ids": ids, "out": out}, {"cols": cols, "rows": vocab})
        want = table[inside]
    else:
        q = quantization(qtype)
        raw = q.quantize(table)
        run_host(
            gather.gather_packed.instantiate(QTYPE=qtype, BLOCK=32),
            (t,),
            {"table": raw, "lut": LUTS.get(qtype, np.zeros(1, np.float32)), "ids": ids, "out": out},
            {"cols": cols, "row_bytes": raw.shape[1], "rows": vocab},
        )
        b = GraphBuilder()
        want = evaluate(b.build({"y": b.gather(b.weight("t", qtype, [vocab, cols]), b.input("ids", "i32", [t]))}), {"ids": inside}, {"t": raw})["y"]
    np.testing.assert_array_equal(out, want)  # dequantization is exact: same float ops as the oracle


@pytest.mark.parametrize("layout,rot", [("neox", 64), ("interleaved", 64), ("neox", 32), ("interleaved", 16)])
def test_rope(rng, layout, rot):
    t, h, d = 5, 3, 64
    x = rng.standard_normal((t, h, d)).astype(np.float32)
    pos = rng.integers(0, 8192, t).astype(np.int32)  # long contexts: angles of thousands of radians
    cfg = RopeConfig(rot, 10000.0, layout)
    inv, af = rope_frequencies(cfg)
    y = poisoned((t, h, d))
    run_host(
        rope.rope.instantiate(ROT=rot, NEOX=layout == "neox", BLOCK=16),
        (t, h),
        {"x": x, "positions": pos, "inv_freq": inv.astype(np.float32), "y": y},
        {"heads": h, "head_dim": d, "attn_factor": af},
    )
    want = oracle(lambda b: apply_rope(b, b.input("x", "f32", [t, h, d]), b.input("p", "i32", [t]), cfg), {"x": x, "p": pos})
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("pools", ["f32", "f16"])
@pytest.mark.parametrize("layout,rot,dv", [("neox", 64, 64), ("interleaved", 32, 48)])
def test_rope_kv_cache(rng, layout, rot, dv, pools):
    """q rotated, k rotated into its pool, v copied into its pool, one launch: the pools' other
    slots keep their contents, a negative slot writes nothing. f16 pools: k within a half's step
    of the rotation rounded, plus the f32 rotation's own tolerance (the two rotations differ in
    their last f32 bits, which near zero is several steps of a half), v rounded exactly."""
    pt = {"f32": np.float32, "f16": np.float16}[pools]
    t, hq, hkv, d, nb, bs = 5, 6, 2, 64, 4, 4
    q, k = rng.standard_normal((t, hq, d)).astype(np.float32), rng.standard_normal((t, hkv, d)).astype(np.float32)
    v = rng.standard_normal((t, hkv, dv)).astype(np.float32)
    pos = rng.integers(0, 8192, t).astype(np.int32)  # long contexts: angles of thousands of radians
    slots = rng.permutation(nb * bs)[:t].astype(np.int32)
    slots[2] = -1
    cfg = RopeConfig(rot, 10000.0, layout, YarnScaling(4.0, 4096)) if layout == "neox" else RopeConfig(rot, 10000.0, layout)
    inv, af = rope_frequencies(cfg)
    k_pool, v_pool = rng.standard_normal((nb, bs, hkv, d)).astype(pt), rng.standard_normal((nb, bs, hkv, dv)).astype(pt)
    want_k, want_v = k_pool.copy(), v_pool.copy()
    q_out = poisoned((t, hq, d))
    run_host(
        rope.rope_kv_cache.instantiate(ROT=rot, NEOX=layout == "neox", BLOCK=32, PT=pools),
        (t, hq + 2 * hkv),
        {"q": q, "k": k, "v": v, "positions": pos, "inv_freq": inv.astype(np.float32), "slots": slots, "q_out": q_out, "k_pool": k_pool, "v_pool": v_pool},
        {"hq": hq, "hkv": hkv, "head_dim": d, "v_dim": dv, "attn_factor": af},
    )
    rot_of = lambda x, hh: oracle(lambda b: apply_rope(b, b.input("x", "f32", [t, hh, d]), b.input("p", "i32", [t]), cfg), {"x": x, "p": pos})  # noqa: E731
    np.testing.assert_allclose(q_out, rot_of(q, hq), rtol=1e-5, atol=2e-5)
    kr = rot_of(k, hkv)
    for i, s in enumerate(slots):
        if s >= 0:
            want_k.reshape(nb * bs, hkv, d)[s], want_v.reshape(nb * bs, hkv, dv)[s] = kr[i], v[i]
    rtol, atol = (1e-5, 2e-5) if pools == "f32" else (2.0**-10, 2e-5)
    np.testing.assert_allclose(k_pool.astype(np.float32), want_k.astype(np.float32), rtol=rtol, atol=atol)
    np.testing.assert_array_equal(v_pool, want_v)


from poot.kernel.library import attention as attn_lib  # noqa: E402

ATTN = {
    "gqa": dict(hq=6, hkv=2, dk=16, dv=16, dr=0),
    "narrow-value": dict(hq=4, hkv=2, dk=24, dv=12, dr=0),
    "mla": dict(hq=4, hkv=4, dk=16, dv=12, dr=8),
    "mqa-wide": dict(hq=3, hkv=1, dk=64, dv=64, dr=0),
}


def _paged_case(rng, v, bs=4):
    B = 3
    ctx = rng.integers(1, 70, size=B)
    new = np.minimum(ctx, rng.integers(1, 6, size=B))
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(new)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, new)]).astype(np.int32)
    perm = rng.permutation(len(seq_ids))
    seq_ids, positions = seq_ids[perm], positions[perm]
    nblk = [(c + bs - 1) // bs for c in ctx]
    NB, MB = sum(nblk) + 2, max(nblk) + 1
    order = rng.permutation(NB)
    tables = np.zeros((B, MB), np.int32)
    at = 0
    for s in range(B):
        tables[s, : nblk[s]] = order[at : at + nblk[s]]
        at += nblk[s]
    T = len(seq_ids)
    data = dict(
        q=rng.standard_normal((T, v["hq"], v["dk"] + v["dr"])).astype(np.float32),
        k=rng.standard_normal((NB, bs, v["hkv"], v["dk"])).astype(np.float32),
        v=rng.standard_normal((NB, bs, v["hkv"], v["dv"])).astype(np.float32),
        ks=rng.standard_normal((NB, bs, max(v["dr"], 1))).astype(np.float32),
        positions=positions,
        seq_ids=seq_ids,
        ctx_lens=ctx.astype(np.int32),
        block_tables=tables,
    )
    return data, bs, MB


@pytest.mark.parametrize("splits", [1, 3, "lanes", "lanes3", "blocks"])
@pytest.mark.parametrize("mask,pools", [("causal", "f32"), ("window+softcap", "f32"), ("full", "f32"), ("window+softcap", "f16")])
@pytest.mark.parametrize("variant", sorted(ATTN))
def test_paged_attention(rng, variant, mask, pools, splits):
    """The GPU-style kernel (one pass, or split context + merge) and the host's lane schedule (a KV
    head's query heads together; one pass, or split context + merge); pools of f32, or of f16
    (kv_dtype="f16") widened as read."""
    v = ATTN[variant]
    data, bs, mb = _paged_case(rng, v)
    if pools == "f16":
        data.update({n: data[n].astype(np.float16) for n in ("k", "v", "ks")})
    T = len(data["seq_ids"])
    causal, window, softcap, scale = mask != "full", 9 if "window" in mask else 0, 2.5 if "softcap" in mask else 0.0, 0.3
    bufs = {
        "q": data["q"],
        "k_pool": data["k"],
        "v_pool": data["v"],
        "ks_pool": data["ks"],
        "positions": data["positions"],
        "seq_ids": data["seq_ids"],
        "ctx_lens": data["ctx_lens"],
        "block_tables": data["block_tables"],
    }
    if splits == "blocks":  # query tokens in blocks sharing key tiles; the tokens are shuffled, so blocks mix sequences
        k = attn_lib.attention_blocks.instantiate(CAUSAL=causal, QT=4, KT=8, D=64, PT=pools)
        out = bufs["out"] = poisoned((T, v["hq"], v["dv"]))
        sc = {
            "ntok": T,
            "hq": v["hq"],
            "hkv": v["hkv"],
            "dk": v["dk"],
            "dv": v["dv"],
            "dr": v["dr"],
            "bs": bs,
            "mb": mb,
            "scale": scale,
            "window": window,
            "softcap": softcap,
        }
        run_host(k, (-(-T // 4), v["hq"]), bufs, sc)
        splits = 1
    elif splits in ("lanes", "lanes3"):
        if os.environ.get("POOT_TEST_DEVICE", "cpu") != "cpu":
            pytest.skip("the lane schedule is the host's (one thread a workgroup); GPU plans use the other two")
        gq = v["hq"] // v["hkv"] if mask != "causal" else 1  # a KV head's query heads together, or one a workgroup
        splits = 3 if splits == "lanes3" else 1
        k = attn_lib.attention_lanes.instantiate(
            HQ=v["hq"], HKV=v["hkv"], DK=v["dk"], DV=v["dv"], DR=v["dr"], BS=bs, CAUSAL=causal, TILE=16, PT=pools, GQ=gq, SPLITS=splits
        )
        out = poisoned((T, v["hq"], splits * v["dv"]))
        pm, pl = poisoned((T * v["hq"] * splits,)), poisoned((T * v["hq"] * splits,))
        bufs.update(out=out, part_m=pm, part_l=pl)
        run_host(k, (T, v["hq"] // gq, splits), bufs, {"mb": mb, "scale": scale, "window": window, "softcap": softcap})
    else:
        block = 64 if v["dv"] <= 64 else 128
        k = attn_lib.attention.instantiate(CAUSAL=causal, SPLITS=splits, BLOCK=block, PT=pools)
        out = poisoned((T, v["hq"], splits * v["dv"]) if splits > 1 else (T, v["hq"], v["dv"]))
        pm, pl = poisoned((T * v["hq"] * splits,)), poisoned((T * v["hq"] * splits,))
        bufs.update(out=out, part_m=pm, part_l=pl)
        sc = {
            "hq": v["hq"],
            "hkv": v["hkv"],
            "dk": v["dk"],
            "dv": v["dv"],
            "dr": v["dr"],
            "bs": bs,
            "mb": mb,
            "scale": scale,
            "window": window,
            "softcap": softcap,
        }
        run_host(k, (T, v["hq"], splits), bufs, sc)
    if splits > 1:
        final = poisoned((T, v["hq"], v["dv"]))
        run_host(
            attn_lib.attention_merge.instantiate(SPLITS=splits, BLOCK=32),
            (T * v["hq"],),
            {"part_acc": out, "part_m": pm, "part_l": pl, "out": final},
            {"dv": v["dv"]},
        )
        if os.environ.get("POOT_TEST_DEVICE", "cpu") == "cpu":  # the host's merge: the same sums, the weights found once
            lanes = poisoned((T, v["hq"], v["dv"]))
            run_host(
                attn_lib.attention_merge_lanes.instantiate(SPLITS=splits),
                (T * v["hq"],),
                {"part_acc": out, "part_m": pm, "part_l": pl, "out": lanes},
                {"dv": v["dv"]},
            )
            np.testing.assert_allclose(lanes, final, rtol=1e-6, atol=1e-7)
        out = final
    graph_data = {n: a for n, a in data.items() if n != "ks" or v["dr"]}
    b = GraphBuilder()
    ins = {n: b.input(n, {"float32": "f32", "float16": "f16"}.get(a.dtype.name, "i32"), list(a.shape)) for n, a in graph_data.items()}
    y = b.attention(
        ins["q"],
        ins["k"],
        ins["v"],
        k_shared=ins["ks"] if v["dr"] else None,
        positions=ins["positions"],
        seq_ids=ins["seq_ids"],
        ctx_lens=ins["ctx_lens"],
        block_tables=ins["block_tables"],
        causal=causal,
        window=window or None,
        softcap=softcap or None,
        scale=scale,
    )
    want = evaluate(b.build({"y": y}), graph_data)["y"]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


from poot.eval.sampling import gumbel_uniform, logprobs_reference, sample_scores, sampling_hash  # noqa: E402
from poot.kernel.library import sampling as sampling_lib  # noqa: E402


def _sampling_case(rng, rows, vocab):
    p = dict(
        logits=(rng.standard_normal((rows, vocab)) * 3).astype(np.float32),
        counts=(rng.random((rows, vocab)) < 0.05).astype(np.int32) * rng.integers(1, 4, (rows, vocab)).astype(np.int32),
        temperature=rng.choice([0.0, 0.7, 1.0, 1.5], rows).astype(np.float32),
        top_k=rng.choice([0, 1, 5, 40], rows).astype(np.int32),
        top_p=rng.choice([1.0, 0.9, 0.5], rows).astype(np.float32),
        min_p=rng.choice([0.0, 0.05], rows).astype(np.float32),
        repetition=rng.choice([1.0, 1.3], rows).astype(np.float32),
        presence=rng.choice([0.0, 0.5], rows).astype(np.float32),
        frequency=rng.choice([0.0, 0.2], rows).astype(np.float32),
        seeds=rng.integers(-(2**31), 2**31 - 1, rows).astype(np.int32),
        steps=rng.integers(0, 1000, rows).astype(np.int32),
    )
    return p


def _device_args(p, rng, rows, vocab, guided=False, nbias=0):
    """The kernel's operands for a case: a counts pool addressed by row (some rows without history),
    a mask (all allowed unless ``guided``) and ``nbias`` logit-bias pairs per row."""
    words = (vocab + 31) // 32
    count_rows = rng.permutation(rows).astype(np.int32)
    count_rows[rng.random(rows) < 0.2] = -1
    pool = np.zeros_like(p["counts"])
    pool[count_rows[count_rows >= 0]] = p["counts"][count_rows >= 0]
    per_row = np.where(count_rows[:, None] >= 0, pool[np.maximum(count_rows, 0)], 0).astype(np.int32)
    mask = np.full((rows, words), -1, np.int32)
    if guided:
        bits = rng.random((rows, words * 32)) < 0.3
        bits[:, 0] = True  # something stays allowed
        mask = (
            np.packbits(bits.reshape(rows, words, 4, 8)[:, :, :, ::-1], axis=-1).reshape(rows, words, 4)[:, :, ::-1].copy().view(np.int32).reshape(rows, words)
        )
    bias_ids = rng.integers(-1, vocab, (rows, max(nbias, 1))).astype(np.int32)
    bias_vals = rng.normal(0, 3, (rows, max(nbias, 1))).astype(np.float32)
    if nbias == 0:
        bias_ids[:] = -1
    args = {**p, "counts": pool, "count_rows": count_rows, "mask": mask, "bias_ids": bias_ids, "bias_vals": bias_vals}
    ref = {**p, "counts": per_row, "mask": mask, "bias_ids": bias_ids, "bias_vals": bias_vals}
    return args, ref, {"vocab": vocab, "mask_words": words, "nbias": max(nbias, 1)}


def _run_sampling(args, sc, rows: int, vocab: int, chunk: int, lanes: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Both sampling launches (rows in chunks of ``chunk``, then a workgroup a row) on the test
    device: the tokens, and the chunks' parts (``lanes``: by the host's one-thread chunk kernel)."""
    chunks = -(-vocab // chunk)
    work, parts, tokens = poisoned((rows, vocab)), poisoned((rows * chunks * sampling_lib.PART_WORDS,)), poisoned((rows,), np.int32)
    first = {
        n: args[n]
        for n in ("logits", "counts", "count_rows", "temperature", "repetition", "presence", "frequency", "seeds", "steps", "mask", "bias_ids", "bias_vals")
    }
    chunk_kernel = sampling_lib.sample_chunks_lanes.instantiate() if lanes else sampling_lib.sample_chunks.instantiate(BLOCK=64)
    run_host(chunk_kernel, (rows, chunks), {**first, "work": work, "parts": parts}, {**sc, "chunk": chunk})
    second = {n: args[n] for n in ("temperature", "top_k", "top_p", "min_p", "seeds", "steps")}
    run_host(sampling_lib.sample.instantiate(BLOCK=64), (rows,), {**second, "work": work, "parts": parts, "tokens": tokens}, {"vocab": vocab, "chunks": chunks})
    return tokens, parts


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("guided,nbias", [(False, 0), (True, 0), (True, 3)])
@pytest.mark.parametrize("vocab,chunk", [(37, 8192), (1000, 96), (4099, 1024)])
def test_sampling_kernel_matches_the_oracle(rng, vocab, chunk, guided, nbias, lanes):
    rows = 16
    p = _sampling_case(rng, rows, vocab)
    args, ref, sc = _device_args(p, rng, rows, vocab, guided, nbias)
    tokens, parts = _run_sampling(args, sc, rows, vocab, chunk, lanes)
    assert np.isfinite(parts).all()  # every chunk wrote its part
    assert_draws_match(tokens, sample_scores(**ref))
    if guided:  # every sampled token is allowed by its row's mask
        words = ref["mask"].view(np.uint32)
        assert all((words[r, t >> 5] >> (t & 31)) & 1 for r, t in enumerate(tokens.tolist()))


@pytest.mark.parametrize("lanes", [False, True])
def test_greedy_ties_go_to_the_lowest_id_across_lanes_and_chunks(rng, lanes):
    """Rows without penalties or biases (the host kernel's sixteen-lane pass): equal maxima placed in
    different lanes, chunks and the tail past the last full sixteen; the lowest id is picked, as in
    the oracle, and a masked copy of the maximum is never picked."""
    rows, vocab, chunk = 6, 1000, 96
    p = _sampling_case(rng, rows, vocab)
    p.update(
        temperature=np.zeros(rows, np.float32), repetition=np.ones(rows, np.float32), presence=np.zeros(rows, np.float32), frequency=np.zeros(rows, np.float32)
    )
    p["top_k"][:] = 0
    spots = [(0, [5, 21]), (1, [100, 37]), (2, [995, 999]), (3, [16, 17, 18]), (4, [990, 7]), (5, [3, 600])]
    for r, ids in spots:
        p["logits"][r, ids] = 50.0
    args, ref, sc = _device_args(p, rng, rows, vocab)
    args["mask"][5, 0] &= ~np.int32(1 << 3)  # row 5: its first maximum is not allowed (the oracle's mask is this array)
    tokens, _ = _run_sampling(args, sc, rows, vocab, chunk, lanes)
    np.testing.assert_array_equal(tokens, [5, 37, 995, 16, 7, 600])
    assert_draws_match(tokens, sample_scores(**ref))


def test_same_seed_same_tokens_and_draws_follow_the_distribution(rng):
    vocab, rows = 50, 4000
    logits = np.tile((rng.standard_normal(vocab) * 1.5).astype(np.float32), (rows, 1))
    p = _sampling_case(rng, rows, vocab)
    p.update(
        logits=logits,
        counts=np.zeros((rows, vocab), np.int32),
        temperature=np.ones(rows, np.float32),
        top_k=np.zeros(rows, np.int32),
        top_p=np.ones(rows, np.float32),
        min_p=np.zeros(rows, np.float32),
        repetition=np.ones(rows, np.float32),
        presence=np.zeros(rows, np.float32),
        frequency=np.zeros(rows, np.float32),
        seeds=np.full(rows, 1234, np.int32),
        steps=np.arange(rows, dtype=np.int32),
    )
    args, ref, sc = _device_args(p, rng, rows, vocab)
    a, _ = _run_sampling(args, sc, rows, vocab, 16)
    b, _ = _run_sampling(args, sc, rows, vocab, 32)
    np.testing.assert_array_equal(a, b)  # the same draws whatever the chunks
    assert_draws_match(a, sample_scores(**ref))
    freq = np.bincount(a, minlength=vocab) / rows
    probs = np.exp(logits[0] - logits[0].max())
    probs /= probs.sum()
    assert np.abs(freq - probs).max() < 0.03  # 4,000 draws: a few sigma of binomial noise
    u = gumbel_uniform(1234, 7, np.arange(100_000))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_the_largest_uniform_draws_no_masked_token(rng):
    """A seed whose hash gives token 3 its largest uniform (24 bits all set: 1.0 once rounded to f32
    in 24 bits and a half, an infinite Gumbel score): u stays below 1, and token 3, masked, is not drawn."""
    hit = -1
    for start in range(0, 1 << 30, 1 << 22):  # one seed in 2^24 on average
        seeds = np.arange(start, start + (1 << 22), dtype=np.uint32)
        found = seeds[((sampling_hash(seeds, 7, 3) >> np.uint32(8)) & np.uint32(0xFFFFFF)) == 0xFFFFFF]
        if len(found):
            hit = int(found[0])
            break
    u = gumbel_uniform(hit, 7, np.arange(50))
    assert u[3] == np.float32(1 - 2.0**-24) and u.max() < 1
    # (before: (0xFFFFFF + 0.5) / 2^24, and 0xFFFFFF + 0.5 rounds to 2^24 in f32: u was 1.0)
    rows, vocab = 1, 50
    p = _sampling_case(rng, rows, vocab)
    p.update(
        temperature=np.ones(1, np.float32),
        top_k=np.zeros(1, np.int32),
        top_p=np.ones(1, np.float32),
        min_p=np.zeros(1, np.float32),
        seeds=np.array([hit], np.int64).astype(np.int32),
        steps=np.array([7], np.int32),
    )
    args, ref, sc = _device_args(p, rng, rows, vocab)
    args["mask"][0, 0] &= ~np.int32(1 << 3)  # token 3 not allowed
    tokens, _ = _run_sampling(args, sc, rows, vocab, 16)
    assert tokens[0] != 3
    assert_draws_match(tokens, sample_scores(**{**ref, "mask": args["mask"]}))


@pytest.mark.device_independent  # runs no kernel on POOT_TEST_DEVICE
def test_draws_may_differ_from_the_oracle_only_by_a_near_tie(rng):
    scores = rng.standard_normal((200, 30)) * 3
    want = np.argmax(scores, axis=1).astype(np.int32)
    assert_draws_match(want.copy(), scores)
    tied = want.copy()
    tied[7] = (want[7] + 1) % 30
    scores[7, tied[7]] = scores[7, want[7]] * (1 - 2e-7)  # f32 noise apart
    assert_draws_match(tied, scores)
    with pytest.raises(AssertionError, match="nor a tie"):
        wrong = want.copy()
        wrong[3] = np.argmin(scores[3])
        assert_draws_match(wrong, scores)
    many = np.where(np.arange(200) < 5, tied[7], want)  # five rows of ties: more than 1%
    scores[:5] = scores[7]
    with pytest.raises(AssertionError, match="drew a tie"):
        assert_draws_match(many.astype(np.int32), scores)


@pytest.mark.parametrize("n", [1, 5])
def test_logprobs_kernel(rng, n):
    rows, vocab = 6, 777
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    logits[0, 10:14] = logits[0].max() + 1  # ties at the top
    tokens = rng.integers(0, vocab, rows).astype(np.int32)
    chosen, ids, vals = poisoned((rows,)), poisoned((rows, n), np.int32), poisoned((rows, n))
    run_host(
        sampling_lib.logprobs.instantiate(N=n, BLOCK=64),
        (rows,),
        {"logits": logits, "tokens": tokens, "chosen": chosen, "top_ids": ids, "top_vals": vals},
        {"vocab": vocab},
    )
    want_c, want_ids, want_vals = logprobs_reference(logits, tokens, n)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(chosen, want_c, atol=2e-5)
    np.testing.assert_allclose(vals, want_vals, atol=2e-5)


def test_count_tokens_counts_each_new_token_of_its_sequence(rng):
    vocab, slots = 30, 5
    counts = rng.integers(0, 3, (slots, vocab)).astype(np.int32)
    tokens = rng.integers(0, vocab, 40).astype(np.int32)
    seq_ids = rng.integers(0, 3, 40).astype(np.int32)
    count_rows = np.array([4, -1, 1], np.int32)
    want = counts.copy()
    for t, s in zip(tokens, seq_ids):
        if count_rows[s] >= 0:
            want[count_rows[s], t] += 1
    run_host(
        sampling_lib.count_tokens.instantiate(),
        (1,),
        {"tokens": tokens, "seq_ids": seq_ids, "count_rows": count_rows, "counts": counts},
        {"ntokens": 40, "vocab": vocab},
    )
    np.testing.assert_array_equal(counts, want)


def test_feed_tokens_takes_the_tokens_a_step_was_queued_without_from_the_last_sampled(rng):
    slots, n = 6, 150  # more than one workgroup, the last one partial
    last = rng.integers(0, 5000, slots).astype(np.int32)
    tokens = rng.integers(0, 5000, n).astype(np.int32)
    tokens[rng.random(n) < 0.5] = -1
    seq_ids = rng.integers(0, 4, n).astype(np.int32)
    count_rows = np.array([3, -1, 0, 5], np.int32)
    out = poisoned((n,), np.int32)
    run_host(
        sampling_lib.feed_tokens.instantiate(),
        (-(-n // 64),),
        {"last": last, "tokens": tokens, "seq_ids": seq_ids, "count_rows": count_rows, "out": out},
        {"ntokens": n},
    )
    rows = count_rows[seq_ids]
    want = np.where(tokens >= 0, tokens, np.where(rows >= 0, last[np.maximum(rows, 0)], 0))
    np.testing.assert_array_equal(out, want)


def test_keep_tokens_keeps_each_rows_sampled_token(rng):
    slots, n = 200, 130
    last = rng.integers(0, 5000, slots).astype(np.int32)
    sampled = rng.integers(0, 5000, n).astype(np.int32)
    rows = rng.permutation(slots)[:n].astype(np.int32)
    rows[rng.random(n) < 0.3] = -1
    want = last.copy()
    want[rows[rows >= 0]] = sampled[rows >= 0]
    run_host(sampling_lib.keep_tokens.instantiate(), (-(-n // 64),), {"sampled": sampled, "rows": rows, "last": last}, {"nrows": n})
    np.testing.assert_array_equal(last, want)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from poot.graph.ops import OPS  # noqa: E402
from poot.kernel.library.elementwise import MAX_RANK, fuse_elementwise  # noqa: E402

_UNARY_SAFE = ["neg", "abs", "exp", "tanh", "sigmoid", "sin", "cos", "erf", "floor"]
_BINARY_SAFE = ["add", "sub", "mul", "maximum", "minimum"]


def _strides(shape, full):
    """Element strides of an operand of ``shape`` broadcast to ``full`` (padded to MAX_RANK)."""
    shape = (1,) * (MAX_RANK - len(shape)) + tuple(shape)
    full = (1,) * (MAX_RANK - len(full)) + tuple(full)
    out, acc = [0] * MAX_RANK, 1
    for d in reversed(range(MAX_RANK)):
        out[d] = 0 if shape[d] == 1 and full[d] != 1 else acc
        acc *= shape[d]
    return out, full


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(_UNARY_SAFE + _BINARY_SAFE + ["where", "cast16", "castbf16"]), st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=8
    ),
    dims=st.tuples(st.integers(1, 5), st.integers(1, 7), st.integers(1, 33)),
    seed=st.integers(0, 2**31),
)
def test_fused_elementwise_chains_match_the_oracle(ops, dims, seed):
    rng = np.random.default_rng(seed)
    shapes = [dims, (1, dims[1], 1), (dims[2],), (dims[0], 1, dims[2])]
    b = GraphBuilder()
    ins = [b.input(f"x{i}", "f32", list(s)) for i, s in enumerate(shapes)]
    vals = list(ins)
    # whether a value is the same bits here and in the oracle: transcendentals differ by a few ulp
    # (LLVM's and numpy's), which a rounding to 16 bits can turn into a whole f16 / bf16 step
    exact = [True] * len(ins)
    start = len(b._nodes)
    for op, i, j in ops:
        i, j = i % len(vals), j % len(vals)
        x, y = vals[i], vals[j]
        if op in _UNARY_SAFE:
            v = b.unary(op, b.tanh(x) if op == "exp" else x)
            ok = exact[i] and op in ("neg", "abs", "floor")
        elif op == "where":
            v = b.where(b.binary("gt", x, y), x, y)
            ok = exact[i] and exact[j]
        elif op in ("cast16", "castbf16"):
            i = max(k for k in range(len(vals)) if exact[k]) if not exact[i] else i  # the latest exact value
            v = b.cast(b.cast(vals[i], "f16" if op == "cast16" else "bf16"), "f32")
            ok = True
        else:
            v = b.binary(op, x, y)
            ok = exact[i] and exact[j]
        vals.append(v)
        exact.append(ok)
    out = b.add(vals[-1], b.const(0.5))
    g = b.build({"y": out})
    nodes = [n for n in g.nodes[start:] if OPS[n.op].category == "elementwise" or n.op == "constant"]
    used_inputs = ins  # pass all; unused ones are simply not read
    data = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    want = evaluate(g, data)["y"]
    full = want.shape
    k = fuse_elementwise("chain", nodes, used_inputs, out, block=64)
    n = int(np.prod(full))
    y = poisoned(full)
    scalars = {"n": n, "o_out": 0}
    contiguous, padded = _strides(full, full)
    scalars.update({f"d{d}": padded[d] for d in range(MAX_RANK)})
    scalars.update({f"ot{d}": contiguous[d] for d in range(MAX_RANK)})
    scalars.update({f"o{i}": 0 for i in range(len(shapes))})
    for i, s in enumerate(shapes):
        st_, _ = _strides(s, full)
        scalars.update({f"s{i}_{d}": st_[d] for d in range(MAX_RANK)})
    run_host(k, (-(-n // 64),), {**{f"in{i}": data[f"x{i}"] for i in range(len(shapes))}, "out": y}, scalars)
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("qtype", sorted(BODIES))
def test_gemv_by_blocks_every_type(rng, qtype):
    bs, bb, _ = BODIES[qtype]
    m, n, k = 2, 23, bs * 5
    raw, lut, q = _packed(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = poisoned((m, n))
    kern = linear.gemv_blocks.instantiate(QTYPE=qtype, BS=bs, BB=bb, ROWS=4, BLOCK=32)
    run_host(kern, (-(-n // 4), m), {"x": x, "w": raw, "lut": lut, "y": y}, {"n": n, "k": k, "row_bytes": raw.shape[1]})
    np.testing.assert_allclose(y, x.astype(np.float64) @ q.dequantize(raw).astype(np.float64).T, rtol=1e-4, atol=1e-4)


from poot.kernel.library import movement  # noqa: E402


def _strides_of(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.insert(0, acc)
        acc *= d
    return out


@pytest.mark.parametrize("case", ["transpose", "slice", "expand", "concat"])
def test_strided_copies_match_the_oracle(rng, case):
    k = movement.copy_strided.instantiate(BLOCK=64)
    x = rng.standard_normal((3, 5, 7, 2)).astype(np.float32)
    b = GraphBuilder()
    bx = b.input("x", "f32", [3, 5, 7, 2])
    if case == "transpose":
        want = evaluate(b.build({"y": b.transpose(bx, [2, 0, 3, 1])}), {"x": x})["y"]
        xs = _strides_of(x.shape)
        box, src = list(want.shape), [xs[2], xs[0], xs[3], xs[1]]
        out = poisoned(want.shape)
        run_host(
            k,
            (-(-out.size // 64),),
            {"src": x, "dst": out},
            dict(
                n=out.size,
                **{f"d{i}": v for i, v in enumerate(box)},
                **{f"s{i}": v for i, v in enumerate(src)},
                src_offset=0,
                **{f"t{i}": v for i, v in enumerate(_strides_of(box))},
                dst_offset=0,
            ),
        )
    elif case == "slice":
        want = evaluate(b.build({"y": b.slice(bx, 2, 1, 7, 2)}), {"x": x})["y"]
        xs = _strides_of(x.shape)
        box = list(want.shape)
        out = poisoned(want.shape)
        run_host(
            k,
            (-(-out.size // 64),),
            {"src": x, "dst": out},
            dict(
                n=out.size,
                **{f"d{i}": v for i, v in enumerate(box)},
                s0=xs[0],
                s1=xs[1],
                s2=2 * xs[2],
                s3=xs[3],
                src_offset=xs[2],
                **{f"t{i}": v for i, v in enumerate(_strides_of(box))},
                dst_offset=0,
            ),
        )
    elif case == "expand":
        col = rng.standard_normal((3, 1, 7, 1)).astype(np.float32)
        b2 = GraphBuilder()
        want = evaluate(b2.build({"y": b2.expand(b2.input("c", "f32", [3, 1, 7, 1]), [3, 5, 7, 2])}), {"c": col})["y"]
        out = poisoned(want.shape)
        cs = _strides_of(col.shape)
        run_host(
            k,
            (-(-out.size // 64),),
            {"src": col, "dst": out},
            dict(
                n=out.size,
                d0=3,
                d1=5,
                d2=7,
                d3=2,
                s0=cs[0],
                s1=0,
                s2=cs[2],
                s3=0,
                src_offset=0,
                **{f"t{i}": v for i, v in enumerate(_strides_of(want.shape))},
                dst_offset=0,
            ),
        )
        x = col
    else:
        z = rng.standard_normal((3, 5, 4, 2)).astype(np.float32)
        want = evaluate(b.build({"y": b.concat([bx, b.input("z", "f32", [3, 5, 4, 2])], axis=2)}), {"x": x, "z": z})["y"]
        out = poisoned(want.shape)
        ts = _strides_of(want.shape)
        for part, off in ((x, 0), (z, 7)):
            ps = _strides_of(part.shape)
            run_host(
                k,
                (-(-part.size // 64),),
                {"src": part, "dst": out},
                dict(
                    n=part.size,
                    **{f"d{i}": v for i, v in enumerate(part.shape)},
                    **{f"s{i}": v for i, v in enumerate(ps)},
                    src_offset=0,
                    **{f"t{i}": v for i, v in enumerate(ts)},
                    dst_offset=off * ts[2],
                ),
            )
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("n,block", [(1, 256), (300, 64), (5312, 256)])
def test_word_copies_are_bit_exact_and_stop_at_n(rng, n, block):
    """copy_words moves 32-bit words as bits (f32 NaN payloads and negative integers alike), and
    writes nothing past ``n``."""
    src = rng.integers(-(2**31), 2**31 - 1, n + 40, dtype=np.int64).astype(np.int32)
    src[: n // 3] = rng.standard_normal(n // 3).astype(np.float32).view(np.int32)
    src[0] = np.array([0x7FC01234], np.uint32).view(np.int32)[0]  # a NaN with a payload
    dst = poisoned((n + 40,), np.int32)
    before = dst.copy()
    run_host(movement.copy_words.instantiate(BLOCK=block), (-(-n // block),), {"src": src, "dst": dst}, {"n": n})
    np.testing.assert_array_equal(dst[:n], src[:n])
    np.testing.assert_array_equal(dst[n:], before[n:])


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_row_reductions(rng, op):
    rows, cols = 6, 333
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = poisoned((rows,))
    run_host(movement.reduce_rows.instantiate(OP=op, BLOCK=64), (rows,), {"x": x, "y": y}, {"cols": cols})
    b = GraphBuilder()
    want = evaluate(b.build({"y": b.reduce(op, b.input("x", "f32", [rows, cols]), -1)}), {"x": x})["y"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pools", ["f32", "f16"])
def test_cache_write_through_a_shuffled_slot_map(rng, pools):
    """Rows written at their slots, a negative slot skipped; into f16 pools each value rounded as
    numpy rounds it (ties to even, subnormal halves, overflow to infinity: bit for bit)."""
    nb, bs, width, t = 6, 4, 24, 9
    pool = rng.standard_normal((nb, bs, width)).astype({"f32": np.float32, "f16": np.float16}[pools])
    vals = rng.standard_normal((t, width)).astype(np.float32)
    if pools == "f16":  # halves' midpoints (ties), subnormal halves, values past the largest half
        h = rng.integers(0, 0x7BFF, 40).astype(np.uint16).view(np.float16).astype(np.float64)
        vals[:2] = (
            np.concatenate(
                [
                    ((h[:-1] + np.nextafter(h[:-1].astype(np.float16), np.float16(np.inf)).astype(np.float64)) / 2)[:39],
                    [2.0**-24 * 1.5, -(2.0**-20) * 1.25, 3.0e-8, 65520.0, -70000.0, 65519.0, 6.0e-5, -(2.0**-25), 0.0],
                ]
            )
            .astype(np.float32)
            .reshape(2, width)
        )
    slots = rng.permutation(nb * bs)[:t].astype(np.int32)
    slots[3] = -1
    got = pool.copy()
    run_host(movement.cache_write.instantiate(BLOCK=32, PT=pools), (t,), {"values": vals, "slots": slots, "pool": got}, {"width": width})
    b = GraphBuilder()
    want = evaluate(
        b.build({"y": b.cache_write(b.input("p", pools, [nb, bs, width]), b.input("v", "f32", [t, width]), b.input("s", "i32", [t]))}),
        {"p": pool, "v": vals, "s": slots},
    )["y"]
    assert got.dtype == want.dtype == pool.dtype
    np.testing.assert_array_equal(got.view(np.uint32 if pools == "f32" else np.uint16), want.view(np.uint32 if pools == "f32" else np.uint16))


def test_dot4_i8_sums_signed_byte_products(rng):
    """Kernel IR's Dot4I8 (dp4a on NVIDIA, byte arithmetic elsewhere) against numpy, every byte value."""
    from poot.kernel import ir as K

    n = 4096
    a, b = (rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(2))
    a[:256] = np.repeat(np.arange(-128, 128, dtype=np.int8), 4).view(np.int32)[:256]  # extremes included
    c = rng.integers(-(2**20), 2**20, n).astype(np.int32)
    i = K.Bin("add", K.Bin("mul", K.Builtin("group_id", 0), K.Const(64, K.i32)), K.Builtin("thread_id", 0))
    body = (K.If(K.Bin("lt", i, K.Ref("n", K.i32)), (K.Store("y", i, K.Dot4I8(K.Load("a", i, K.i32), K.Load("b", i, K.i32), K.Load("c", i, K.i32))),)),)
    kern = K.Kernel(
        "dot4_i8_test",
        (K.Buffer("a", K.i32), K.Buffer("b", K.i32), K.Buffer("c", K.i32), K.Buffer("y", K.i32, readonly=False), K.ScalarParam("n", K.i32)),
        body,
        (64, 1, 1),
    )
    y = poisoned((n,), np.int32)
    run_host(kern, (n // 64,), {"a": a, "b": b, "c": c, "y": y}, {"n": n})
    want = (a.view(np.int8).reshape(n, 4).astype(np.int64) * b.view(np.int8).reshape(n, 4)).sum(1) + c
    np.testing.assert_array_equal(y, want.astype(np.int32))
