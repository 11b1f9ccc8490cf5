"""A plan: the launches that run a graph's step on a device, the values that share storage, and a
readable listing."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph.ir import Graph, Node
from ..kernel import ir as K
from .common import Env
from .layouts import WeightLayout

__all__ = ["Launch", "Plan", "Scratch", "When", "WANT_LOGPROBS"]

# a step symbol that is not a shape: 0 when no sequence of the step asks for log-probabilities,
# so their launch is left out of that step (executors capture a step per symbol values)
WANT_LOGPROBS = "want_logprobs"


@dataclass(frozen=True)
class When:
    """A launch's condition on the symbol values, with a readable description."""

    doc: str
    test: Callable[[Env], bool]

    def __call__(self, env: Env) -> bool:
        return self.test(env)


@dataclass(frozen=True)
class Scratch:
    """Working memory some launches share that is no graph value (split attention's partial results):
    ``words(env)`` f32 words in the step's arena, alive from its first launch to its last. A launch
    names it by ``key`` (negative: never a graph value's) like a value."""

    key: tuple[int, int]
    words: Callable[[Env], int]


@dataclass
class Launch:
    """One kernel launch: buffers by parameter name (graph values or fixed arrays), a grid and scalars
    computed from the symbol environment."""

    node: Node
    kernel: K.Kernel
    buffers: dict[str, tuple[int, int] | np.ndarray]
    grid: Callable[[Env], tuple[int, ...]]
    scalars: Callable[[Env], dict[str, float | int]]
    when: Callable[[Env], bool] | None = None  # a schedule for some shapes only: exactly one of a node's launches runs
    label: str = ""  # what the launch computes when it is more than its node's op (a recognised pattern)
    variant: Callable[..., K.Kernel] | None = None  # the call that made ``kernel``: a later pass may make it with more options
    place: str = ""  # where it runs: "" on the plan's device; "host" on the host CPU (an offloading device serves only some ops)


def _name(graph_names: Mapping[tuple[int, int], str], key: tuple[int, int], v_type: object) -> str:
    return f"{graph_names.get(key, f'%{key[0]}' + (f'.{key[1]}' if key[1] else ''))}:{v_type}"


@dataclass
class Plan:
    """Launches in order (a node may have several, each for some shapes: see ``Launch.when``), and
    the values that share storage. The device it was made for is ``device``."""

    graph: Graph
    launches: list[Launch]
    views: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # value -> the value whose storage it shares
    scratch: dict[tuple[int, int], Scratch] = field(default_factory=dict)  # working memory by key
    aliases: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # in-place outputs (cache_write)
    device: str = "host"
    layouts: dict[str, WeightLayout] = field(default_factory=dict)  # weights by name that every launch reads in a layout of its own

    @functools.cached_property
    def inputs(self) -> dict[str, Any]:
        """The graph's inputs by name (looked up on every step: computed once)."""
        return self.graph.inputs()

    @functools.cached_property
    def input_symbols(self) -> tuple[tuple[str, int, tuple[tuple[int, str], ...]], ...]:
        """Each input's (name, rank, (axis, symbol) of its dimensions that are a bare symbol): what
        binds a step's symbols from its inputs' shapes (``runtime.executor.step_env``), computed once."""
        out = []
        for name, v in self.inputs.items():
            axes = tuple((i, d.terms[0][0][0]) for i, d in enumerate(v.shape) if len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1)
            out.append((name, v.rank, axes))
        return tuple(out)

    def root(self, key: Any) -> Any:
        """The value whose storage ``key`` shares (through views and in-place outputs); ``key`` itself
        when it shares none (or is not a value's key)."""
        while isinstance(key, tuple) and (key in self.views or key in self.aliases):
            key = self.views.get(key, self.aliases.get(key))
        return key

    def add_scratch(self, words: Callable[[Env], int]) -> tuple[int, int]:
        """A new scratch area of ``words(env)`` f32 words; its key, for launches' buffers."""
        key = (-1 - len(self.scratch), 0)
        self.scratch[key] = Scratch(key, words)
        return key

    def describe(self, env: Mapping[str, int] | None = None) -> str:
        """A listing: one line per launch with its kernel, schedule condition, grid (evaluated when
        ``env`` gives the symbol values) and the values it reads and writes."""
        g = self.graph
        names: dict[tuple[int, int], str] = {}
        for n in g.nodes:
            if n.op in ("input", "weight"):
                names[(n.id, 0)] = n.attrs["name"]
        for name, v in g.outputs.items():
            names.setdefault((v.node.id, v.index), name)
        types = {(n.id, v.index): v.type for n in g.nodes for v in n.outputs}
        active = [l for l in self.launches if env is None or l.when is None or l.when(env)]
        kernels = {l.kernel.name for l in active}
        head = f"plan for {self.device}: {len(active)} launches of {len(kernels)} kernels ({len(g.nodes)} graph nodes)"
        if env is not None:
            head += " with " + ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
        lines = [head]
        for i, l in enumerate(active):
            reads, writes = [], []
            for p in l.kernel.params:
                ref = l.buffers.get(p.name) if isinstance(p, K.Buffer) else None
                if ref is None or not isinstance(ref, tuple):
                    continue
                label = (
                    f"scratch{-ref[0]}:f32[{'by shape' if env is None else self.scratch[ref].words(env)}]"
                    if ref in self.scratch
                    else _name(names, ref, types[ref])
                )
                (reads if p.readonly else writes).append(label)
            grid = "x".join(str(d) for d in l.grid(env)) if env is not None else "by shape"
            cond = f" [{getattr(l.when, 'doc', 'some shapes')}]" if l.when is not None and env is None else ""
            where = f" [on {l.place}]" if l.place else ""
            lines.append(f"{i:4d} {l.label or l.node.op:11s} {l.kernel.name}{cond}{where}  grid {grid}\n       {', '.join(reads)} -> {', '.join(writes)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()
