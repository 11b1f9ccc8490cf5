"""Throughput and latency of `poot serve` on the CPU device at 1, 8 and 32 concurrent clients.

Starts a real server on loopback, then for each concurrency level runs that many client threads
(the official openai client, streaming chat completions, 32 new tokens, seeded sampling) for
``--requests`` requests each, and reports generated tokens per second over the wall time, and the
50th / 90th / 99th percentiles of time to first token and of whole-request latency.

    python bench/serve_load.py [--clients 1 8 32] [--requests 4] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="SmolLM2")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "poot.cli", "serve", args.model, "--port", str(port), "--max-batch", str(args.max_batch), "--context", "1024"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
            if proc.poll() is not None:
                raise SystemExit("the server did not start")
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=600)
        topics = ["the sea", "mountains", "a city at night", "bread", "trains", "the moon", "music", "rain"]

        def one(i: int) -> tuple[float, float, int]:
            t0 = time.perf_counter()
            first, n = None, 0
            for chunk in client.chat.completions.create(
                model=args.model,
                messages=[{"role": "user", "content": f"Write about {topics[i % len(topics)]}."}],
                max_tokens=args.max_tokens,
                temperature=0.7,
                seed=i,
                stream=True,
                stream_options={"include_usage": True},
            ):
                if chunk.usage is not None:
                    n = chunk.usage.completion_tokens
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - t0
            return first or float("nan"), time.perf_counter() - t0, n

        one(0)  # warm: first captures of each shape
        rows = []
        for c in args.clients:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                res = list(pool.map(one, range(c * args.requests)))
            wall = time.perf_counter() - t0
            ttft, lat, toks = [r[0] for r in res], [r[1] for r in res], sum(r[2] for r in res)
            rows.append((c, toks / wall, pct(ttft, 0.5), pct(ttft, 0.9), pct(ttft, 0.99), pct(lat, 0.5), pct(lat, 0.9), pct(lat, 0.99)))
            print(
                f"{c:3d} clients: {toks / wall:7.1f} tok/s | TTFT p50 {rows[-1][2]:.2f} p90 {rows[-1][3]:.2f} p99 {rows[-1][4]:.2f} s | "
                f"latency p50 {rows[-1][5]:.2f} p90 {rows[-1][6]:.2f} p99 {rows[-1][7]:.2f} s ({len(res)} requests, median {statistics.median(lat):.2f} s)"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.record:
        doc = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
        text = doc.read_text()
        cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), "cpu")
        lines = [
            f"| {datetime.date.today()} | {cpu}, {os.cpu_count()} vCPU | {c} | {tps:.1f} | {a:.2f} / {b:.2f} / {d:.2f} | {e:.2f} / {f:.2f} / {g:.2f} |"
            for c, tps, a, b, d, e, f, g in rows
        ]
        marker = "<!-- serve-load rows -->"
        head, tail = text.split(marker, 1)
        doc.write_text(head.rstrip("\n") + "\n" + "\n".join(lines) + "\n\n" + marker + tail)
        print(f"recorded in {doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
