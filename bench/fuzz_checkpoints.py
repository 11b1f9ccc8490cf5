"""Fuzz checkpoint loading: ten thousand mutated real headers, each loaded as far as its weights.

Seeds are SmolLM2's and Gemma 3's GGUF headers (their real tensor tables, tokenizer arrays cut short)
and small safetensors files; each case applies one to four mutations drawn from a seeded generator
(``poot.testing.fuzz.random_ops``) and must keep to ``check_checkpoint``'s property: only poot's typed
errors, at most ``--time-limit`` seconds, Python allocations below the file's size plus 64 MiB.
Prints how many cases loaded, how many were refused (by error type), and every failure with the
mutations that reproduce it; exits 1 if any case failed.

    python bench/fuzz_checkpoints.py [--cases 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from poot.load import open_model
from poot.testing.fuzz import CaseFailed, check_checkpoint, gguf_seed, mutate, random_ops, safetensors_seed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed: the same seed draws the same cases")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds a case may take")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        print("poot: copying the seed headers (gguf reads the vocabularies: a few seconds each)", file=sys.stderr)
        gguf = [gguf_seed(open_model(m).path, d, m) for m in ("SmolLM2", "gemma3")]
        outcomes: collections.Counter[str] = collections.Counter()
        failures: list[str] = []
        slowest = 0.0
        t0 = time.perf_counter()
        for i in tqdm(range(args.cases), desc="poot: fuzzing checkpoints", unit="case", file=sys.stderr):
            ops = random_ops(rng)
            if i % 4 == 3:  # a quarter safetensors, the rest GGUF
                s = safetensors_seed(rng.randrange(2**32))
                (n,) = struct.unpack_from("<Q", s.header)
                data = mutate(s.header, ops, 8 + n)  # mutations within the JSON header
            else:
                s = gguf[i % 2]
                data = mutate(s.header, ops, len(s.header))
            try:
                out = check_checkpoint(s.write(data, d), time_limit=args.time_limit)
            except CaseFailed as e:
                failures.append(f"case {i} ({s.name}, ops {ops}): {e}")
                outcomes["FAILED"] += 1
                continue
            slowest = max(slowest, out.seconds)
            outcomes["loaded" if out.refused is None else out.refused.split(":", 1)[0]] += 1
        wall = time.perf_counter() - t0
    print(f"{args.cases} cases in {wall:.0f} s ({args.cases / wall:.0f} a second), slowest {slowest:.2f} s; seed {args.seed}")
    print(f"{datetime.date.today()} {platform.machine()} {platform.python_version()}")
    for what, n in outcomes.most_common():
        print(f"  {what:>16}: {n}")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"failures: {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
