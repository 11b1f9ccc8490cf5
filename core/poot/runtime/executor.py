"""The executor contract: how a device runs a plan.

An executor is built for one plan on one device (``load``: kernels compiled and loaded once). Then:

- ``bind(weights, pools)``: persistent buffers: the checkpoint's weights (zero-copy where the device
  can read host memory) and the KV pools, which steps update in place.
- ``capture(env)``: record one step for the symbol values ``env`` (token count, sequences, block-table
  width, logit rows): storage is planned, every buffer address, grid and scalar is fixed, and the step
  becomes something the device replays as a whole (a chain of native calls on the host, a CUDA graph
  on NVIDIA). Whatever changes between steps (token ids, positions, slots, block tables, context
  lengths) lives in the step's input buffers, so a captured step replays unchanged.
- ``replay(step, inputs)``: write the inputs into the step's buffers and run it.
- ``read(step, name)``: a graph output, copied back to the host.
- ``launch(step, inputs)`` / ``finish(handle)`` / ``fetch(handle, name)``: the same as a queued replay;
  an ``asynchronous`` executor returns from ``launch`` while the device runs the step.
- ``profile(step, inputs)``: seconds per launch, each timed on the device (host clock, CUDA events,
  Vulkan timestamps); ``peak()``: the device's attainable memory bandwidth and FLOP rate, what
  ``poot profile`` sets each launch against. Both optional: a device that cannot time its launches
  refuses by name.

``run(inputs, weights)`` does all of it for callers that hold plain arrays: it binds what changed,
captures a step the first time a shape is seen, and replays it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PootError, Refusal
from ..plan.plan import Plan

__all__ = ["Executor", "Peak", "step_env"]


@dataclass(frozen=True)
class Peak:
    """A device's attainable rates: bytes read plus written per second by a large copy, and FLOP/s
    of its fastest matrix product; ``source`` says how each was found (measured, or from the
    device's specification)."""

    bytes_per_s: float
    flops_per_s: float
    source: str


def step_env(plan: Plan, inputs: Mapping[str, Any]) -> dict[str, int]:
    """Symbol values from the shapes of the step's inputs (a dimension that is a bare symbol binds it)."""
    env: dict[str, int] = {}
    for name, rank, axes in plan.input_symbols:
        if name not in inputs:
            raise PootError(f"missing input '{name}' ({plan.inputs[name].type})")
        a = inputs[name]
        shape = a.shape if isinstance(a, np.ndarray) else np.shape(a)
        if len(shape) != rank:
            raise PootError(f"input '{name}' has shape {shape}, the graph wants {plan.inputs[name].type}")
        for i, sym in axes:
            if env.setdefault(sym, shape[i]) != shape[i]:
                raise PootError(f"input '{name}': dimension {sym} is {shape[i]} here but {env[sym]} elsewhere")
    return env


class Executor(ABC):
    """Runs one plan on one device."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    @abstractmethod
    def bind(self, weights: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray] | None = None) -> None:
        """Make weights and KV pools the buffers every captured step reads and writes."""

    @abstractmethod
    def capture(self, env: Mapping[str, int]) -> Any:
        """Record a step for these symbol values."""

    @abstractmethod
    def replay(self, step: Any, inputs: Mapping[str, np.ndarray]) -> None:
        """Write ``inputs`` into the step's buffers and run it."""

    @abstractmethod
    def read(self, step: Any, name: str) -> np.ndarray:
        """A graph output of the last replay of ``step``."""

    # Queued replays. An executor whose device runs a step while the host goes on (``asynchronous``)
    # returns from ``launch`` at once, so the engine can queue the next step (its tokens taken from
    # this one's on the device) before reading this one's; the default runs the step to completion.
    asynchronous = False

    def launch(self, step: Any, inputs: Mapping[str, np.ndarray], keep: tuple[str, ...] = ()) -> Any:
        """Queue a replay of ``step`` with ``inputs``; returns a handle for ``finish`` and ``fetch``,
        which gives the outputs named in ``keep`` as this replay computed them, whatever replays
        come after it. (Here: the replay run, and those outputs read, before it returns.)"""
        self.replay(step, inputs)
        return {name: self.read(step, name) for name in keep}

    def finish(self, handle: Any) -> None:
        """Wait until the replay ``handle`` names is done."""

    def fetch(self, handle: Any, name: str) -> np.ndarray:
        """An output named in ``launch``'s ``keep``, of the replay ``handle`` names, after ``finish``."""
        return handle[name]

    @abstractmethod
    def write_pool(self, name: str, index: int, values: np.ndarray) -> None:
        """Overwrite ``pool[index]`` (one leading-axis row of a bound pool) on the device, e.g. to
        reset a sequence's token counts."""

    def close(self) -> None:
        """Release threads and device memory (the executor is unusable afterwards)."""

    def profile(self, step: Any, inputs: Mapping[str, np.ndarray], repeat: int = 3) -> list[tuple[str, float]]:
        """(kernel name, seconds) per launch of ``step`` in plan order: the median of ``repeat``
        runs, each launch timed on its own."""
        raise Refusal("launch timing", self.plan.device, f"{type(self).__name__} cannot time single launches")

    def peak(self) -> Peak | None:
        """The device's attainable bandwidth and FLOP rate, or None where it is not known."""
        return None

    def pool_names(self) -> list[str]:
        """Inputs that are written in place (KV pools): they are bound, not passed per step."""
        roots = set(self.plan.aliases.values())
        return [name for name, v in self.plan.inputs.items() if (v.node.id, v.index) in roots]

    def run(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Bind, capture (once per shape) and replay; returns every graph output."""
        pools = {n: inputs[n] for n in self.pool_names() if n in inputs}
        self.bind(weights, pools)
        env = step_env(self.plan, inputs)
        step = self.capture(env)
        self.replay(step, {n: a for n, a in inputs.items() if n not in pools})
        return {name: self.read(step, name) for name in self.plan.graph.outputs}
