"""Prefill attention alone on an NVIDIA GPU: a step of ``--tokens`` prompt tokens (Llama-3-8B heads:
32 query heads, 8 key/value heads of 128) over paged pools (``--pool`` f32 or f16), as one sequence's
prompt or ``--seqs`` sequences' prompts of equal length, through each prefill schedule, timed with
CUDA events (median of repeats, each the mean of 4 runs queued back to back), as TFLOP/s of useful
work (causal: half of the score matrix). Used to choose and tune the prefill attention, and where
the planner hands short prompts from one schedule to the other.

    python bench/gpu_attention.py [--tokens 2048] [--seqs 1 2 8] [--only mma]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _cuda import median_seconds, open_cuda0

BATCH = 4  # runs a timing (their mean)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1], help="sequences sharing the step's tokens (each tokens / seqs long)")
    ap.add_argument("--pool", choices=["f32", "f16"], default="f32", help="the key/value pools' type")
    ap.add_argument("--only", default="", help="schedules whose name contains this (under a profiler, say)")
    args = ap.parse_args()
    from poot.kernel.library import attention as attn_lib
    from poot_ptx.kernels.attention_mma import MMA_QROWS, attention_mma
    from poot_ptx.runtime import CudaKernel, target_for

    opened = open_cuda0()
    if opened is None:
        return 1
    dev, ctx = opened
    rng = np.random.default_rng(0)
    hq, hkv, dim, bs = args.heads, args.kv_heads, args.dim, 16
    print("| schedule | tokens | sequences | ms | TFLOP/s (useful) |")
    print("|---|---|---|---|---|")
    pool_np = np.float16 if args.pool == "f16" else np.float32
    for t in args.tokens:
        for nseq in args.seqs:
            if t % nseq:
                continue
            per = t // nseq  # each sequence's prompt, the whole of its context
            nb = -(-per // bs)  # blocks a sequence
            arrays = {
                "q": rng.standard_normal((t, hq, dim)).astype(np.float32),
                "k_pool": rng.standard_normal((nb * nseq, bs, hkv, dim)).astype(pool_np),
                "v_pool": rng.standard_normal((nb * nseq, bs, hkv, dim)).astype(pool_np),
                "ks_pool": np.zeros(1, pool_np),
                "positions": np.tile(np.arange(per, dtype=np.int32), nseq),
                "seq_ids": np.repeat(np.arange(nseq, dtype=np.int32), per),
                "ctx_lens": np.full(nseq, per, np.int32),
                "block_tables": rng.permutation(nb * nseq).astype(np.int32).reshape(nseq, nb),
                "out": np.zeros((t, hq, dim), np.float32),
                "part_m": np.zeros(1, np.float32),
                "part_l": np.zeros(1, np.float32),
            }
            ptrs = {}
            for name, a in arrays.items():
                ptrs[name] = ctx.alloc(a.nbytes)
                ctx.upload(ptrs[name], a)
            scalars = {"ntok": t, "hq": hq, "hkv": hkv, "dk": dim, "dv": dim, "dr": 0, "bs": bs, "mb": nb, "scale": dim**-0.5, "window": 0, "softcap": 0.0}
            # tensor cores, split operands then bf16 ones: the pools' block size as a parameter, then
            # fixed in the kernel with soft-capping left out (as plans build it for a model without it)
            kernels = [(attention_mma(dim, True, split, block, not block, args.pool), (-(-t // MMA_QROWS), hq)) for split in (True, False) for block in (0, bs)]
            kernels.append((attn_lib.attention_blocks.instantiate(CAUSAL=True, QT=16, KT=16, D=dim, PT=args.pool), (-(-t // 16), hq)))
            flops = nseq * 4 * hq * dim * per * (per + 1) / 2  # q k^T and P v over the visible half
            for kern, grid in kernels:
                if args.only not in kern.name:
                    continue
                ck = CudaKernel(ctx, kern, target_for(dev))
                bufs = {p.name: ptrs[p.name] for p in kern.buffers}
                scal = {sc.name: scalars[sc.name] for sc in kern.scalars}
                sec = median_seconds(ctx, lambda ck=ck, grid=grid, bufs=bufs, scal=scal: ck.launch(grid, bufs, scal), args.repeat, BATCH, warm=1)
                print(f"| {kern.name} | {t} | {nseq} | {sec * 1e3:.3f} | {flops / sec / 1e12:.1f} |", flush=True)
            for p in ptrs.values():
                ctx.free(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
