"""Throughput measurements: poot's engine (the path generation takes: bucketed steps, sampling on
the device) and, as the peer, llama.cpp through llama-cpp-python in a subprocess, fed the same token
ids. Medians over rounds after a warm-up round."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import PootError
from .params import SamplingParams

__all__ = ["Throughput", "measure_engine", "measure_llamacpp", "llamacpp_python"]


@dataclass(frozen=True)
class Throughput:
    batch: int
    prefill_tok_s: float  # prompt tokens per second, all sequences together
    decode_tok_s: float  # new tokens per second after the first, all sequences together


def measure_engine(handle, prompts: Sequence[Sequence[int]], decode: int, rounds: int = 3) -> Throughput:  # type: ignore[no-untyped-def]
    """Prefill every prompt, then ``decode`` greedy tokens each, ignoring end tokens. As
    llama-batched-bench splits its figures: prefill is every prompt token over the time until every
    sequence has its first token; decode is the tokens that come after that over the time they take
    (prompts that span several steps would otherwise count their later prefill steps as decode)."""
    eng = handle.engine
    params = SamplingParams(temperature=0, max_tokens=decode, ignore_eos=True)
    pre, dec = [], []
    for _ in range(rounds + 1):
        sids = [eng.add(p, params) for p in prompts]
        t0 = time.perf_counter()
        started: set[int] = set()
        prefilled: float | None = None
        done = after = 0
        while done < len(sids):
            evs = eng.step()
            if prefilled is None:
                started.update(ev.seq_id for ev in evs if ev.token is not None)
                if len(started) == len(sids):
                    prefilled = time.perf_counter() - t0
            else:
                after += sum(ev.token is not None for ev in evs)
            done += sum(ev.finished is not None for ev in evs)
        total = time.perf_counter() - t0
        pre.append(sum(map(len, prompts)) / (prefilled or 1e-9))
        dec.append(after / max(total - (prefilled or 0.0), 1e-9))
    return Throughput(len(prompts), statistics.median(pre[1:]), statistics.median(dec[1:]))


_PEER = textwrap.dedent(
    """
    import json, statistics, sys, time
    import numpy as np
    from llama_cpp import Llama
    path, threads, prompt, decode, rounds = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    gpu_layers = int(sys.argv[6])
    if gpu_layers and not __import__("llama_cpp").llama_supports_gpu_offload():
        sys.exit("this llama-cpp-python was built without a GPU backend: reinstall it with CMAKE_ARGS=-DGGML_HIP=ON (or -DGGML_CUDA=ON)")
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512, n_ubatch=512, n_gpu_layers=gpu_layers, verbose=False)
    # the last evaluated token's logits, from the context (llama-cpp-python keeps its ``scores`` only with logits_all)
    last = lambda: int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).argmax())
    pre, dec = [], []
    for _ in range(rounds + 1):
        llm.reset()
        t = time.perf_counter(); llm.eval(prompt); p = time.perf_counter() - t
        tok = last()
        t = time.perf_counter()
        for i in range(decode - 1):
            llm.eval([tok])
            tok = last()
        d = time.perf_counter() - t
        pre.append(len(prompt) / p); dec.append((decode - 1) / d)
    print(json.dumps({"prefill": statistics.median(pre[1:]), "decode": statistics.median(dec[1:]), "version": __import__("llama_cpp").__version__}))
    """
)


LLAMACPP_BUILDS = {"cpu": "", "hip": "-DGGML_HIP=ON", "cuda": "-DGGML_CUDA=ON"}  # llama.cpp's CMake switch for each backend


def llamacpp_python(given: str | None = None, install: bool = True, build: str = "cpu") -> str:
    """An interpreter that can import llama_cpp: ``given``, or this one (installing llama-cpp-python,
    a source build of several minutes, when ``install``; ``build`` picks llama.cpp's backend: cpu,
    hip or cuda, which needs that toolkit on the machine)."""
    if given:
        return given
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        if not install:
            raise PootError("llama-cpp-python is not installed: pip install llama-cpp-python (or pass the interpreter that has it)") from None
        print("poot: installing llama-cpp-python (builds llama.cpp from source; several minutes) ...", file=sys.stderr, flush=True)
        env = dict(os.environ, CMAKE_ARGS=(os.environ.get("CMAKE_ARGS", "") + " " + LLAMACPP_BUILDS[build]).strip())
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "llama-cpp-python"], env=env)
    return sys.executable


def measure_llamacpp(python: str, model_path: str, threads: int, prompt: Sequence[int], decode: int, rounds: int = 3, gpu_layers: int = 0) -> dict:
    """llama.cpp on one sequence: prefill of ``prompt``, then ``decode`` greedy tokens (its own argmax
    over the logits it returns, as poot's engine samples greedily on its device); ``gpu_layers``
    layers offloaded to its GPU backend (-1: all), refused by a build without one."""
    cmd = [python, "-c", _PEER, model_path, str(threads), json.dumps(list(prompt)), str(decode), str(rounds), str(gpu_layers)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise PootError(f"llama.cpp run failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
