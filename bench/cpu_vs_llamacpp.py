"""SmolLM2-135M Q4_1 on the CPU device next to llama.cpp, in the same run, at the same thread counts.

Prefill: one prompt of ``--prompt`` tokens (256) into an empty cache. Decode: ``--decode`` tokens (64)
one at a time after that prompt, timed per token. Both sides get the same token ids, compute logits
for the last token only, and sample nothing (the token fed back is fixed), so the numbers are the
model's forward passes. Rounds alternate poot and llama.cpp; medians are reported, with the ratio
poot / llama.cpp (above 1: poot is faster).

llama.cpp comes from llama-cpp-python: the script installs it (``pip install llama-cpp-python``, a
source build of several minutes) unless it is importable already, or runs it with the interpreter
given by ``--peer-python``.

    python bench/cpu_vs_llamacpp.py [--threads 1 2] [--rounds 3] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

PEER = textwrap.dedent(
    """
    import json, statistics, sys, time
    from llama_cpp import Llama
    path, threads, prompt, decode, rounds = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512, n_ubatch=512, verbose=False)
    pre, dec = [], []
    for _ in range(rounds + 1):  # the first round warms up
        llm.reset()
        t = time.perf_counter(); llm.eval(prompt); pre.append(time.perf_counter() - t)
        steps = []
        for i in range(decode):
            t = time.perf_counter(); llm.eval([prompt[i % len(prompt)]]); steps.append(time.perf_counter() - t)
        dec.append(statistics.median(steps))
    print(json.dumps({"prefill_s": pre[1:], "decode_s": dec[1:], "version": __import__("llama_cpp").__version__}))
    """
)


def peer_python(given: str | None) -> str:
    if given:
        return given
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("bench: installing llama-cpp-python (builds llama.cpp from source; several minutes) ...", file=sys.stderr, flush=True)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "llama-cpp-python"])
    return sys.executable


def run_peer(python: str, path: str, threads: int, prompt: list[int], decode: int, rounds: int) -> dict:
    out = subprocess.run([python, "-c", PEER, path, str(threads), json.dumps(prompt), str(decode), str(rounds)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_poot(model: str, threads: int, prompt: list[int], decode: int, rounds: int) -> dict:
    from poot.graph.passes import DEFAULT_PASSES, PassManager
    from poot.load import open_model
    from poot.models import StepShapes, family_for
    from poot.models.decoder import StepBatch
    from poot.plan.lower import plan_graph
    from poot.runtime.executor import step_env
    from poot_cpu.executor import HostExecutor

    ck = open_model(model)
    fam = family_for(ck.architecture)
    bs, blocks = 16, 64  # 1,024 positions, as llama.cpp's n_ctx
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=bs)))
    ex = HostExecutor(plan_graph(g), threads=threads)
    pools = {n: np.zeros((blocks,) + tuple(d.value for d in g.inputs()[n].shape[1:]), np.float32) for n in ex.pool_names()}
    ex.bind({t.name: t.raw() for t in ck.weights.tensors.values()}, pools)

    def inputs(tokens: list[int], start: int) -> dict[str, np.ndarray]:
        n = len(tokens)
        pos = np.arange(start, start + n)
        return StepBatch(np.array(tokens), pos, np.zeros(n), pos, np.array([start + n]), np.arange(blocks).reshape(1, -1), np.array([n - 1])).as_inputs()

    pre_in = inputs(prompt, 0)
    pre_step = ex.capture(step_env(ex.plan, {**pre_in, **pools}))
    dec_step = ex.capture(step_env(ex.plan, {**inputs(prompt[:1], len(prompt)), **pools}))
    pre, dec = [], []
    for _ in range(rounds + 1):
        t = time.perf_counter()
        ex.replay(pre_step, pre_in)
        ex.read(pre_step, "logits")
        pre.append(time.perf_counter() - t)
        steps = []
        for i in range(decode):
            d_in = inputs([prompt[i % len(prompt)]], len(prompt) + i)
            t = time.perf_counter()
            ex.replay(dec_step, d_in)
            ex.read(dec_step, "logits")
            steps.append(time.perf_counter() - t)
        dec.append(statistics.median(steps))
    ex.close()
    return {"prefill_s": pre[1:], "decode_s": dec[1:], "launches": len(dec_step.records), "arena_mib": dec_step.arena_bytes / 2**20,
            "prefill_arena_mib": pre_step.arena_bytes / 2**20}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="SmolLM2")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer-python", help="an interpreter with llama_cpp importable (default: this one, installing it if needed)")
    ap.add_argument("--record", action="store_true", help="append the results to docs/PERFORMANCE.md")
    args = ap.parse_args()

    from poot.load import resolve_model

    path = str(resolve_model(args.model))
    python = peer_python(args.peer_python)
    rng = np.random.default_rng(0)
    prompt = rng.integers(1000, 40000, args.prompt).tolist()
    rows = []
    for threads in args.threads:
        print(f"bench: {threads} thread(s): poot ...", file=sys.stderr, flush=True)
        ours = run_poot(args.model, threads, prompt, args.decode, args.rounds)
        print(f"bench: {threads} thread(s): llama.cpp ...", file=sys.stderr, flush=True)
        peer = run_peer(python, path, threads, prompt, args.decode, args.rounds)
        p_pre, p_dec = args.prompt / statistics.median(ours["prefill_s"]), 1 / statistics.median(ours["decode_s"])
        l_pre, l_dec = args.prompt / statistics.median(peer["prefill_s"]), 1 / statistics.median(peer["decode_s"])
        rows.append((threads, p_pre, l_pre, p_dec, l_dec, peer["version"], ours))
        print(f"threads {threads}: prefill {args.prompt} tokens: poot {p_pre:.0f} tok/s, llama.cpp {l_pre:.0f} tok/s, ratio {p_pre / l_pre:.2f} | "
              f"decode: poot {p_dec:.1f} tok/s, llama.cpp {l_dec:.1f} tok/s, ratio {p_dec / l_dec:.2f} "
              f"({ours['launches']} launches/step, arena {ours['arena_mib']:.2f} MiB decode / {ours['prefill_arena_mib']:.2f} MiB prefill)")
    if args.record:
        doc = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
        text = doc.read_text()
        machine = f"{cpu_name()}, {os.cpu_count()} vCPU"
        lines = [f"| {datetime.date.today()} | {machine} | {t} | {pp:.0f} | {lp:.0f} | {pp / lp:.2f} | {pd:.1f} | {ld:.1f} | {pd / ld:.2f} | llama-cpp-python {v} |"
                 for t, pp, lp, pd, ld, v, _ in rows]
        marker = "<!-- cpu-vs-llamacpp rows -->"
        if marker not in text:
            raise SystemExit(f"{doc}: no '{marker}' line to add rows after")
        head, tail = text.split(marker, 1)  # the marker follows the table: new rows go at its end
        doc.write_text(head.rstrip("\n") + "\n" + "\n".join(lines) + "\n\n" + marker + tail)
        print(f"bench: recorded in {doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
