"""The model parts of ``poot check``: one tiny synthetic model per installed family against the
oracle, a real checkpoint's greedy tokens against an independent run, and a short benchmark."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LoadError

__all__ = ["PROMPTS", "family_cases", "greedy_tokens_check", "real_checkpoint", "run_family_case", "short_bench"]

PROMPTS = [
    "The history of the printing press",
    "def fibonacci(n):",
    "Three facts about the ocean:",
    "The river starts high in the mountains, where snow melts each spring and feeds a hundred small streams. "
    "They join in the valleys, pass through forests of pine and birch, and slow down as the land flattens. "
    "Write a short poem about this river.",
]
# the largest log-probability (or logit) gap between two tokens taken as a tie: where a device and its
# reference pick differently there, summation order decided it (docs/NUMERICS.md)
NEAR_TIE = 1e-3
# a synthetic model's logits on the device against the oracle's (f32 both sides; tensor cores at
# matmul precision 'high' keep ~16 bits of each activation)
FAMILY_BOUND = 1e-3


def family_cases() -> list[tuple[str, str]]:
    """(family, synthetic case) for each installed family that has a synthetic case."""
    from ..models.family import model_families
    from ..testing.families import synthetic_cases

    out = []
    for _, fam in model_families():
        cases = synthetic_cases(fam.hf_architectures)
        if cases and fam.name not in {f for f, _ in out}:
            out.append((fam.name, cases[0]))
    return out


def run_family_case(case: str, device: Any, executor_factory: Callable[..., Any], rng: np.random.Generator, directory: Path) -> str:
    """Synthetic checkpoint ``case`` (transformers' own model class writes it) planned for ``device``:
    two sequences through a shuffled paged pool, prefill then greedy decode, against the oracle."""
    from ..plan import compile_plan
    from ..testing.paged import synthetic_graph, two_sequences_against_oracle

    g, w = synthetic_graph(case, directory / case, int(rng.integers(0, 2**31)))
    ex = executor_factory(compile_plan(g, device))
    try:
        worst = two_sequences_against_oracle(ex, g, w, rng, tie=NEAR_TIE)
    finally:
        ex.close()
    if worst > FAMILY_BOUND:
        raise AssertionError(f"logits {worst:.2g} from the oracle's, over {FAMILY_BOUND:g}")
    return f"{case}: prefill and 2 decode steps of 2 sequences, logits within {worst:.1g} of the oracle"


def real_checkpoint(model: str | None) -> tuple[str, Path]:
    """The checkpoint to check: ``model``, or the first catalog model installed."""
    from ..load import resolve_model
    from ..load.sources import CATALOG

    if model is not None:
        return model, resolve_model(model)
    for entry in CATALOG:
        try:
            return entry.aliases[0], resolve_model(entry.aliases[0])
        except LoadError:
            continue
    raise LoadError("catalog", "no catalog model is installed: " + CATALOG[0].install + " (or give --model FILE)")


def _greedy(handle: Any, logprobs: bool, tokens: int) -> list[Any]:
    from ..llm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=5 if logprobs else None)
    return handle.complete(PROMPTS, params, raw=True)


def greedy_tokens_check(path: Path, device: str, tokens: int = 24, handle: Any = None) -> str:
    """Greedy tokens of the checkpoint at ``path`` on ``device``, for ``PROMPTS`` in one batch, against
    the CPU device's (against the oracle's choices when ``device`` is the CPU). Equal, or the first
    difference a near tie in the reference's own numbers."""
    import poot

    own = handle or poot.load(str(path), device, max_seqs=len(PROMPTS), max_context=512, progress=False, kv_dtype="f32")
    try:
        got = _greedy(own, False, tokens)
        queued = ""
        if own.engine.lookahead is not False and own._executor(False).asynchronous:
            # steps queued before the one before is read (the tokens taken on the device) against
            # one step at a time: the same tokens
            own.engine.lookahead = False
            try:
                serial = _greedy(own, False, tokens)
            finally:
                own.engine.lookahead = None
            same = sum(a.tokens == b.tokens for a, b in zip(got, serial))
            if same != len(got):
                raise AssertionError(f"steps queued ahead give other tokens than steps run one at a time in {len(got) - same} of {len(got)} prompts")
            queued = "; steps queued ahead give the tokens of steps run one at a time"
        if own.device.name == "cpu":
            return _against_oracle(path, own, got) + queued
        ref = poot.load(str(path), "cpu", max_seqs=len(PROMPTS), max_context=512, progress=False, kv_dtype="f32")
        try:
            want = _greedy(ref, True, tokens)
        finally:
            ref.close()
    finally:
        if handle is None:
            own.close()
    equal = ties = 0
    notes = []
    for i, (a, b) in enumerate(zip(want, got)):
        diff = next((j for j, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
        if diff is None:
            equal += 1
            continue
        top = dict(a.logprobs[diff][1] or [])
        gap = top[a.tokens[diff]] - top[b.tokens[diff]] if b.tokens[diff] in top else float("inf")
        if gap > NEAR_TIE:
            raise AssertionError(
                f"prompt {i} differs from the CPU device's at token {diff} ({b.tokens[diff]} for {a.tokens[diff]}), not a near tie (gap {gap:.3g})"
            )
        ties += 1
        notes.append(f"prompt {i} at token {diff}: a near tie ({gap:.1g})")
    return f"{equal}/{len(PROMPTS)} prompts x {tokens} tokens equal to the CPU device's" + (f"; {', '.join(notes)}" if notes else "") + queued


def _against_oracle(path: Path, handle: Any, got: list[Any]) -> str:
    """The CPU device's greedy tokens against the oracle's choice at every generated position (the
    prompt and the generated tokens through the oracle in one prefill, every position's logits)."""
    from ..eval.model import PagedOracle, oracle_weights
    from ..load import open_checkpoint
    from ..models import StepShapes, family_for
    from ..testing.paged import PagedSequences

    ck = open_checkpoint(str(path))
    fam = family_for(ck.architecture)
    seqs = [handle.encode(p, raw=True) + list(c.tokens) for p, c in zip(PROMPTS, got)]
    blocks = sum(-(-len(s) // 16) for s in seqs) + 4
    oracle = PagedOracle(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=16)), oracle_weights(ck.weights), num_blocks=blocks)
    pages = PagedSequences(blocks, 16, np.random.default_rng(0))
    for _ in seqs:
        pages.add()
    batch = pages.step(seqs, all_logits=True)
    logits = oracle.step(batch)
    ties = 0
    for i, (s, c) in enumerate(zip(seqs, got)):
        mine = logits[batch.seq_ids == i]
        start = len(s) - len(c.tokens)
        for j, t in enumerate(c.tokens):
            row = mine[start - 1 + j]
            best = int(row.argmax())
            if best != t:
                gap = float(row[best] - row[t])
                if gap > NEAR_TIE:
                    raise AssertionError(f"prompt {i}: token {j} is {t}, the oracle's choice {best} (logit gap {gap:.3g}, not a near tie)")
                ties += 1  # (later positions follow the device's own token: the oracle sees the same prefix)
    total = sum(len(c.tokens) for c in got)
    return f"{len(got)} prompts, {total} greedy tokens, each the oracle's choice" + (f" ({ties} near ties)" if ties else "")


def short_bench(handle: Any, batches: tuple[int, ...] = (1, 4), prompt: int = 64, decode: int = 16) -> tuple[str, dict[str, float]]:
    """Prefill and decode tokens/s through the engine at a few batch sizes (one round after a warm-up)."""
    from ..llm.bench import measure_engine

    rng = np.random.default_rng(0)
    hi = max(2, min(handle.vocab, 30000))
    prompts = [rng.integers(min(100, hi - 1), hi, prompt).tolist() for _ in range(max(batches))]
    figures: dict[str, float] = {}
    parts = []
    t = time.perf_counter()
    for b in batches:
        r = measure_engine(handle, prompts[:b], decode, rounds=1)
        figures[f"prefill_b{b}"], figures[f"decode_b{b}"] = r.prefill_tok_s, r.decode_tok_s
        parts.append(f"batch {b}: prefill {r.prefill_tok_s:.0f}, decode {r.decode_tok_s:.1f} tok/s")
    figures["seconds"] = time.perf_counter() - t
    return "; ".join(parts), figures
