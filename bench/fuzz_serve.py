"""Fuzz `poot serve`: ten thousand generated requests against a real server on loopback.

Requests come from ``poot.testing.request_fuzz`` (valid, near-valid and garbage, two to three to
three, sent eight at a time); every answer must keep to ``check_answer`` (no 5xx, no hang, errors in
OpenAI's shape). Afterwards the server must answer a greedy request exactly as it did when fresh,
hold no KV block, queue nothing and report itself ok. Prints the counts by kind and by status, and
every failure; exits 1 if anything failed.

    python bench/fuzz_serve.py [--requests 10000] [--model SmolLM2]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from hypothesis import HealthCheck, given, settings
from tqdm import tqdm

from poot.testing.request_fuzz import FuzzRequest, batches, check_answer
from poot.testing.server import start_server, stop_server, wait_idle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--model", default="SmolLM2")
    args = ap.parse_args()
    proc, base = start_server(args.model, "--max-batch", "16", "--max-queue", "256")
    greedy_body = {"model": args.model, "messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 24}

    def greedy() -> str:
        return httpx.post(f"{base}/v1/chat/completions", json=greedy_body, timeout=120).json()["choices"][0]["message"]["content"]

    def send(req: FuzzRequest) -> tuple[int, bytes]:
        try:
            r = httpx.post(f"{base}{req.path}", content=req.body, headers={"Content-Type": "application/json"}, timeout=60)
        except httpx.TimeoutException:
            return 599, b"no answer in 60 s"
        return r.status_code, r.content

    try:
        fresh = greedy()
        kinds: collections.Counter[str] = collections.Counter()
        statuses: collections.Counter[int] = collections.Counter()
        failures: list[str] = []
        bar = tqdm(total=args.requests, desc="poot: fuzzing the server", unit="request", file=sys.stderr)
        t0 = time.perf_counter()

        @settings(max_examples=-(-args.requests // 8), deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(batch=batches(args.model))
        def eight_at_a_time(batch: list[FuzzRequest]) -> None:
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(send, batch))
            for req, (status, body) in zip(batch, answers):
                kinds[req.kind] += 1
                statuses[status] += 1
                problem = check_answer(req, status, body)
                if problem is not None:
                    failures.append(problem)
            bar.update(len(batch))

        eight_at_a_time()
        bar.close()
        wall = time.perf_counter() - t0
        wait_idle(base)
        after = greedy()
        health = httpx.get(f"{base}/health", timeout=30).json()["status"]
        idle = wait_idle(base)
    finally:
        stop_server(proc)
    total = sum(kinds.values())
    print(f"{total} requests in {wall:.0f} s ({total / wall:.0f} a second); {datetime.date.today()} {platform.machine()} {platform.python_version()}")
    print("  by kind:   " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    print("  by status: " + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items())))
    print(
        f"  afterwards: greedy answer {'the same' if after == fresh else 'DIFFERENT'}, health {health}, KV blocks {idle['poot_kv_blocks_used']:.0f}, queue {idle['poot_queue_depth']:.0f}"
    )
    if after != fresh:
        failures.append(f"the greedy answer changed: {fresh!r} -> {after!r}")
    if health != "ok":
        failures.append(f"health is {health!r}")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"failures: {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
