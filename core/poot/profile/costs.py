"""What each launch of a step moves and computes: bytes of the buffers it reads and writes, and its
floating-point operations, from the plan and the step's symbol values alone (no device is asked).

Bytes are the buffers' sizes as stored: weights as bound (packed blocks as their bytes), activations
and scratch at their storage type, KV pools by the positions the step reads (attention: every
position in context) or writes (one per token), not by the pool's whole size. FLOPs count a
multiply-add as two: ``2·M·N·K`` for a matrix product, ``4·heads·dim`` per attended position for
attention (scores and the weighted sum), one per output element for the rest (norms, activations,
sampling), which is a floor: those launches are bound by memory anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..kernel import ir as K
from ..plan.memory import StoragePlan
from ..plan.plan import Plan

__all__ = ["LaunchCost", "launch_costs"]

Key = tuple[int, int]


@dataclass(frozen=True)
class LaunchCost:
    bytes_read: int
    bytes_written: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


def _elements(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def launch_costs(
    plan: Plan,
    storage: StoragePlan,
    weights: Mapping[str, np.ndarray],
    positions: np.ndarray,
) -> list[LaunchCost]:
    """One ``LaunchCost`` per launch of ``storage.launches`` (the step's active launches, in order).
    ``weights`` are the arrays bound by name; ``positions`` the step's token positions (padding
    tokens at -1 or past the context are not counted), from which each token's attended context
    (its position + 1) follows."""
    g = plan.graph
    by_key = {(n.id, v.index): v for n in g.nodes for v in n.outputs}
    weight_names = {(n.id, 0): n.attrs["name"] for n in g.nodes if n.op == "weight"}
    tokens = int(storage.env.get("tokens", len(positions)))
    attended = int(np.sum(np.asarray(positions[:tokens], np.int64) + 1))
    pool_roots = {storage.roots[k]: k for k in storage.pools.values()}
    per_position: dict[Key, int] = {}
    for root, k in pool_roots.items():
        shape = storage.shapes[k]  # [blocks, block_size, ...]
        positions_held = max(1, shape[0] * (shape[1] if len(shape) > 1 else 1))
        per_position[root] = storage.nbytes(k, by_key[k].dtype) // positions_held

    def size(ref: object, reads: bool) -> int:
        if isinstance(ref, np.ndarray):
            return int(ref.nbytes)
        key = ref  # a value's key or a scratch area's
        if key in storage.scratch:
            return storage.nbytes(key)  # type: ignore[arg-type]
        root = storage.roots.get(key, key)  # type: ignore[call-overload]
        if root in per_position:
            return per_position[root] * (attended if reads else tokens)
        name = weight_names.get(root)
        if name is not None and name in weights:
            return int(weights[name].nbytes)
        return storage.nbytes(key, by_key[key].dtype)  # type: ignore[index]

    out = []
    for launch in storage.launches:
        read = written = 0
        node = launch.node
        table = (node.inputs[0].node.id, node.inputs[0].index) if node.op == "gather" and len(node.inputs) == 2 else None
        for p in launch.kernel.params:
            if not isinstance(p, K.Buffer):
                continue
            ref = launch.buffers.get(p.name)
            if ref is None:
                continue
            if p.readonly:
                n = size(ref, True)
                if table is not None and isinstance(ref, tuple) and ref == table:  # a lookup reads the rows it gathers, not the table
                    rows = storage.shapes[table][0] if storage.shapes.get(table) else 1
                    ids = node.inputs[1]
                    n = n * min(rows, _elements(storage.shapes.get((ids.node.id, ids.index), ()))) // max(1, rows)
                read += n
            else:
                written += size(ref, False)
        out.append(LaunchCost(read, written, _flops(launch, storage, by_key, attended)))
    return out


# labels of a matmul's launches that prepare its operands or finish its sums (counted as the rest are)
_PREPARES = frozenset({"quantize_x", "quantize_x_host", "split_x", "dequantize", "sum_parts"})


def _flops(launch, storage: StoragePlan, by_key, attended: int) -> int:  # type: ignore[no-untyped-def]
    node = launch.node
    outs = [storage.shapes.get((node.id, v.index), ()) for v in node.outputs]
    out_elems = sum(_elements(s) for s in outs)
    op = node.op
    if op == "matmul" and launch.label in _PREPARES:  # x or the weights made ready, or K-split parts added: not the product
        return out_elems
    if op == "matmul" and node.inputs:
        a = node.inputs[0]
        k = storage.shapes.get((a.node.id, a.index), ())
        # several products of one x in one launch (q, k and v; a gated MLP's gate and up): each
        # weight's features, where the launch's node is only the first product
        ws = [ref for nm, ref in launch.buffers.items() if nm in ("wg", "wu") or (nm[:1] == "w" and nm[1:].isdigit())]
        if ws and outs and outs[0]:
            rows = out_elems // max(1, outs[0][-1])
            return 2 * rows * sum(storage.shapes.get(ref, (0,))[0] for ref in ws) * (k[-1] if k else 1)
        return 2 * out_elems * (k[-1] if k else 1)
    if op == "attention" and outs and outs[0]:
        shape = outs[0]
        per_token = _elements(shape[1:])  # heads x value dim
        return 4 * per_token * attended
    return out_elems
