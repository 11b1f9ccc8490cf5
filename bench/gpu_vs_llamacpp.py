"""A GGUF model on a GPU device next to llama.cpp's build for the same GPU, in the same run.

poot runs the model on ``--device`` (``rocm:0``, ``cuda:0``) through its generation engine; llama.cpp
runs every layer on the GPU (``n_gpu_layers=-1``) through llama-cpp-python, built for ``--build``
(``hip`` for AMD, ``cuda`` for NVIDIA: installed from source when it is not importable; a build
without a GPU backend is refused rather than measured on the CPU). Both sides take the same token
ids and pick their argmax themselves: one prompt of ``--prompt`` tokens into an empty cache, then
``--decode`` greedy tokens. Medians over ``--rounds`` after a warm-up; the ratio is poot / llama.cpp
(above 1: poot is faster).

    python bench/gpu_vs_llamacpp.py --device rocm:0 --build hip [--model SmolLM2 gemma3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import poot
from poot.llm.bench import llamacpp_python, measure_engine, measure_llamacpp
from poot.load import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", required=True, help="poot's device: rocm:0, cuda:0, ...")
    ap.add_argument("--build", choices=["hip", "cuda"], required=True, help="llama.cpp's GPU backend")
    ap.add_argument("--model", nargs="+", default=["SmolLM2", "gemma3"])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer-python", help="an interpreter with a GPU build of llama_cpp importable")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    python = llamacpp_python(args.peer_python, build=args.build)
    prompt = np.random.default_rng(0).integers(1000, 40000, args.prompt).tolist()
    rows = []
    for model in args.model:
        path = str(resolve_model(model))
        print(f"bench: {model} on {args.device}: poot ...", file=sys.stderr, flush=True)
        m = poot.load(model, args.device, max_seqs=1, max_context=max(1024, args.prompt + args.decode), progress=False)
        ours = measure_engine(m, [prompt], args.decode, args.rounds)
        m.close()
        print(f"bench: {model}: llama.cpp ({args.build}) ...", file=sys.stderr, flush=True)
        peer = measure_llamacpp(python, path, 1, prompt, args.decode, args.rounds, gpu_layers=-1)
        rows.append({"model": model, "device": args.device, "poot": [ours.prefill_tok_s, ours.decode_tok_s], "llama.cpp": [peer["prefill"], peer["decode"]]})
        print(
            f"| {model} | {args.device} | prefill {args.prompt}: {ours.prefill_tok_s:.0f} vs {peer['prefill']:.0f} tok/s ({ours.prefill_tok_s / peer['prefill']:.2f}x) "
            f"| decode: {ours.decode_tok_s:.1f} vs {peer['decode']:.1f} tok/s ({ours.decode_tok_s / peer['decode']:.2f}x) | llama-cpp-python {peer['version']} ({args.build}) |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
