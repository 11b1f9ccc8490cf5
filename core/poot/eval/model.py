"""Running a model's step graph on the oracle, with paged KV pools held as numpy arrays.

Test-side, like the rest of eval/: device checks and tests compare executors against this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..graph.ir import Graph
from ..load.roles import WeightMap
from ..models.decoder import StepBatch
from .oracle import Oracle

__all__ = ["oracle_weights", "PagedOracle", "StepBatch"]


def oracle_weights(wm: WeightMap, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Weights as the oracle takes them: packed tensors as their stored bytes, float tensors as
    float32 values (exact for f16/bf16), integer tensors as they are."""
    out = {}
    for t in wm.tensors.values():
        if names is not None and t.name not in names:
            continue
        if t.is_packed:
            out[t.name] = t.raw()
        elif t.storage in ("f32", "f16", "bf16", "f64"):
            out[t.name] = t.dequantize()
        else:
            out[t.name] = t.raw()
    return out


class PagedOracle:
    """A model on the oracle: pools of ``num_blocks`` blocks, poisoned with NaN so that reading a slot
    no step wrote shows up in the logits; ``step`` runs one forward step and keeps the new pools."""

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray], num_blocks: int, float64: bool = False) -> None:
        self.graph, self.weights = graph, weights
        self.oracle = Oracle(float64=float64)
        self.pools: dict[str, np.ndarray] = {}
        for name, v in graph.inputs().items():
            if "_cache." in name:
                shape = tuple(num_blocks if (not d.is_static) else d.value for d in v.shape)
                self.pools[name] = np.full(shape, np.nan, dtype=self.oracle.holder(v.dtype))

    def step(self, batch: StepBatch) -> np.ndarray:
        out = self.oracle.run(self.graph, {**batch.as_inputs(), **self.pools}, self.weights)
        for name in self.pools:
            self.pools[name] = out[name]
        return out["logits"]
