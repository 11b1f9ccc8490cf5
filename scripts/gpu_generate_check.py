"""Greedy generation on cuda:0 against the CPU device, same model, same prompts: the tokens must be
equal, or the first difference a near tie in the CPU device's own log-probabilities (the gap between
the two tokens there is printed; ``--near`` is the largest gap taken as a tie). Used by scripts/gpu-check."""

from __future__ import annotations

import argparse
import sys
import time

import poot
from poot.llm import SamplingParams

# the last prompt is long enough (over 100 tokens) that the step prefilling the four runs a blocked
# attention schedule (the CUDA-core one: the tensor-core one is planned for 64+ new tokens a sequence)
PROMPTS = [
    "The history of the printing press",
    "def fibonacci(n):",
    "Three facts about the ocean:",
    "The river starts high in the mountains, where snow melts each spring and feeds a hundred small streams. "
    "They join in the valleys, pass through forests of pine and birch, turn the wheels of old mills, and slow down "
    "as the land flattens. Towns grew along its banks because the water carried boats, fish and trade. Today the "
    "river is cleaner than it was fifty years ago, and people swim in it again in the summer. Write a short poem "
    "about this river, then explain in two sentences why rivers matter to the towns built beside them.",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--near", type=float, default=1e-3, help="largest log-probability gap counted as a tie (docs/NUMERICS.md)")
    ap.add_argument("--kv-dtype", default="f32", help="the KV cache's element type on both devices (f32 or f16)")
    args = ap.parse_args()
    results = {}
    lookahead_ok = False
    for dev in ("cpu", "cuda:0"):
        params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=5 if dev == "cpu" else None)
        m = poot.load(args.path, dev, max_seqs=len(PROMPTS), max_context=256, progress=False, kv_dtype=args.kv_dtype)
        m.complete(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4), raw=True)  # warm: captures
        t = time.perf_counter()
        results[dev] = m.complete(PROMPTS, params, raw=True)
        print(f"{dev}: {len(PROMPTS)} x 64 greedy tokens in {time.perf_counter() - t:.2f} s")
        if dev != "cpu":  # steps queued before the last is read (the default there) against one at a time: the same tokens
            sampled = [SamplingParams(temperature=0.9, top_p=0.95, seed=11 + i, max_tokens=48, ignore_eos=True) for i in range(len(PROMPTS))]
            queued = [c.tokens for c in results[dev]] + [c.tokens for c in m.complete(PROMPTS, sampled, raw=True)]
            m.engine.lookahead = False
            serial = [c.tokens for c in m.complete(PROMPTS, params, raw=True)] + [c.tokens for c in m.complete(PROMPTS, sampled, raw=True)]
            same = sum(a == b for a, b in zip(queued, serial))
            print(f"{dev}: steps queued ahead vs one at a time: {same}/{len(queued)} sequences equal (greedy and sampled)")
            lookahead_ok = same == len(queued)
        m.close()
    equal = ties = 0
    for p, a, b in zip(PROMPTS, results["cpu"], results["cuda:0"]):
        diff = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
        if diff is None:
            equal += 1
            print(f"{p!r}: equal ({len(a.tokens)} tokens)")
            continue
        top = dict(a.logprobs[diff][1] or [])
        gap = top[a.tokens[diff]] - top[b.tokens[diff]] if b.tokens[diff] in top else float("inf")
        tie = gap <= args.near
        ties += tie
        print(
            f"{p!r}: differs at token {diff}: cpu {a.tokens[diff]}, cuda:0 {b.tokens[diff]}, "
            f"log-probability gap on the cpu {gap:.3g} ({'a near tie' if tie else 'NOT a near tie'}); equal before it"
        )
    print(f"greedy tokens cuda:0 vs cpu ({args.kv_dtype} KV cache): {equal}/{len(PROMPTS)} prompts equal, {ties} first differences at near ties")
    return 0 if equal + ties == len(PROMPTS) and lookahead_ok else 1


if __name__ == "__main__":
    sys.exit(main())
