"""SmolLM2-135M Q4_1 on the CPU device next to llama.cpp, in the same run, at the same thread counts.

Prefill: one prompt of ``--prompt`` tokens (256) into an empty cache. Decode: ``--decode`` greedy
tokens (64) after it. Both sides get the same token ids and pick the argmax themselves: poot through
its generation engine (``poot.load``: bucketed steps, sampling on the device), llama.cpp through
llama-cpp-python's ``eval`` and its logits. Rounds follow a warm-up; medians are reported, with the
ratio poot / llama.cpp (above 1: poot is faster). poot's KV cache holds halves (``--kv-dtype f16``,
its default, as llama.cpp's default cache does); ``--kv-dtype f32`` measures a cache of floats.

llama.cpp comes from llama-cpp-python: the script installs it (a source build of several minutes)
unless it is importable already, or runs it with the interpreter given by ``--peer-python``.

    python bench/cpu_vs_llamacpp.py [--threads 1 2] [--rounds 3] [--kv-dtype f32] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import numpy as np

import poot
from poot.llm.bench import llamacpp_python, measure_engine, measure_llamacpp
from poot.llm.handle import KV_DTYPES
from poot.load import resolve_model


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="SmolLM2")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-dtype", choices=KV_DTYPES, default="f16", help="poot's KV cache type (default f16, as llama.cpp's cache)")
    ap.add_argument("--peer-python", help="an interpreter with llama_cpp importable (default: this one, installing it if needed)")
    ap.add_argument("--record", action="store_true", help="append the results to docs/PERFORMANCE.md")
    args = ap.parse_args()

    path = str(resolve_model(args.model))
    python = llamacpp_python(args.peer_python)
    prompt = np.random.default_rng(0).integers(1000, 40000, args.prompt).tolist()
    rows = []
    for threads in args.threads:
        print(f"bench: {threads} thread(s): poot ...", file=sys.stderr, flush=True)
        m = poot.load(args.model, "cpu", threads=threads, max_seqs=1, max_context=max(1024, args.prompt + args.decode), progress=False, kv_dtype=args.kv_dtype)
        ours = measure_engine(m, [prompt], args.decode, args.rounds)
        m.close()
        print(f"bench: {threads} thread(s): llama.cpp ...", file=sys.stderr, flush=True)
        peer = measure_llamacpp(python, path, threads, prompt, args.decode, args.rounds)
        rows.append((threads, ours.prefill_tok_s, peer["prefill"], ours.decode_tok_s, peer["decode"], peer["version"]))
        print(
            f"threads {threads}: prefill {args.prompt} tokens: poot {ours.prefill_tok_s:.0f} tok/s, llama.cpp {peer['prefill']:.0f} tok/s, "
            f"ratio {ours.prefill_tok_s / peer['prefill']:.2f} | decode: poot {ours.decode_tok_s:.1f} tok/s, llama.cpp {peer['decode']:.1f} tok/s, "
            f"ratio {ours.decode_tok_s / peer['decode']:.2f}"
        )
    if args.record:
        doc = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
        text = doc.read_text()
        machine = f"{cpu_name()}, {os.cpu_count()} vCPU"
        lines = [
            f"| {datetime.date.today()} | {machine} | {t} | {pp:.0f} | {lp:.0f} | {pp / lp:.2f} | {pd:.1f} | {ld:.1f} | {pd / ld:.2f} | "
            f"engine (`poot.load`), KV cache {args.kv_dtype}, prompt {args.prompt}; llama-cpp-python {v} |"
            for t, pp, lp, pd, ld, v in rows
        ]
        marker = "<!-- cpu-vs-llamacpp rows -->"
        if marker not in text:
            raise SystemExit(f"{doc}: no '{marker}' line to add rows after")
        head, tail = text.split(marker, 1)  # the marker follows the table: new rows go at its end
        doc.write_text(head.rstrip("\n") + "\n" + "\n".join(lines) + "\n\n" + marker + tail)
        print(f"bench: recorded in {doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
