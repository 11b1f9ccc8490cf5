"""Greedy generation on cuda:0 against the CPU device, same model, same prompts: the tokens must be
equal (a difference is reported with its position). Used by scripts/gpu-check."""

from __future__ import annotations

import sys
import time

import poot
from poot.llm import SamplingParams

PROMPTS = ["The history of the printing press", "def fibonacci(n):", "Three facts about the ocean:"]


def main() -> int:
    path = sys.argv[1]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    results = {}
    for dev in ("cpu", "cuda:0"):
        m = poot.load(path, dev, max_seqs=3, max_context=256, progress=False)
        m.complete(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4), raw=True)  # warm: captures
        t = time.perf_counter()
        results[dev] = m.complete(PROMPTS, params, raw=True)
        print(f"{dev}: 3 x 64 greedy tokens in {time.perf_counter() - t:.2f} s")
        m.close()
    bad = 0
    for p, a, b in zip(PROMPTS, results["cpu"], results["cuda:0"]):
        diff = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
        print(f"{p!r}: {'equal' if diff is None else f'differs at token {diff}'} ({len(a.tokens)} tokens)")
        bad += diff is not None
    print(f"greedy tokens cuda:0 vs cpu: {3 - bad}/3 prompts equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
