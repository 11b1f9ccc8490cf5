"""Running a plan on the host: kernels JIT-loaded once, one numpy buffer per value (weights bound
zero-copy from the mapped checkpoint, reshapes as views, KV pools updated in place), launches in order."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from poot.codegen import compile_kernel, host_target
from poot.codegen.host_jit import HostKernel
from poot.errors import PootError
from poot.graph import dtypes as dt
from poot.graph.dims import Dim
from poot.plan.lower import SimplePlan

__all__ = ["BaselineExecutor"]


def _np_dtype(t: dt.DType) -> np.dtype:
    if t.is_packed:
        return np.dtype(np.uint8)
    return np.dtype(np.float32) if t == dt.bf16 else np.dtype(t.numpy)


class BaselineExecutor:
    """Runs a ``SimplePlan``: ``run(inputs, weights)`` returns the graph outputs (pools are updated in
    place when the caller passes them as inputs)."""

    def __init__(self, plan: SimplePlan, threads: int = 1) -> None:
        self.plan, self.threads = plan, threads
        target = host_target()
        self._kernels: dict[str, HostKernel] = {}
        for launch in plan.launches:
            key = repr(launch.kernel)
            if key not in self._kernels:
                self._kernels[key] = HostKernel(launch.kernel, compile_kernel(launch.kernel, target))

    def _env(self, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
        env: dict[str, int] = {}
        for name, v in self.plan.graph.inputs().items():
            if name not in inputs:
                raise PootError(f"missing input '{name}' ({v.type})")
            for d, size in zip(v.shape, np.asarray(inputs[name]).shape):
                if len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1:
                    env[d.terms[0][0][0]] = size
        return env

    def run(self, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        g, plan = self.plan.graph, self.plan
        env = self._env(inputs)
        vals: dict[tuple[int, int], np.ndarray] = {}
        for n in g.nodes:
            if n.op == "input":
                vals[(n.id, 0)] = np.ascontiguousarray(inputs[n.attrs["name"]])
            elif n.op == "weight":
                vals[(n.id, 0)] = np.ascontiguousarray(weights[n.attrs["name"]])
            elif n.op == "constant":
                vals[(n.id, 0)] = np.ascontiguousarray(n.attrs["value"].array.astype(_np_dtype(n.attrs["dtype"])))
        for n in g.nodes:
            for v in n.outputs:
                k = (n.id, v.index)
                if k in vals:
                    continue
                shape = tuple(Dim.evaluate(d, env) for d in v.shape)
                if k in plan.views:
                    vals[k] = vals[plan.views[k]].reshape(shape)
                elif k in plan.aliases:
                    vals[k] = vals[plan.aliases[k]]
                else:
                    vals[k] = np.empty(shape, _np_dtype(v.dtype))
        for launch in plan.launches:
            bufs = {}
            for name, ref in launch.buffers.items():
                a = ref if isinstance(ref, np.ndarray) else vals[ref]
                bufs[name] = a.view(np.uint8) if a.dtype == np.bool_ else a
            self._kernels[repr(launch.kernel)].run(launch.grid(env), bufs, launch.scalars(env), threads=self.threads)
        return {name: vals[(v.node.id, v.index)] for name, v in g.outputs.items()}
