"""Sampling as the plain formula (the oracle of the sampling kernel), with thresholds found by sorting.

Per row: penalties (repetition divides positive / multiplies negative logits of seen tokens; presence
and frequency subtract), temperature (0: greedy), top-k (keep logits >= the k-th largest), top-p over
what top-k kept (keep logits >= the smallest logit of the shortest prefix, by descending probability,
whose mass reaches p), min-p (keep probabilities >= min_p * the largest), then Gumbel-max with
``gumbel_uniform(seed, step, token)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sample_reference", "sample_scores", "gumbel_uniform", "sampling_hash", "logprobs_reference", "MASKED"]


def sampling_hash(seeds: int | np.ndarray, step: int, tokens: int | np.ndarray) -> np.ndarray:
    """The counter-based 32-bit hash of (seed, step, token) the draw is made from (a murmur3-style
    finaliser); ``seeds`` and ``tokens`` broadcast."""
    with np.errstate(over="ignore"):
        h = (
            (np.asarray(seeds, np.int64) & 0xFFFFFFFF).astype(np.uint32)
            ^ (np.uint32(step & 0xFFFFFFFF) * np.uint32(0x9E3779B1))
            ^ (np.asarray(tokens).astype(np.uint32) * np.uint32(0x27D4EB2D))
        )
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))


def gumbel_uniform(seed: int, step: int, tokens: np.ndarray) -> np.ndarray:
    """The counter-based uniform of each token id: 23 bits of ``sampling_hash`` and a half, over
    2^23, so every value is an exact f32 in [2^-24, 1 - 2^-24] (24 bits and a half would round the
    largest up to 1.0, whose Gumbel noise is infinite)."""
    h = sampling_hash(seed, step, tokens)
    return (((h >> np.uint32(9)) & np.uint32(0x7FFFFF)).astype(np.float32) + np.float32(0.5)) / np.float32(8388608.0)


MASKED = np.float32(-3.0e38)  # a disallowed token's logit after the mask
GUMBEL_FLOOR = 5.9e-8  # -log(u) is at least ~5.96e-8; the kernel floors it here (an approximate log near 1 may give 0)


def sample_reference(
    logits: np.ndarray,
    counts: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    repetition: np.ndarray,
    presence: np.ndarray,
    frequency: np.ndarray,
    seeds: np.ndarray,
    steps: np.ndarray,
    mask: np.ndarray | None = None,
    bias_ids: np.ndarray | None = None,
    bias_vals: np.ndarray | None = None,
) -> np.ndarray:
    """Each row's token: the argmax of ``sample_scores`` (the arguments are its)."""
    return np.argmax(
        sample_scores(logits, counts, temperature, top_k, top_p, min_p, repetition, presence, frequency, seeds, steps, mask, bias_ids, bias_vals), axis=1
    ).astype(np.int32)


def sample_scores(
    logits: np.ndarray,
    counts: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    repetition: np.ndarray,
    presence: np.ndarray,
    frequency: np.ndarray,
    seeds: np.ndarray,
    steps: np.ndarray,
    mask: np.ndarray | None = None,
    bias_ids: np.ndarray | None = None,
    bias_vals: np.ndarray | None = None,
) -> np.ndarray:
    """Each token's score in f64 ([rows, vocab]; -inf where filtered out): the processed logit plus
    its Gumbel noise, whose argmax is the draw. ``counts`` is [rows, vocab] (each row's history);
    ``mask`` [rows, ceil(vocab / 32)] int32 words, bit set = allowed; ``bias_ids`` / ``bias_vals``
    [rows, n] (id < 0 unused), added first."""
    rows, vocab = logits.shape
    out = np.empty((rows, vocab), np.float64)
    for r in range(rows):
        z = logits[r].astype(np.float32).copy()
        if bias_ids is not None:
            for bid, bv in zip(bias_ids[r].tolist(), bias_vals[r]):
                if 0 <= bid < vocab:
                    z[bid] = z[bid] + np.float32(bv)
        c = counts[r]
        seen = c > 0
        z[seen] = np.where(z[seen] > 0, z[seen] / np.float32(repetition[r]), z[seen] * np.float32(repetition[r]))
        z[seen] = z[seen] - np.float32(presence[r]) - np.float32(frequency[r]) * c[seen].astype(np.float32)
        temp = np.float32(temperature[r])
        if temp > 0:
            z = z / temp
        if mask is not None:
            bits = (mask[r].view(np.uint32)[np.arange(vocab) >> 5] >> (np.arange(vocab) & 31).astype(np.uint32)) & 1
            z[bits == 0] = MASKED
        keep = np.ones(vocab, bool)
        if temp > 0:
            if 0 < top_k[r] < vocab:
                keep &= z >= np.sort(z)[::-1][top_k[r] - 1]
            if top_p[r] < 1.0:
                zmax = z.max()
                kept = np.sort(z[keep])[::-1]
                probs = np.exp((kept - zmax).astype(np.float64))
                cum = np.cumsum(probs)
                n = int(np.searchsorted(cum, top_p[r] * cum[-1] * (1 - 1e-7)))
                keep &= z >= kept[min(n, len(kept) - 1)]
        if min_p[r] > 0:
            keep &= z >= z.max() + np.log(np.float32(min_p[r]))
        score = z.astype(np.float64)
        if temp > 0:
            u = gumbel_uniform(int(seeds[r]), int(steps[r]), np.arange(vocab)).astype(np.float64)
            score = score - np.log(np.maximum(-np.log(u), GUMBEL_FLOOR))
        score[~keep] = -np.inf
        out[r] = score
    return out


def logprobs_reference(logits: np.ndarray, tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log_softmax of each row (f64, rounded to f32): the chosen token's, and the n largest
    (ids largest first, ties to the lower id)."""
    z = logits.astype(np.float64)
    lse = z.max(-1, keepdims=True) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    lp = z - lse
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :n]
    chosen = np.take_along_axis(lp, tokens.reshape(-1, 1).astype(np.int64), -1)[:, 0]
    return chosen.astype(np.float32), order.astype(np.int32), np.take_along_axis(lp, order, -1).astype(np.float32)
