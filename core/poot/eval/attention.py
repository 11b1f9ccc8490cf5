"""The fused attention op as the plain formula, one query token at a time.

softmax(scale * q·kᵀ, masked) · v, with soft-capping tanh applied to the scaled logits
(Gemma 2). A query that sees no key gives zeros. Computed in float32 (float64 in float64 mode).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.attention import AttentionSpec

__all__ = ["attention_reference"]


def attention_reference(
    spec: AttentionSpec,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    positions: np.ndarray,
    seq_ids: np.ndarray,
    ctx_lens: np.ndarray,
    block_tables: np.ndarray | None = None,
    k_shared: np.ndarray | None = None,
    compute: type = np.float32,
) -> np.ndarray:
    T, Hq, Dq = q.shape
    Hkv, Dv = k.shape[2], v.shape[3]
    group = Hq // Hkv
    scale = spec.scale if spec.scale is not None else 1.0 / math.sqrt(Dq)
    out = np.zeros((T, Hq, Dv), dtype=compute)
    for t in range(T):
        s, p = int(seq_ids[t]), int(positions[t])
        if not 0 <= s < len(ctx_lens):
            raise IndexError(f"attention: token {t} has sequence id {s}, outside 0..{len(ctx_lens) - 1}")
        n = int(ctx_lens[s])
        j = np.arange(n)
        if spec.paged:
            bs = k.shape[1]
            blocks, offs = block_tables[s, j // bs], j % bs
            keys, vals = k[blocks, offs], v[blocks, offs]
            shared = k_shared[blocks, offs] if k_shared is not None else None
        else:
            keys, vals = k[s, :n], v[s, :n]
            shared = k_shared[s, :n] if k_shared is not None else None
        visible = np.ones(n, dtype=bool)
        if spec.causal:
            visible &= j <= p
        if spec.window is not None:
            visible &= j > p - spec.window
        if not visible.any():
            continue
        keys = keys[visible].astype(compute)
        vals = vals[visible].astype(compute)
        # [n, Hq, Dk]: query head h reads KV head h // group
        kh = np.repeat(keys, group, axis=1)
        if shared is not None:
            sh = np.broadcast_to(shared[visible].astype(compute)[:, None, :], (kh.shape[0], Hq, shared.shape[-1]))
            kh = np.concatenate([kh, sh], axis=-1)
        vh = np.repeat(vals, group, axis=1)
        logits = np.einsum("hd,nhd->hn", q[t].astype(compute), kh) * compute(scale)
        if spec.softcap is not None:
            c = compute(spec.softcap)
            logits = c * np.tanh(logits / c)
        logits = logits - logits.max(axis=1, keepdims=True)
        w = np.exp(logits)
        w /= w.sum(axis=1, keepdims=True)
        out[t] = np.einsum("hn,nhd->hd", w, vh)
    return out
