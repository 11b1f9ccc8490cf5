"""Sampling on the device: logit bias, penalties, temperature, an allowed-token mask (guided
decoding), top-k, top-p, min-p, and a counter-based draw; only the token id leaves the device. Two
launches: ``sample_chunks`` processes each row in chunks, a workgroup each, and finds each chunk's
best token of an unfiltered draw; ``sample``, a workgroup a row, takes the best of those (greedy
decoding, plain temperature) or filters the row and draws again. Log-probabilities of the chosen
and the top-N tokens come from ``logprobs``.

Filtering keeps every token whose logit reaches a threshold, so ties at the boundary are kept. Top-k
and top-p thresholds are found exactly by bisection over the order-preserving integer image of the
f32 logits (32 steps); top-p applies to the distribution left by top-k. The draw is the Gumbel-max
trick with a counter-based hash of (seed, step, token), so the same seed gives the same tokens on
every backend. Temperature 0 means greedy (argmax after penalties).
"""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, inline, kernel

PART_WORDS = 3  # a chunk's (max, best score, best index) in ``parts``: the index as an f32 value (exact below 2**24)


@inline
def gumbel_score(z: f32, seed: i32, step: i32, i: i32) -> f32:
    """Token ``i``'s Gumbel-max score: its processed logit ``z`` plus Gumbel noise from the uniform
    of the counter-based hash of (seed, step, token) (``eval.sampling.sampling_hash``, a murmur3-style
    finaliser; its logical shifts written as arithmetic ones and a mask)."""
    h = seed ^ (step * -1640531535) ^ (i * 668265261)
    h = h ^ ((h >> 16) & 65535)
    h = h * -2048144789
    h = h ^ ((h >> 13) & 524287)
    h = h * -1028477387
    h = h ^ ((h >> 16) & 65535)
    u = (f32((h >> 9) & 8388607) + 0.5) / 8388608.0  # in [2^-24, 1 - 2^-24], exactly
    return z - log(max(-log(u), 5.9e-8))  # the floor: an approximate log near 1 may give 0


@kernel(workgroup=("BLOCK", 1, 1))
def sample_chunks(
    logits: In[f32],
    counts: In[i32],
    count_rows: In[i32],
    temperature: In[f32],
    repetition: In[f32],
    presence: In[f32],
    frequency: In[f32],
    seeds: In[i32],
    steps: In[i32],
    mask: In[i32],
    bias_ids: In[i32],
    bias_vals: In[f32],
    work: Out[f32],
    parts: Out[f32],
    vocab: i32,
    mask_words: i32,
    nbias: i32,
    chunk: i32,
    BLOCK: Const = 256,
    PART: Const = PART_WORDS,
):
    """The first half of sampling, a workgroup per ``chunk`` tokens of a row (grid (rows, chunks)):
    logit bias (``nbias`` (id, value) pairs, id < 0 unused, added in their order), penalties from
    ``counts[count_rows[r]]`` (a row < 0: no history), temperature, then the allowed-token bitmask
    (bit clear: the logit becomes -3e38) into ``work``; then the chunk's largest processed logit and
    its best token of an unfiltered draw (the Gumbel-max score at temperature > 0, the logit at 0;
    ties to the lower id) into ``parts[(r * chunks + c) * PART ...]``. Each thread keeps its tokens'
    values in registers from the logit to ``work``: the row's settings, the logits, the bias pairs,
    the mask and the counts are loaded together, a chain of two loads, not one per stage (it runs
    on the step's path, between the output head and the pick)."""
    r = group_id(0)
    c = group_id(1)
    t = thread_id(0)
    base = r * vocab
    first = c * chunk
    stop = min(first + chunk, vocab)
    red = shared(f32, BLOCK)
    cnt = shared(i32, BLOCK)
    temp = temperature[r]
    crow = count_rows[r]
    seed = seeds[r]
    step = steps[r]
    rep = repetition[r]
    pres = presence[r]
    freq = frequency[r]
    m = -3.0e38
    best = -3.0e38
    best_i = vocab
    for i in range(first + t, stop, BLOCK):
        z = logits[base + i]
        for j in range(nbias):
            if bias_ids[r * nbias + j] == i:
                z = z + bias_vals[r * nbias + j]
        n = 0
        if crow >= 0:
            n = counts[crow * vocab + i]
        if n > 0:
            z = z / rep if z > 0.0 else z * rep
            z = z - pres - freq * f32(n)
        if temp > 0.0:
            z = z / temp
        if ((mask[r * mask_words + (i >> 5)] >> (i & 31)) & 1) == 0:
            z = -3.0e38
        work[base + i] = z
        m = max(m, z)
        if z >= -3.0e38:
            score = z
            if temp > 0.0:
                score = gumbel_score(z, seed, step, i)
            if score > best:
                best = score
                best_i = i
    red[t] = m
    reduce_shared(red, "max")
    if t == 0:
        parts[(r * num_groups(1) + c) * PART] = red[0]
    barrier()
    red[t] = best
    cnt[t] = best_i
    reduce_argmax(red, cnt)
    if t == 0:
        parts[(r * num_groups(1) + c) * PART + 1] = red[0]
        parts[(r * num_groups(1) + c) * PART + 2] = f32(cnt[0])


@kernel(workgroup=(1, 1, 1))
def sample_chunks_lanes(
    logits: In[f32],
    counts: In[i32],
    count_rows: In[i32],
    temperature: In[f32],
    repetition: In[f32],
    presence: In[f32],
    frequency: In[f32],
    seeds: In[i32],
    steps: In[i32],
    mask: In[i32],
    bias_ids: In[i32],
    bias_vals: In[f32],
    work: Out[f32],
    parts: Out[f32],
    vocab: i32,
    mask_words: i32,
    nbias: i32,
    chunk: i32,
    PART: Const = PART_WORDS,
):
    """``sample_chunks`` for a CPU core: the chunk in token order, every token processed by the same
    operations, and no workgroup of threads to run as loops around its reductions. A first pass
    writes the processed logits and their maximum; a second (one loop for greedy rows, another for
    draws, so that a greedy row never computes the noise) finds the best, the first of equal scores
    kept: ties to the lower id. Grid (rows, chunks)."""
    r = group_id(0)
    c = group_id(1)
    base = r * vocab
    first = c * chunk
    stop = min(first + chunk, vocab)
    temp = temperature[r]
    crow = count_rows[r]
    seed = seeds[r]
    step = steps[r]
    rep = repetition[r]
    pres = presence[r]
    freq = frequency[r]
    m = -3.0e38
    best = -3.0e38
    best_i = vocab
    picked = 0  # the greedy pick made in the first pass
    mx = shared(f32, 16)  # the lanes' largest values, and their best scores and ids
    bv = shared(f32, 16)
    bi = shared(i32, 16)
    biased = 0
    for j in range(nbias):
        if bias_ids[r * nbias + j] >= 0:
            biased = 1
    if biased > 0 or (crow >= 0 and (rep != 1.0 or pres != 0.0 or freq != 0.0)):  # biases or penalties: every stage, token by token
        for i in range(first, stop):
            z = logits[base + i]
            for j in range(nbias):
                if bias_ids[r * nbias + j] == i:
                    z = z + bias_vals[r * nbias + j]
            n = 0
            if crow >= 0:
                n = counts[crow * vocab + i]
            if n > 0:
                z = z / rep if z > 0.0 else z * rep
                z = z - pres - freq * f32(n)
            if temp > 0.0:
                z = z / temp
            if ((mask[r * mask_words + (i >> 5)] >> (i & 31)) & 1) == 0:
                z = -3.0e38
            work[base + i] = z
            m = max(m, z)
    else:  # the common rows: sixteen lanes of tokens side by side (the maximum's and the greedy pick's chains apart)
        for l in static_range(16):
            mx[l] = -3.0e38
            bv[l] = -3.0e38
            bi[l] = vocab
        main = first + (stop - first) // 16 * 16
        for i0 in range(first, main, 16):
            bits = mask[r * mask_words + (i0 >> 5)] >> (i0 & 31)  # the lanes' sixteen bits: chunk is a multiple of 16
            for l in static_range(16):
                i = i0 + l
                z = logits[base + i]
                z = select(temp > 0.0, z / temp, z)
                z = select(((bits >> l) & 1) == 0, -3.0e38, z)
                work[base + i] = z
                mx[l] = max(mx[l], z)
                take = z > bv[l]  # in a lane, the first of equal values stays
                bv[l] = select(take, z, bv[l])
                bi[l] = select(take, i, bi[l])
        for l in static_range(16):  # the lanes' best: the largest value, the lowest id among equals
            m = max(m, mx[l])
            take = bv[l] > best or (bv[l] == best and bi[l] < best_i)
            best = select(take, bv[l], best)
            best_i = select(take, bi[l], best_i)
        for i in range(main, stop):  # ids past every lane's
            z = logits[base + i]
            z = select(temp > 0.0, z / temp, z)
            z = select(((mask[r * mask_words + (i >> 5)] >> (i & 31)) & 1) == 0, -3.0e38, z)
            work[base + i] = z
            m = max(m, z)
            if z > best:
                best = z
                best_i = i
        picked = 1
    if temp > 0.0:  # the draw in a loop of its own: greedy rows never pay for the noise's logarithms
        best = -3.0e38
        best_i = vocab
        main = first + (stop - first) // 16 * 16
        for l in static_range(16):
            bv[l] = -3.0e38
            bi[l] = vocab
        for i0 in range(first, main, 16):  # in 16 lanes, each its own chain of hashes and logarithms
            for l in static_range(16):
                i = i0 + l
                z = work[base + i]
                score = gumbel_score(z, seed, step, i)
                take = z >= -3.0e38 and score > bv[l]  # in a lane, the first of equal scores stays
                bv[l] = select(take, score, bv[l])
                bi[l] = select(take, i, bi[l])
        for l in static_range(16):  # the lanes' best: the largest score, the lowest id among equals
            take = bv[l] > best or (bv[l] == best and bi[l] < best_i)
            best = select(take, bv[l], best)
            best_i = select(take, bi[l], best_i)
        for i in range(main, stop):
            z = work[base + i]
            if z >= -3.0e38:
                score = gumbel_score(z, seed, step, i)
                if score > best:
                    best = score
                    best_i = i
    elif picked == 0:
        for i in range(first, stop):
            z = work[base + i]
            if z >= -3.0e38 and z > best:
                best = z
                best_i = i
    parts[(r * num_groups(1) + c) * PART] = m
    parts[(r * num_groups(1) + c) * PART + 1] = best
    parts[(r * num_groups(1) + c) * PART + 2] = f32(best_i)


@kernel(workgroup=("BLOCK", 1, 1))
def sample(
    work: In[f32],
    parts: In[f32],
    temperature: In[f32],
    top_k: In[i32],
    top_p: In[f32],
    min_p: In[f32],
    seeds: In[i32],
    steps: In[i32],
    tokens: Out[i32],
    vocab: i32,
    chunks: i32,
    BLOCK: Const = 256,
    PART: Const = PART_WORDS,
):
    """tokens[r] = a sample from row r of ``work`` as ``sample_chunks`` left it (``chunks`` parts a
    row). A row without top-k, top-p or min-p (or at temperature 0: greedy, argmax after penalties)
    takes its chunks' best; otherwise top-k, top-p and min-p filter the row and the Gumbel-max draw
    runs over what they keep. Grid (rows,)."""
    r = group_id(0)
    t = thread_id(0)
    base = r * vocab
    red = shared(f32, BLOCK)
    cnt = shared(i32, BLOCK)
    temp = temperature[r]
    k = top_k[r]
    p = top_p[r]
    m = -3.0e38
    for j in range(t, chunks, BLOCK):
        m = max(m, parts[(r * chunks + j) * PART])
    red[t] = m
    reduce_shared(red, "max")
    zmax = red[0]
    barrier()
    best = -3.0e38
    best_i = vocab
    if temp > 0.0 and ((k > 0 and k < vocab) or p < 1.0 or min_p[r] > 0.0):
        # top-k threshold: the largest key with at least k logits at or above it
        lo = -2147483647 - 1
        hi = 2147483647
        if k > 0 and k < vocab:
            for _ in range(32):
                mid = (lo >> 1) + (hi >> 1) + (((lo & 1) + (hi & 1) + 1) >> 1)  # ceil((lo + hi) / 2), no i32 overflow
                n = 0
                for i in range(t, vocab, BLOCK):
                    bits = as_i32(work[base + i])
                    key = bits ^ ((bits >> 31) & 2147483647)
                    if key >= mid:
                        n += 1
                cnt[t] = n
                reduce_shared(cnt, "add")
                if cnt[0] >= k:
                    lo = mid
                else:
                    hi = mid - 1
                barrier()
        kth = lo
        # top-p over what top-k kept: the largest key whose mass at or above it reaches p
        plo = kth
        phi = 2147483647
        if p < 1.0:
            mass = 0.0
            for i in range(t, vocab, BLOCK):
                bits = as_i32(work[base + i])
                if bits ^ ((bits >> 31) & 2147483647) >= kth:
                    mass += exp(work[base + i] - zmax)
            red[t] = mass
            reduce_shared(red, "add")
            total = red[0]
            barrier()
            for _ in range(32):
                mid2 = (plo >> 1) + (phi >> 1) + (((plo & 1) + (phi & 1) + 1) >> 1)
                acc = 0.0
                for i in range(t, vocab, BLOCK):
                    bits = as_i32(work[base + i])
                    if bits ^ ((bits >> 31) & 2147483647) >= mid2:
                        acc += exp(work[base + i] - zmax)
                red[t] = acc
                reduce_shared(red, "add")
                if red[0] >= p * total:
                    plo = mid2
                else:
                    phi = mid2 - 1
                barrier()
        # min-p, then the Gumbel-max draw over the survivors
        floor_z = zmax + log(min_p[r]) if min_p[r] > 0.0 else -3.0e38
        seed = seeds[r]
        step = steps[r]
        for i in range(t, vocab, BLOCK):
            z = work[base + i]
            bits = as_i32(z)
            if bits ^ ((bits >> 31) & 2147483647) >= plo and z >= floor_z:
                score = gumbel_score(z, seed, step, i)
                if score > best:
                    best = score
                    best_i = i
    else:  # nothing filtered: the chunks' best tokens
        for j in range(t, chunks, BLOCK):
            v = parts[(r * chunks + j) * PART + 1]
            vi = i32(parts[(r * chunks + j) * PART + 2])
            if v > best or (v == best and vi < best_i):
                best = v
                best_i = vi
    red[t] = best
    cnt[t] = best_i
    reduce_argmax(red, cnt)
    if t == 0:
        tokens[r] = cnt[0]


@kernel(workgroup=("BLOCK", 1, 1))
def logprobs(logits: In[f32], tokens: In[i32], chosen: Out[f32], top_ids: Out[i32], top_vals: Out[f32], vocab: i32, N: Const = 1, BLOCK: Const = 256):
    """log_softmax of each row of the model's logits: the sampled token's, and the N largest (ids
    and values, largest first, ties to the lower id). Grid (rows,)."""
    r = group_id(0)
    t = thread_id(0)
    base = r * vocab
    red = shared(f32, BLOCK)
    idx = shared(i32, BLOCK)
    m = -3.0e38
    for i in range(t, vocab, BLOCK):
        m = max(m, logits[base + i])
    red[t] = m
    reduce_shared(red, "max")
    zmax = red[0]
    barrier()
    acc = 0.0
    for i in range(t, vocab, BLOCK):
        acc += exp(logits[base + i] - zmax)
    red[t] = acc
    reduce_shared(red, "add")
    lse = zmax + log(red[0])
    barrier()
    if t == 0:
        chosen[r] = logits[base + tokens[r]] - lse
    pv = 0.0
    pi = -1
    for n in static_range(N):
        bv = -3.4e38
        bi = vocab
        for i in range(t, vocab, BLOCK):
            v = logits[base + i]
            if (pi < 0 or v < pv or (v == pv and i > pi)) and (v > bv or (v == bv and i < bi)):
                bv = v
                bi = i
        red[t] = bv
        idx[t] = bi
        reduce_argmax(red, idx)
        pv = red[0]
        pi = idx[0]
        if t == 0:
            top_ids[r * N + n] = pi
            top_vals[r * N + n] = pv - lse
        barrier()


@kernel(workgroup=(64, 1, 1))
def feed_tokens(last: In[i32], tokens: In[i32], seq_ids: In[i32], count_rows: In[i32], out: Out[i32], ntokens: i32):
    """out[t] = tokens[t], or where that is negative last[count_rows[seq_ids[t]]] (0 for a row < 0):
    the tokens a step was queued without, taken from what the step before sampled. Grid
    (ceil(ntokens / 64),)."""
    t = group_id(0) * 64 + thread_id(0)
    if t < ntokens:
        # the value is chosen, then stored once: branches that each load and store let LLVM merge
        # the loads into one from a phi of two buffers' addresses, which SPIR-V cannot express
        tok = tokens[t]
        if tok < 0:
            row = count_rows[seq_ids[t]]
            tok = 0
            if row >= 0:
                tok = last[row]
        out[t] = tok


@kernel(workgroup=(64, 1, 1))
def keep_tokens(sampled: In[i32], rows: In[i32], last: Out[i32], nrows: i32):
    """last[rows[r]] = sampled[r] (a row < 0 keeps nothing). Grid (ceil(nrows / 64),)."""
    r = group_id(0) * 64 + thread_id(0)
    if r < nrows:
        row = rows[r]
        if row >= 0:
            last[row] = sampled[r]


@kernel(workgroup=(1, 1, 1))
def count_tokens(tokens: In[i32], seq_ids: In[i32], count_rows: In[i32], counts: Out[i32], ntokens: i32, vocab: i32):
    """counts[count_rows[seq_ids[t]], tokens[t]] += 1 for each token of the step (a row < 0: not
    counted): the history the penalties read. One workgroup, tokens in order. Grid (1,)."""
    for t in range(ntokens):
        row = count_rows[seq_ids[t]]
        tok = tokens[t]
        if row >= 0 and tok >= 0 and tok < vocab:
            counts[row * vocab + tok] = counts[row * vocab + tok] + 1
