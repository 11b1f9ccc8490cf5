"""Paged attention with online softmax (FlashAttention-2's rescaling, arXiv:2307.08691), reading keys
and values in place from KV pools through block tables, with every variant the fused attention op
types: grouped KV heads, a value head narrower than the key head, a key split into a per-head part
and a shared part (MLA), causal and sliding-window masks, soft-capping and a given scale.

One workgroup per (query token, query head), or per (token, head, context split) for decode: the
context is walked in tiles of BLOCK positions; each thread scores one position of the tile, then
owns one output dimension (BLOCK >= Dv). With SPLITS > 1 each split writes its running max, sum and
partial output, and ``attention_merge`` combines them (flash-decoding).
"""

from __future__ import annotations

from ...graph.dtypes import f32, i32
from ..frontend import Const, In, Out, kernel


@kernel(workgroup=("BLOCK", 1, 1))
def attention(
    q: In[f32],
    k_pool: In["PT"],
    v_pool: In["PT"],
    ks_pool: In["PT"],
    positions: In[i32],
    seq_ids: In[i32],
    ctx_lens: In[i32],
    block_tables: In[i32],
    out: Out[f32],
    part_m: Out[f32],
    part_l: Out[f32],
    hq: i32,
    hkv: i32,
    dk: i32,
    dv: i32,
    dr: i32,
    bs: i32,
    mb: i32,
    scale: f32,
    window: i32,
    softcap: f32,
    CAUSAL: Const = True,
    SPLITS: Const = 1,
    BLOCK: Const = 64,
    PT: Const = "f32",
):
    """out[t, h, :] = softmax(scale * q.k) v over the visible context; grid (tokens, hq, SPLITS)."""
    t = group_id(0)
    h = group_id(1)
    split = group_id(2)
    tid = thread_id(0)
    scores = shared(f32, BLOCK)
    slots = shared(i32, BLOCK)
    qs = shared(f32, 1024)  # the query row (dk + dr <= 1024: the planner checks)
    g = h // (hq // hkv)
    s = seq_ids[t]
    pos = positions[t]
    end = ctx_lens[s]
    if CAUSAL:
        end = min(end, pos + 1)
    start = 0
    if window > 0:
        start = max(0, pos - window + 1)
    if SPLITS > 1:  # this workgroup's share of the context, in whole tiles
        tiles = (end - start + BLOCK - 1) // BLOCK
        per = (tiles + SPLITS - 1) // SPLITS
        s0 = start + split * per * BLOCK
        end = min(end, s0 + per * BLOCK)
        start = s0
    qb = (t * hq + h) * (dk + dr)
    for d in range(tid, dk + dr, BLOCK):
        qs[d] = q[qb + d]
    barrier()
    dk4 = dk // 4 * 4
    m = -3.0e38
    l = 0.0
    acc = 0.0
    for j0 in range(start, end, BLOCK):
        j = j0 + tid
        sc = -3.0e38
        slot = 0
        if j < end:
            slot = block_tables[s * mb + j // bs] * bs + j % bs
            kb = (slot * hkv + g) * dk
            dot = 0.0
            for d in range(0, dk4, 4):  # four independent loads a step
                k0 = f32(k_pool[kb + d])
                k1 = f32(k_pool[kb + d + 1])
                k2 = f32(k_pool[kb + d + 2])
                k3 = f32(k_pool[kb + d + 3])
                dot += qs[d] * k0
                dot += qs[d + 1] * k1
                dot += qs[d + 2] * k2
                dot += qs[d + 3] * k3
            for d in range(dk4, dk):
                dot += qs[d] * f32(k_pool[kb + d])
            for d in range(dr):
                dot += qs[dk + d] * f32(ks_pool[slot * dr + d])
            sc = dot * scale
            if softcap > 0.0:
                sc = tanh(sc / softcap) * softcap
        scores[tid] = sc
        slots[tid] = slot
        barrier()
        n = min(BLOCK, end - j0)
        m_new = m
        for i in range(n):
            m_new = max(m_new, scores[i])
        corr = exp(m - m_new)
        l = l * corr
        acc = acc * corr
        vo = g * dv + min(tid, dv - 1)  # threads past dv load what the last one does and store nothing
        n4 = n // 4 * 4
        for i in range(0, n4, 4):  # the slots come from workgroup memory: four value loads in flight
            v0 = f32(v_pool[slots[i] * hkv * dv + vo])
            v1 = f32(v_pool[slots[i + 1] * hkv * dv + vo])
            v2 = f32(v_pool[slots[i + 2] * hkv * dv + vo])
            v3 = f32(v_pool[slots[i + 3] * hkv * dv + vo])
            p0 = exp(scores[i] - m_new)
            p1 = exp(scores[i + 1] - m_new)
            p2 = exp(scores[i + 2] - m_new)
            p3 = exp(scores[i + 3] - m_new)
            l += p0
            l += p1
            l += p2
            l += p3
            acc += p0 * v0
            acc += p1 * v1
            acc += p2 * v2
            acc += p3 * v3
        for i in range(n4, n):
            p = exp(scores[i] - m_new)
            l += p
            acc += p * f32(v_pool[slots[i] * hkv * dv + vo])
        m = m_new
        barrier()
    if tid < dv:
        o = ((t * hq + h) * SPLITS + split) * dv + tid if SPLITS > 1 else (t * hq + h) * dv + tid
        if SPLITS > 1:
            out[o] = acc
        elif l > 0.0:
            out[o] = acc / l
        else:
            out[o] = 0.0
    if SPLITS > 1 and tid == 0:
        part_m[(t * hq + h) * SPLITS + split] = m
        part_l[(t * hq + h) * SPLITS + split] = l


@kernel(workgroup=("BLOCK", 1, 1))
def attention_merge(part_acc: In[f32], part_m: In[f32], part_l: In[f32], out: Out[f32], dv: i32, SPLITS: Const = 4, BLOCK: Const = 64):
    """Combine SPLITS partial results of one (token, head): grid (tokens * heads,)."""
    r = group_id(0)
    for d in range(thread_id(0), dv, BLOCK):
        m = -3.0e38
        for i in range(SPLITS):
            m = max(m, part_m[r * SPLITS + i])
        l = 0.0
        acc = 0.0
        for i in range(SPLITS):
            w = exp(part_m[r * SPLITS + i] - m)
            l += part_l[r * SPLITS + i] * w
            acc += part_acc[(r * SPLITS + i) * dv + d] * w
        out[r * dv + d] = acc / l if l > 0.0 else 0.0


@kernel(workgroup=(1, 1, 1))
def attention_merge_lanes(part_acc: In[f32], part_m: In[f32], part_l: In[f32], out: Out[f32], dv: i32, SPLITS: Const = 8):
    """``attention_merge`` for a CPU core: the shares' weights once a (token, head), then one pass
    over the values (a thread a value would take SPLITS exponentials for each); grid (tokens * heads,)."""
    r = group_id(0)
    wt = shared(f32, SPLITS)
    m = -3.0e38
    for i in range(SPLITS):
        m = max(m, part_m[r * SPLITS + i])
    l = 0.0
    for i in range(SPLITS):
        wt[i] = exp(part_m[r * SPLITS + i] - m)
        l += part_l[r * SPLITS + i] * wt[i]
    for d in range(dv):
        acc = 0.0
        for i in static_range(SPLITS):
            acc += part_acc[(r * SPLITS + i) * dv + d] * wt[i]
        out[r * dv + d] = acc / l if l > 0.0 else 0.0


@kernel(workgroup=(1, 1, 1))
def attention_lanes(
    q: In[f32],
    k_pool: In["PT"],
    v_pool: In["PT"],
    ks_pool: In["PT"],
    positions: In[i32],
    seq_ids: In[i32],
    ctx_lens: In[i32],
    block_tables: In[i32],
    out: Out[f32],
    part_m: Out[f32],
    part_l: Out[f32],
    mb: i32,
    scale: f32,
    window: i32,
    softcap: f32,
    HQ: Const = 8,
    HKV: Const = 8,
    DK: Const = 64,
    DV: Const = 64,
    DR: Const = 0,
    BS: Const = 16,
    CAUSAL: Const = True,
    TILE: Const = 16,
    PT: Const = "f32",
    GQ: Const = 1,
    SPLITS: Const = 1,
):
    """The same attention scheduled for a CPU core: one workgroup per (query token, GQ query heads
    of one KV head), those heads scored together, so each key and value is read (and widened) once
    for all of them; head dimensions static, so dot products and the value accumulation run as
    16-lane vectors; the context is scored TILE positions at a time (one rescale per tile). Grid
    (tokens, HQ / GQ, SPLITS); GQ divides HQ / HKV. With SPLITS > 1 each workgroup takes its share of
    the context (whole tiles) and writes its heads' running max, sum and unscaled output for
    ``attention_merge``, as ``attention`` does: a decode step's few workgroups become enough for
    every core."""
    t = group_id(0)
    h0 = group_id(1) * GQ  # the workgroup's first query head
    split = group_id(2)
    g = h0 // (HQ // HKV)
    acc = shared(f32, GQ * DV)
    lanes = shared(f32, GQ * 16)
    sc = shared(f32, GQ * TILE)
    mh = shared(f32, GQ)  # per query head: running max, sum, the tile's max
    lh = shared(f32, GQ)
    tmx = shared(f32, GQ)
    s = seq_ids[t]
    pos = positions[t]
    end = ctx_lens[s]
    if CAUSAL:
        end = min(end, pos + 1)
    start = 0
    if window > 0:
        start = max(0, pos - window + 1)
    if SPLITS > 1:  # this workgroup's share of the context, in whole tiles
        tiles = (end - start + TILE - 1) // TILE
        per = (tiles + SPLITS - 1) // SPLITS
        s0 = start + split * per * TILE
        end = min(end, s0 + per * TILE)
        start = s0
    qb = (t * HQ + h0) * (DK + DR)  # head h0 + hh at qb + hh * (DK + DR)
    for d in range(GQ * DV):
        acc[d] = 0.0
    for hh in static_range(GQ):
        mh[hh] = -3.0e38
        lh[hh] = 0.0
    for j0 in range(start, end, TILE):
        n = min(TILE, end - j0)
        for hh in static_range(GQ):
            tmx[hh] = -3.0e38
        for jj in range(n):
            j = j0 + jj
            slot = block_tables[s * mb + j // BS] * BS + j % BS
            kb = (slot * HKV + g) * DK
            for i in range(GQ * 16):
                lanes[i] = 0.0
            for c in static_range(DK // 16):
                for i in range(16):
                    kv = f32(k_pool[kb + c * 16 + i])
                    for hh in static_range(GQ):
                        lanes[hh * 16 + i] += q[qb + hh * (DK + DR) + c * 16 + i] * kv
            for d in range(DK // 16 * 16, DK):
                kv = f32(k_pool[kb + d])
                for hh in static_range(GQ):
                    lanes[hh * 16] += q[qb + hh * (DK + DR) + d] * kv
            for d in range(DR):
                kv = f32(ks_pool[slot * DR + d])
                for hh in static_range(GQ):
                    lanes[hh * 16] += q[qb + hh * (DK + DR) + DK + d] * kv
            for hh in static_range(GQ):
                for w in static_range(4):
                    for i in range(8 >> w):
                        lanes[hh * 16 + i] += lanes[hh * 16 + i + (8 >> w)]
                x = lanes[hh * 16] * scale
                if softcap > 0.0:
                    x = tanh(x / softcap) * softcap
                sc[hh * TILE + jj] = x
                tmx[hh] = max(tmx[hh], x)
        for hh in static_range(GQ):
            m_new = max(mh[hh], tmx[hh])
            corr = exp(mh[hh] - m_new)
            lh[hh] = lh[hh] * corr
            mh[hh] = m_new
            for d in range(DV):
                acc[hh * DV + d] = acc[hh * DV + d] * corr
        for jj in range(n):
            j = j0 + jj
            vb = ((block_tables[s * mb + j // BS] * BS + j % BS) * HKV + g) * DV
            for hh in static_range(GQ):
                sc[hh * TILE + jj] = exp(sc[hh * TILE + jj] - mh[hh])  # the weight p
                lh[hh] += sc[hh * TILE + jj]
            for d in range(DV):
                vv = f32(v_pool[vb + d])
                for hh in static_range(GQ):
                    acc[hh * DV + d] += sc[hh * TILE + jj] * vv
    for hh in static_range(GQ):
        if SPLITS > 1:
            part = (t * HQ + h0 + hh) * SPLITS + split
            for d in range(DV):
                out[part * DV + d] = acc[hh * DV + d]
            part_m[part] = mh[hh]
            part_l[part] = lh[hh]
        else:
            ob = (t * HQ + h0 + hh) * DV
            for d in range(DV):
                if lh[hh] > 0.0:
                    out[ob + d] = acc[hh * DV + d] / lh[hh]
                else:
                    out[ob + d] = 0.0


@kernel(workgroup=(128, 1, 1))
def attention_blocks(
    q: In[f32],
    k_pool: In["PT"],
    v_pool: In["PT"],
    ks_pool: In["PT"],
    positions: In[i32],
    seq_ids: In[i32],
    ctx_lens: In[i32],
    block_tables: In[i32],
    out: Out[f32],
    ntok: i32,
    hq: i32,
    hkv: i32,
    dk: i32,
    dv: i32,
    dr: i32,
    bs: i32,
    mb: i32,
    scale: f32,
    window: i32,
    softcap: f32,
    CAUSAL: Const = True,
    QT: Const = 16,
    KT: Const = 16,
    D: Const = 128,
    PT: Const = "f32",
):
    """The same attention for prefill: a workgroup takes QT consecutive query tokens of one head and
    walks their sequence's keys KT at a time, each key and value tile loaded once into workgroup
    memory for all QT queries (rather than once per query). A block holding tokens of several
    sequences takes them one sequence at a time. Head widths up to D. Grid (ceil(tokens / QT), hq)."""
    tb = group_id(0) * QT
    h = group_id(1)
    tid = thread_id(0)
    g = h // (hq // hkv)
    dq = dk + dr
    qs = shared(f32, QT * (D + 1))  # rows padded by one: a column walk hits every bank once
    ks = shared(f32, KT * (D + 1))
    vs = shared(f32, KT * (D + 1))
    os = shared(f32, QT * (D + 1))
    ps = shared(f32, QT * KT)
    kslot = shared(i32, KT)
    rm = shared(f32, QT)  # per query row: running max, sum, this tile's correction
    rl = shared(f32, QT)
    rc = shared(f32, QT)
    rowseq = shared(i32, QT)
    rowpos = shared(i32, QT)
    member = shared(i32, QT)  # 1: in the sequence being done; done rows get -1
    red = shared(i32, 128)
    nvalid = min(QT, ntok - tb)
    for e in range(tid, QT * dq, 128):
        r = e // dq
        tok = min(tb + r, ntok - 1)
        qs[r * (D + 1) + e % dq] = q[(tok * hq + h) * dq + e % dq]
    if tid < QT:
        tok = min(tb + tid, ntok - 1)
        rowseq[tid] = seq_ids[tok]
        rowpos[tid] = positions[tok]
        member[tid] = 0 if tid < nvalid else -1
    barrier()
    for _ in range(QT):  # one sequence of the block at a time: at most QT of them
        red[tid] = 1024
        if tid < QT:  # (a conditional expression would read member[] past its end: both sides are evaluated)
            if member[tid] == 0:
                red[tid] = tid
        reduce_shared(red, "min")
        first = red[0]
        barrier()
        if first < QT:
            s = rowseq[first]
            clen = ctx_lens[s]
            # this sequence's rows, and the keys they can see: [kstart, kend)
            lo = 2147483647
            hi = 0
            if tid < QT:
                if member[tid] == 0 and rowseq[tid] == s:
                    member[tid] = 1
                    p_end = clen
                    if CAUSAL:
                        p_end = min(clen, rowpos[tid] + 1)
                    hi = p_end
                    lo = 0
                    if window > 0:
                        lo = max(0, rowpos[tid] - window + 1)
            red[tid] = lo
            reduce_shared(red, "min")
            kstart = red[0]
            barrier()
            red[tid] = hi
            reduce_shared(red, "max")
            kend = red[0]
            barrier()
            for e in range(tid, QT * dv, 128):
                os[(e // dv) * (D + 1) + e % dv] = 0.0
            if tid < QT:
                rm[tid] = -3.0e38
                rl[tid] = 0.0
            barrier()
            for j0 in range(kstart, kend, KT):
                n = min(KT, kend - j0)
                if tid < KT:
                    jj = min(j0 + tid, kend - 1)
                    kslot[tid] = block_tables[s * mb + jj // bs] * bs + jj % bs
                barrier()
                for e in range(tid, KT * dk, 128):
                    kr = e // dk
                    ks[kr * (D + 1) + e % dk] = f32(k_pool[(kslot[kr] * hkv + g) * dk + e % dk])
                for e in range(tid, KT * dr, 128):
                    kr = e // dr
                    ks[kr * (D + 1) + dk + e % dr] = f32(ks_pool[kslot[kr] * dr + e % dr])
                for e in range(tid, KT * dv, 128):
                    kr = e // dv
                    vs[kr * (D + 1) + e % dv] = f32(v_pool[(kslot[kr] * hkv + g) * dv + e % dv])
                barrier()
                for e in range(tid, QT * KT, 128):  # scores, masked to -3e38
                    r = e // KT
                    c = e % KT
                    jp = j0 + c
                    sc = -3.0e38
                    if c < n and member[r] == 1:
                        vis = jp < clen
                        if CAUSAL:
                            vis = vis and jp <= rowpos[r]
                        if window > 0:
                            vis = vis and jp > rowpos[r] - window
                        if vis:
                            dot = 0.0
                            for d in range(dq):
                                dot += qs[r * (D + 1) + d] * ks[c * (D + 1) + d]
                            sc = dot * scale
                            if softcap > 0.0:
                                sc = tanh(sc / softcap) * softcap
                    ps[e] = sc
                barrier()
                if tid < QT:  # online softmax, a row per thread
                    m_old = rm[tid]
                    m_new = m_old
                    for c in range(KT):
                        m_new = max(m_new, ps[tid * KT + c])
                    corr = exp(m_old - m_new) if m_old > -1.0e38 else 0.0
                    lsum = rl[tid] * corr
                    for c in range(KT):
                        x = ps[tid * KT + c]
                        p = exp(x - m_new) if x > -1.0e38 else 0.0
                        ps[tid * KT + c] = p
                        lsum += p
                    rl[tid] = lsum
                    rm[tid] = m_new
                    rc[tid] = corr
                barrier()
                for e in range(tid, QT * dv, 128):
                    r = e // dv
                    d = e % dv
                    acc = os[r * (D + 1) + d] * rc[r]
                    for c in range(KT):
                        acc += ps[r * KT + c] * vs[c * (D + 1) + d]
                    os[r * (D + 1) + d] = acc
                barrier()
            for e in range(tid, QT * dv, 128):
                r = e // dv
                if member[r] == 1:
                    lr = rl[r]
                    out[((tb + r) * hq + h) * dv + e % dv] = os[r * (D + 1) + e % dv] / lr if lr > 0.0 else 0.0
            barrier()
            if tid < QT:
                if member[tid] == 1:
                    member[tid] = -1
            barrier()
