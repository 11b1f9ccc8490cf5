"""The kernel part of ``poot check``: small one-op graphs planned for the device as a model's step is
(its own schedules, its own kernels) and run there on fresh random inputs, each output against the
CPU oracle (``poot.eval``). Matrix products cover every packed type at row counts that take the
GEMV, the few-row and the GEMM schedules; the rest are the ops every step runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..eval.oracle import evaluate
from ..graph import GraphBuilder
from ..graph.compose import rms_norm
from ..graph.dims import sym
from ..testing.kernels import bf16_round

__all__ = ["KernelCase", "kernel_cases", "run_kernel_case"]

MATMUL_TYPES = ("f32", "bf16", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k")
QUICK_TYPES = ("f32", "bf16", "q8_0", "q4_k", "q6_k")
ROWS = (1, 3, 16, 64)
QUICK_ROWS = (1, 16)
# how far a device's output may be from the oracle's, relative to the largest |value| the oracle
# gives: tensor cores at matmul precision 'high' keep about 16 bits of each activation (~1e-5 here)
TOLERANCE = 1e-4
TENSOR_CORE_ROWS = 5  # from this many rows a GPU with matrix instructions multiplies packed weights as bf16
GPU_MATRIX_OPS = ("mma", "wgmma", "mfma", "wmma")


@dataclass(frozen=True)
class KernelCase:
    """A graph builder, its inputs and weights for one symbol binding each, and the rows it runs at.
    ``on_tensor_cores``: the outputs as docs/NUMERICS.md says a device with matrix operations
    computes them from 5 rows on (packed weights rounded to bf16 before the product), in float64."""

    name: str
    build: Callable[[GraphBuilder], dict[str, Any]]
    data: Callable[[np.random.Generator, int], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]
    rows: tuple[int, ...]
    on_tensor_cores: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None


def _weight(rng: np.random.Generator, qtype: str, n: int, k: int) -> np.ndarray:
    from ..quant import quantization

    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    if qtype == "f32":
        return w
    if qtype == "bf16":
        return bf16_round(w)
    if qtype == "f16":
        return w.astype(np.float16).astype(np.float32)
    return quantization(qtype).quantize(w)


def _matmul_case(qtype: str, rows: tuple[int, ...]) -> KernelCase:
    n, k = 200, 512  # K in whole super-blocks of 256; N past a tile of 64 and not a multiple of it

    def build(b: GraphBuilder) -> dict[str, Any]:
        return {"y": b.linear(b.input("x", "f32", [sym("tokens"), k]), b.weight("w", qtype, [n, k]))}

    def data(rng: np.random.Generator, m: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return {"x": rng.standard_normal((m, k)).astype(np.float32)}, {"w": _weight(rng, qtype, n, k)}

    def on_tensor_cores(inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ..quant import quantization

        w = bf16_round(quantization(qtype).dequantize(weights["w"]).astype(np.float32))
        return {"y": inputs["x"].astype(np.float64) @ w.astype(np.float64).T}

    packed = qtype not in ("f32", "bf16", "f16")  # (16-bit weights are exact in bf16 or taken as f32)
    return KernelCase(f"matmul {qtype}", build, data, rows, on_tensor_cores if packed else None)


def _embedding_case(qtype: str) -> KernelCase:
    vocab, d = 300, 256

    def build(b: GraphBuilder) -> dict[str, Any]:
        return {"y": b.gather(b.weight("table", qtype, [vocab, d]), b.input("ids", "i32", [sym("tokens")]), dtype="f32")}

    def data(rng: np.random.Generator, m: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return {"ids": rng.integers(0, vocab, m).astype(np.int32)}, {"table": _weight(rng, qtype, vocab, d)}

    return KernelCase(f"embedding {qtype}", build, data, (1, 7))


def _rms_norm_case() -> KernelCase:
    d = 576

    def build(b: GraphBuilder) -> dict[str, Any]:
        x = b.add(b.input("x", "f32", [sym("tokens"), d]), b.input("r", "f32", [sym("tokens"), d]))
        return {"h": x, "y": rms_norm(b, x, b.weight("w", "f32", [d]), 1e-5)}

    def data(rng: np.random.Generator, m: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        x = {n: rng.standard_normal((m, d)).astype(np.float32) for n in ("x", "r")}
        return x, {"w": (1 + 0.2 * rng.standard_normal(d)).astype(np.float32)}

    return KernelCase("residual add + rms_norm", build, data, (1, 5))


def _gated_case() -> KernelCase:
    d = 1536

    def build(b: GraphBuilder) -> dict[str, Any]:
        g, u = b.input("g", "f32", [sym("tokens"), d]), b.input("u", "f32", [sym("tokens"), d])
        return {"y": b.mul(b.mul(g, b.sigmoid(g)), u)}

    def data(rng: np.random.Generator, m: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return {n: (2 * rng.standard_normal((m, d))).astype(np.float32) for n in ("g", "u")}, {}

    return KernelCase("silu(gate) * up", build, data, (1, 9))


def _softmax_case() -> KernelCase:
    v = 1000

    def build(b: GraphBuilder) -> dict[str, Any]:
        x = b.input("x", "f32", [sym("tokens"), v])
        e = b.exp(b.sub(x, b.max(x, keepdims=True)))
        return {"p": b.div(e, b.sum(e, keepdims=True))}

    def data(rng: np.random.Generator, m: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return {"x": (3 * rng.standard_normal((m, v))).astype(np.float32)}, {}

    return KernelCase("softmax", build, data, (1, 4))


def kernel_cases(quick: bool = False) -> list[KernelCase]:
    rows = QUICK_ROWS if quick else ROWS
    cases = [_matmul_case(q, rows) for q in (QUICK_TYPES if quick else MATMUL_TYPES)]
    cases += [_embedding_case(q) for q in (("q8_0", "q4_k") if quick else ("f32", "bf16", "q8_0", "q4_k", "q6_k"))]
    cases += [_rms_norm_case(), _gated_case(), _softmax_case()]
    return cases


def run_kernel_case(case: KernelCase, device: Any, executor_factory: Callable[..., Any], rng: np.random.Generator) -> str:
    """Plan ``case`` for ``device`` and run it at each of its row counts against the oracle; returns a
    one-line summary, or raises ``AssertionError`` naming the rows and output that differ."""
    from ..graph.passes import DEFAULT_PASSES, PassManager
    from ..plan import compile_plan

    b = GraphBuilder()
    graph = PassManager(DEFAULT_PASSES).run(b.build(case.build(b)))
    plan = compile_plan(graph, device)
    ex = executor_factory(plan)
    worst = 0.0
    kernels: set[str] = set()
    # GPU matrix instructions (NVIDIA's mma.sync and wgmma, AMD's MFMA and WMMA) take packed weights
    # as bf16; a CPU's (AMX, VNNI) products here are exact
    ops = device.capabilities.matrix_ops if device.capabilities is not None else ()
    matrix = any(op.startswith(GPU_MATRIX_OPS) for op in ops)
    rounded = []
    try:
        for m in case.rows:
            inputs, weights = case.data(rng, m)
            got = ex.run(inputs, weights)
            if case.on_tensor_cores is not None and matrix and m >= TENSOR_CORE_ROWS:
                want = case.on_tensor_cores(inputs, weights)
                rounded.append(m)
            else:
                want = evaluate(graph, inputs, weights)
            for name, w in want.items():
                g = np.asarray(got[name])
                if g.shape != w.shape:
                    raise AssertionError(f"{m} rows: output {name} has shape {g.shape}, the oracle's {w.shape}")
                if w.dtype.kind in "iu":
                    bad = np.nonzero(g != w)[0]
                    if bad.size:
                        raise AssertionError(f"{m} rows: output {name} differs from the oracle's at {bad.size} of {w.size} (first at {bad[0]})")
                    continue
                if not np.isfinite(g).all():
                    raise AssertionError(f"{m} rows: output {name} has {int((~np.isfinite(g)).sum())} non-finite values (unwritten or overflowed)")
                scale = float(np.abs(w).max()) or 1.0
                err = float(np.abs(g.astype(np.float64) - w).max()) / scale
                if err > TOLERANCE:
                    raise AssertionError(f"{m} rows: output {name} is {err:.2g} (relative to its largest value) from the oracle's, over {TOLERANCE:g}")
                worst = max(worst, err)
        kernels = {l.kernel.name for l in plan.launches}
    finally:
        ex.close()
    against = f" (rows {', '.join(map(str, rounded))}: its weights rounded to bf16, as docs/NUMERICS.md says tensor cores take them)" if rounded else ""
    return f"rows {', '.join(map(str, case.rows))}: within {worst:.1g} of the oracle{against} ({', '.join(sorted(kernels))})"
