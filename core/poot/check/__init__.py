"""``poot check``: does poot work on this device, and how fast.

Four parts, each a list of cases run in turn, every failure caught and named:

- ``kernels``: one-op graphs (every packed type's matrix product at 1 to 64 rows, lookups, norms,
  activations, softmax) planned for the device and run against the CPU oracle;
- ``models``: one tiny synthetic model per installed family (needs transformers to write it), two
  sequences through a paged pool, against the oracle;
- ``checkpoint``: an installed real checkpoint's greedy tokens equal to the CPU device's (on the CPU
  itself: each one the oracle's choice);
- ``bench``: prefill and decode tokens/s at batch 1 and 4.

One table at the end; the exit status is 1 when any case failed. ``--out DIR`` also writes
``DIR/check.json`` (what a pod run brings home).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PootError

__all__ = ["CaseResult", "PARTS", "run_check"]

PARTS = ("kernels", "models", "checkpoint", "bench")


@dataclass
class CaseResult:
    part: str
    case: str
    status: str  # "pass", "fail" or "skip"
    detail: str
    seconds: float
    figures: dict[str, float] = field(default_factory=dict)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run(part: str, case: str, fn: Callable[[], Any], results: list[CaseResult]) -> Any:
    """Run one case: its result line, or its failure (the exception's message; the traceback for
    anything but a failed comparison) recorded under its name."""
    t = time.perf_counter()
    _say(f"poot check: {part}: {case} ...")
    figures: dict[str, float] = {}
    try:
        out = fn()
        if isinstance(out, tuple):
            out, figures = out
        status, detail = "pass", str(out)
    except AssertionError as e:
        status, detail = "fail", str(e) or "a comparison failed"
    except Exception as e:  # noqa: BLE001 - a case that crashes is a failed case, named
        status, detail = "fail", f"{type(e).__name__}: {e}"
        if not isinstance(e, PootError):
            detail += "\n" + "".join(traceback.format_exception(e)[-3:]).rstrip()
    r = CaseResult(part, case, status, detail, time.perf_counter() - t, figures)
    results.append(r)
    _say(f"poot check: {part}: {case}: {status.upper()} ({r.seconds:.1f} s) {detail.splitlines()[0] if detail else ''}")
    return r


def _table(results: Sequence[CaseResult]) -> str:
    rows = [("PART", "CASE", "RESULT", "SECONDS", "DETAIL")]
    for r in results:
        rows.append((r.part, r.case, r.status.upper(), f"{r.seconds:.1f}", r.detail.splitlines()[0] if r.detail else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


def _checkpoint_parts(parts: Sequence[str], model: str | None, device: str, quick: bool, results: list[CaseResult]) -> None:
    """The real checkpoint loaded once on ``device``: its greedy tokens (``checkpoint``) and its speed
    (``bench``). No checkpoint installed: both skipped, saying what to install; a named one missing:
    failed."""
    import poot

    from .models import greedy_tokens_check, real_checkpoint, short_bench

    try:
        name, path = real_checkpoint(model)
    except PootError as e:
        for p in ("checkpoint", "bench"):
            if p in parts:
                results.append(CaseResult(p, model or "catalog model", "skip" if model is None else "fail", str(e), 0.0))
        return
    handle = None

    def load() -> str:
        nonlocal handle
        handle = poot.load(str(path), device, max_seqs=4, max_context=512, progress=False, kv_dtype="f32")
        return f"{path.name} loaded in {handle.load_seconds:.1f} s"

    _run("checkpoint" if "checkpoint" in parts else "bench", f"{name} load", load, results)
    if handle is None:
        return  # (the load's failure is recorded)
    try:
        if "checkpoint" in parts:
            _run("checkpoint", f"{name} greedy tokens", lambda: greedy_tokens_check(path, device, 12 if quick else 24, handle), results)
        if "bench" in parts:
            _run("bench", f"{name} tokens/s", lambda: short_bench(handle, (1,) if quick else (1, 4)), results)
    finally:
        handle.close()


def run_check(
    device: str | None = None, model: str | None = None, parts: Sequence[str] | None = None, out: str | Path | None = None, quick: bool = False
) -> int:
    """Run the check's ``parts`` (default: all) on ``device``; print one table; return the exit
    status (0: every case passed or was skipped with its reason; 1: a case failed)."""
    from ..plugins import host
    from ..runtime import get_device
    from .kernels import kernel_cases, run_kernel_case
    from .models import family_cases, run_family_case

    parts = list(parts or PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise PootError(f"no check part {', '.join(unknown)}: the parts are {', '.join(PARTS)}")
    dev = get_device(device)
    factory = host().hook.poot_executor(device=dev)
    if factory is None:
        raise PootError(f"no installed plugin can run plans on {dev.name}: poot check needs a device that runs them (see `poot devices`)")
    seed = int(os.environ.get("POOT_TEST_SEED", np.random.SeedSequence().entropy % 2**32))  # type: ignore[operator]
    rng = np.random.default_rng(seed)
    _say(f"poot check on {dev.name} ({dev.description}); random seed {seed} (POOT_TEST_SEED={seed} replays it)")
    results: list[CaseResult] = []
    started = time.perf_counter()

    if "kernels" in parts:
        for case in kernel_cases(quick):
            _run("kernels", case.name, lambda case=case: run_kernel_case(case, dev, factory, rng), results)

    if "models" in parts:
        cases = family_cases()
        if not cases:
            results.append(CaseResult("models", "families", "skip", "no installed model family has a synthetic case", 0.0))
        try:
            import transformers  # noqa: F401 - writes the synthetic checkpoints
        except ImportError:
            cases, why = [], "transformers (with torch) writes the synthetic models and is not installed: pip install 'poot[test]'"
            results.append(CaseResult("models", "families", "skip", why, 0.0))
        with tempfile.TemporaryDirectory(prefix="poot-check-") as tmp:
            for fam, case in cases[:1] if quick else cases:
                _run("models", f"{fam} family", lambda case=case: run_family_case(case, dev, factory, rng, Path(tmp)), results)

    if "checkpoint" in parts or "bench" in parts:
        _checkpoint_parts(parts, model, dev.name, quick, results)

    failed = [r for r in results if r.status == "fail"]
    print(_table(results))
    elapsed = time.perf_counter() - started
    verdict = f"{len(failed)} of {len(results)} cases failed" if failed else f"all {sum(r.status == 'pass' for r in results)} cases passed"
    skipped = sum(r.status == "skip" for r in results)
    print(f"\npoot check on {dev.name}: {verdict}" + (f", {skipped} skipped" if skipped else "") + f" in {elapsed:.0f} s")
    for r in failed:
        print(f"FAILED {r.part}: {r.case}: {r.detail}")
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "device": dev.name,
            "description": dev.description,
            "host": platform.node(),
            "python": platform.python_version(),
            "seed": seed,
            "passed": not failed,
            "seconds": elapsed,
            "results": [asdict(r) for r in results],
        }
        (folder / "check.json").write_text(json.dumps(doc, indent=2))
        print(f"results: {folder / 'check.json'}")
    return 1 if failed else 0
