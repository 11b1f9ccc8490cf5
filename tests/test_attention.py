"""The fused attention op in every typed variant against a naive softmax(QKᵀ)V written here.

The naive form builds each sequence's whole score matrix with a mask matrix, independent of the
oracle's token-at-a-time loop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from poot.errors import ShapeError
from poot.eval import evaluate
from poot.graph import GraphBuilder, sym

T = sym("tokens")


def naive(q, K, V, Ks, pos_q, n_ctx, *, causal, window, softcap, scale):
    """q [t, Hq, Dq] of one sequence; K [n, Hkv, Dk], V [n, Hkv, Dv], Ks [n, Dr] or None."""
    t, hq, dq = q.shape
    hkv = K.shape[1]
    out = np.zeros((t, hq, V.shape[2]))
    for h in range(hq):
        g = h // (hq // hkv)
        kh = K[:n_ctx, g, :]
        if Ks is not None:
            kh = np.concatenate([kh, Ks[:n_ctx]], axis=1)
        scores = (q[:, h, :] @ kh.T) * (scale if scale is not None else 1 / math.sqrt(dq))
        if softcap is not None:
            scores = softcap * np.tanh(scores / softcap)
        j = np.arange(n_ctx)[None, :]
        p = pos_q[:, None]
        mask = np.ones((t, n_ctx), bool)
        if causal:
            mask &= j <= p
        if window is not None:
            mask &= j > p - window
        scores = np.where(mask, scores, -np.inf)
        m = scores.max(axis=1, keepdims=True)
        w = np.where(mask, np.exp(scores - np.where(np.isfinite(m), m, 0)), 0)
        z = w.sum(axis=1, keepdims=True)
        w = np.divide(w, z, out=np.zeros_like(w), where=z > 0)
        out[:, h, :] = w @ V[:n_ctx, g, :]
    return out


VARIANTS = {
    "mha": dict(hq=4, hkv=4, dk=16, dv=16, dr=0),
    "gqa": dict(hq=6, hkv=2, dk=16, dv=16, dr=0),
    "mqa": dict(hq=5, hkv=1, dk=8, dv=8, dr=0),
    "narrow-value": dict(hq=4, hkv=2, dk=24, dv=12, dr=0),
    "mla-split-key": dict(hq=4, hkv=4, dk=16, dv=12, dr=8),
}
MASKS = {
    "causal": dict(causal=True, window=None, softcap=None, scale=None),
    "full": dict(causal=False, window=None, softcap=None, scale=None),
    "window": dict(causal=True, window=5, softcap=None, scale=None),
    "softcap": dict(causal=True, window=None, softcap=3.0, scale=None),
    "scale": dict(causal=True, window=None, softcap=None, scale=0.37),
    "window+softcap+scale": dict(causal=True, window=3, softcap=2.5, scale=0.2),
}


def _batch(rng, variant, paged, bs=4):
    """Two to three sequences at different points (prefill, decode, chunked prefill), with KV for
    their whole context, dense per sequence or scattered over a pool through a shuffled slot map."""
    v = VARIANTS[variant]
    B = int(rng.integers(2, 4))
    ctx = rng.integers(1, 14, size=B)
    new = np.minimum(ctx, rng.integers(1, 5, size=B))  # tokens of this step per sequence
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(new)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, new)]).astype(np.int32)
    perm = rng.permutation(len(seq_ids))  # sequences interleaved in the token axis
    seq_ids, positions = seq_ids[perm], positions[perm]
    Tn = len(seq_ids)
    q = rng.standard_normal((Tn, v["hq"], v["dk"] + v["dr"])).astype(np.float32)
    Kd = [rng.standard_normal((c, v["hkv"], v["dk"])).astype(np.float32) for c in ctx]
    Vd = [rng.standard_normal((c, v["hkv"], v["dv"])).astype(np.float32) for c in ctx]
    Sd = [rng.standard_normal((c, v["dr"])).astype(np.float32) for c in ctx] if v["dr"] else None
    data = dict(q=q, positions=positions, seq_ids=seq_ids, ctx_lens=ctx.astype(np.int32))
    if not paged:
        S = int(ctx.max()) + 2
        k = rng.standard_normal((B, S, v["hkv"], v["dk"])).astype(np.float32)  # junk past ctx_lens
        vv = rng.standard_normal((B, S, v["hkv"], v["dv"])).astype(np.float32)
        ks = rng.standard_normal((B, S, v["dr"])).astype(np.float32) if v["dr"] else None
        for s in range(B):
            k[s, : ctx[s]], vv[s, : ctx[s]] = Kd[s], Vd[s]
            if ks is not None:
                ks[s, : ctx[s]] = Sd[s]
    else:
        blocks_per = [(c + bs - 1) // bs for c in ctx]
        NB = sum(blocks_per) + 3
        order = rng.permutation(NB)  # shuffled physical blocks
        MB = max(blocks_per) + 1
        tables = np.full((B, MB), -1, np.int32)
        nxt = 0
        for s in range(B):
            tables[s, : blocks_per[s]] = order[nxt : nxt + blocks_per[s]]
            nxt += blocks_per[s]
        tables[tables < 0] = order[-1]  # unused entries point at a junk block
        k = rng.standard_normal((NB, bs, v["hkv"], v["dk"])).astype(np.float32)
        vv = rng.standard_normal((NB, bs, v["hkv"], v["dv"])).astype(np.float32)
        ks = rng.standard_normal((NB, bs, v["dr"])).astype(np.float32) if v["dr"] else None
        for s in range(B):
            for j in range(ctx[s]):
                blk, off = tables[s, j // bs], j % bs
                k[blk, off], vv[blk, off] = Kd[s][j], Vd[s][j]
                if ks is not None:
                    ks[blk, off] = Sd[s][j]
        data["block_tables"] = tables
    data.update(k=k, v=vv)
    if ks is not None:
        data["k_shared"] = ks
    return data, (Kd, Vd, Sd)


def _expected(data, ctxdata, m):
    Kd, Vd, Sd = ctxdata
    out = np.zeros((len(data["seq_ids"]), data["q"].shape[1], Vd[0].shape[2]))
    for s in range(len(Kd)):
        rows = np.nonzero(data["seq_ids"] == s)[0]
        out[rows] = naive(
            data["q"][rows].astype(np.float64),
            Kd[s].astype(np.float64),
            Vd[s].astype(np.float64),
            None if Sd is None else Sd[s].astype(np.float64),
            data["positions"][rows],
            int(data["ctx_lens"][s]),
            **m,
        )
    return out


def _graph(data, m):
    b = GraphBuilder()
    ins = {
        name: b.input(
            name, "f32" if arr.dtype == np.float32 else "i32", [T if name in ("q", "positions", "seq_ids") and i == 0 else d for i, d in enumerate(arr.shape)]
        )
        for name, arr in data.items()
    }
    y = b.attention(
        ins["q"],
        ins["k"],
        ins["v"],
        positions=ins["positions"],
        seq_ids=ins["seq_ids"],
        ctx_lens=ins["ctx_lens"],
        block_tables=ins.get("block_tables"),
        k_shared=ins.get("k_shared"),
        **m,
    )
    return b.build({"y": y})


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_attention_variants(variant, mask, paged, rng):
    m = MASKS[mask]
    data, ctxdata = _batch(rng, variant, paged)
    g = _graph(data, m)
    got = evaluate(g, data)["y"]
    want = _expected(data, ctxdata, m)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    got64 = evaluate(g, data, float64=True)["y"]
    np.testing.assert_allclose(got64, want, rtol=1e-11, atol=1e-11)


def test_paged_read_after_cache_write_through_shuffled_slots(rng):
    """K/V written into a pool through a shuffled slot map, then read by block tables, equal dense attention."""
    bs, hkv, hq, d = 4, 2, 4, 8
    ctx = np.array([7, 3], np.int32)
    Tn = int(ctx.sum())
    seq_ids = np.repeat(np.arange(2), ctx).astype(np.int32)
    positions = np.concatenate([np.arange(c) for c in ctx]).astype(np.int32)
    NB = 6
    order = rng.permutation(NB)
    tables = np.array([[order[0], order[1]], [order[2], order[3]]], np.int32)
    slots = np.array([tables[s, p // bs] * bs + p % bs for s, p in zip(seq_ids, positions)], np.int32)
    q = rng.standard_normal((Tn, hq, d)).astype(np.float32)
    k = rng.standard_normal((Tn, hkv, d)).astype(np.float32)
    v = rng.standard_normal((Tn, hkv, d)).astype(np.float32)
    pool = rng.standard_normal((NB, bs, hkv, d)).astype(np.float32)  # stale contents must not leak in

    b = GraphBuilder()
    i = {n: b.input(n, "i32", [T]) for n in ("positions", "seq_ids", "slots")}
    kp = b.cache_write(b.input("kp", "f32", [NB, bs, hkv, d]), b.input("k", "f32", [T, hkv, d]), i["slots"])
    vp = b.cache_write(b.input("vp", "f32", [NB, bs, hkv, d]), b.input("v", "f32", [T, hkv, d]), i["slots"])
    y = b.attention(
        b.input("q", "f32", [T, hq, d]),
        kp,
        vp,
        positions=i["positions"],
        seq_ids=i["seq_ids"],
        ctx_lens=b.input("ctx", "i32", [2]),
        block_tables=b.input("bt", "i32", [2, 2]),
    )
    g = b.build({"y": y})
    got = evaluate(g, dict(q=q, k=k, v=v, kp=pool, vp=pool.copy(), positions=positions, seq_ids=seq_ids, slots=slots, ctx=ctx, bt=tables))["y"]
    want = np.concatenate(
        [
            naive(
                q[seq_ids == s].astype(np.float64),
                k[seq_ids == s],
                v[seq_ids == s],
                None,
                positions[seq_ids == s],
                int(ctx[s]),
                causal=True,
                window=None,
                softcap=None,
                scale=None,
            )
            for s in range(2)
        ]
    )
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "shapes,kw,msg",
    [
        (dict(q=[T, 5, 8], k=[2, 9, 2, 8], v=[2, 9, 2, 8]), {}, "not a multiple"),
        (dict(q=[T, 4, 9], k=[2, 9, 2, 8], v=[2, 9, 2, 8]), {}, "query head width"),
        (dict(q=[T, 4, 8], k=[2, 9, 2, 8], v=[2, 7, 2, 8]), {}, "differ before the head width"),
        (dict(q=[T, 4, 8], k=[3, 9, 2, 8], v=[3, 9, 2, 8]), {}, "one row per sequence"),
    ],
)
def test_attention_type_errors(shapes, kw, msg):
    b = GraphBuilder()
    ins = {n: b.input(n, "f32", s) for n, s in shapes.items()}
    with pytest.raises(ShapeError, match=msg):
        b.attention(ins["q"], ins["k"], ins["v"], positions=b.input("p", "i32", [T]), seq_ids=b.input("s", "i32", [T]), ctx_lens=b.input("c", "i32", [2]), **kw)
