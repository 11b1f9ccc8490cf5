"""Profile one step of a loaded model: the step the engine would run (its shapes, its padding), every
launch timed on the device, with the bytes it moves and the FLOPs it does set against the device's
peak, and the whole step's wall time beside the launches' sum."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ParameterError, PootError
from ..plan.memory import plan_storage
from ..runtime.executor import Peak
from .costs import launch_costs

__all__ = ["FamilySummary", "LaunchProfile", "StepProfile", "profile_step"]


@dataclass(frozen=True)
class LaunchProfile:
    """One launch of the step: its place in the plan, kernel, family (the op it computes), grid,
    seconds, and the bytes and FLOPs it accounts for."""

    index: int
    kernel: str
    family: str
    grid: tuple[int, ...]
    seconds: float
    bytes: int
    flops: int

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class FamilySummary:
    family: str
    launches: int
    seconds: float
    bytes: int
    flops: int


@dataclass
class StepProfile:
    """A profiled step: what it was (model, device, sequences, tokens each, context before it), its
    launches, the median wall time of a whole step (inputs written, run, tokens read back) and the
    device's peak where known."""

    model: str
    device: str
    batch: int
    tokens: int  # tokens each sequence brings to the step (1: decode)
    context: int  # positions each sequence holds after the step
    padded_tokens: int  # the step's tokens after bucketing
    launches: list[LaunchProfile]
    wall_seconds: float
    peak: Peak | None
    walls: list[float] = field(default_factory=list)

    @property
    def launch_seconds(self) -> float:
        return sum(l.seconds for l in self.launches)

    def families(self) -> list[FamilySummary]:
        """Launches grouped by family, the most time first."""
        groups: dict[str, list[LaunchProfile]] = {}
        for l in self.launches:
            groups.setdefault(l.family, []).append(l)
        out = [FamilySummary(f, len(ls), sum(l.seconds for l in ls), sum(l.bytes for l in ls), sum(l.flops for l in ls)) for f, ls in groups.items()]
        return sorted(out, key=lambda s: -s.seconds)


def _family(launch) -> str:  # type: ignore[no-untyped-def]
    return launch.label or launch.node.op


def profile_step(handle, tokens: int = 1, batch: int = 1, prompt: int = 128, repeat: int = 5, seed: int = 0) -> StepProfile:  # type: ignore[no-untyped-def]
    """Profile a step of ``handle`` (a ``poot.load`` model): with ``tokens`` 1, the decode step of
    ``batch`` sequences whose ``prompt``-token prompts are in their caches; with more, the prefill
    of ``batch`` prompts of ``tokens`` tokens each. Prompts are random token ids."""
    if tokens < 1:
        raise ParameterError("tokens", f"{tokens}: a step brings at least one token per sequence")
    if batch < 1:
        raise ParameterError("batch", f"{batch}: a step holds at least one sequence")
    if batch > handle.engine.max_seqs:
        raise ParameterError("batch", f"{batch} sequences, but the model was loaded for {handle.engine.max_seqs} at once")
    if tokens > 1 and batch * tokens > handle.engine.max_step_tokens:
        raise ParameterError("tokens", f"{batch}x{tokens} prompt tokens do not fit one step of {handle.engine.max_step_tokens}")
    from ..llm.params import SamplingParams

    eng = handle.engine
    if eng.has_work():
        raise PootError("the model is generating: profile a model handle of its own")
    eng.lookahead = False  # one step at a time: the step after prefill is the plain decode step
    rng = np.random.default_rng(seed)
    length = prompt if tokens == 1 else tokens
    if length + 1 > handle.max_context:
        raise ParameterError("prompt", f"{length} tokens and one more do not fit the context of {handle.max_context}")
    hi = max(2, min(handle.vocab, 30000))
    ids = [eng.add(rng.integers(min(100, hi - 1), hi, length).tolist(), SamplingParams(max_tokens=4, ignore_eos=True)) for _ in range(batch)]
    try:
        if tokens == 1:  # prefill the prompts (each gets its first token), so the next step decodes
            for _ in range(length + 2):
                if not eng.waiting and all(s.computed >= length and not s.awaiting for s in eng.running):
                    break
                eng.step()
        si = eng.next_step()
        ex = si.executor
        step = ex.capture(si.env)
        h = ex.launch(step, si.inputs, si.keep)  # warm-up
        ex.finish(h)
        # the whole step and its launches one by one, taken in turns: a machine's clock and caches
        # drift over seconds, and both medians should see the same drift
        walls, runs = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            h = ex.launch(step, si.inputs, si.keep)
            ex.finish(h)
            walls.append(time.perf_counter() - t)
            runs.append(ex.profile(step, si.inputs, 1))
        names = [name for name, _ in runs[0]]
        times = list(zip(names, np.median(np.array([[sec for _, sec in r] for r in runs]), axis=0).tolist()))
        storage = plan_storage(ex.plan, si.env)
        if len(times) != len(storage.launches):
            raise PootError(f"{handle.device.name}: the executor timed {len(times)} launches where the step has {len(storage.launches)}")
        costs = launch_costs(ex.plan, storage, handle.weights, si.inputs["positions"])
        launches = [
            LaunchProfile(i, name, _family(l), tuple(int(g) for g in l.grid(si.env)), sec, c.bytes, c.flops)
            for i, ((name, sec), l, c) in enumerate(zip(times, storage.launches, costs))
        ]
        peak = ex.peak()
    finally:
        for i in ids:
            eng.cancel(i)
        while eng.has_work():
            eng.step()
    context = length + (1 if tokens == 1 else 0)
    return StepProfile(
        handle.checkpoint.path.name, handle.device.name, batch, tokens, context, si.padded_tokens, launches, statistics.median(walls), peak, walls
    )
