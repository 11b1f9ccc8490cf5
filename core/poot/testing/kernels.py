"""Running kernels on the host target in tests: compile (cached on disk), load, run a grid, with
outputs poisoned first so that an element a kernel never wrote shows up as NaN (or a sentinel)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from ..codegen import compile_kernel, host_target
from ..codegen.host_jit import HostKernel
from ..kernel.ir import Buffer, Kernel

__all__ = [
    "run_host",
    "assert_draws_match",
    "poisoned",
    "q8x2_reference",
    "split_reference",
    "bf16_bits",
    "bf16_round",
    "random_bf16",
    "assert_f32_sum_close",
    "features_under_test",
    "paged_block_tables",
    "pools_as",
    "Assembled",
    "DEVICE_KERNEL_SUITES",
    "GPU_SCHEDULES",
]

_LOADED: dict[str, HostKernel] = {}
_RUNNERS: dict[str, object] = {}


def poisoned(shape: Sequence[int], dtype: type = np.float32) -> np.ndarray:
    """An output buffer filled with NaN (floats) or a sentinel (ints): unwritten elements stay so."""
    if np.dtype(dtype).kind == "f":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype)


def q8x2_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What ``quantize_q8x2`` writes for x [m, k], in numpy with the kernel's f32 operations: per 32
    values d = max|x| / 127, q1 = rint(x * (127 / max|x|)) and q2 = rint((x - q1 d) * (127 / max|x|) * 254),
    each packed four bytes a word (``xq``, ``xr``), and (d, sum of the 32) pairs (``xds``)."""
    m = x.shape[0]
    b = x.reshape(m, -1, 32).astype(np.float32)
    qmax = np.abs(b).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        qinv = np.where(qmax > 0, np.float32(127) / qmax, np.float32(0)).astype(np.float32)
    qd = (qmax / np.float32(127)).astype(np.float32)
    q1 = np.rint(b * qinv).astype(np.float32)
    q2 = np.rint((b - q1 * qd) * (qinv * np.float32(254))).astype(np.float32)

    def words(q: np.ndarray) -> np.ndarray:
        return q.astype(np.int8).reshape(-1).view(np.int32).copy()

    return words(q1), words(q2), np.stack([qd[..., 0], b.sum(axis=2, dtype=np.float32)], axis=-1).reshape(-1)


class Assembled(Exception):
    """Raised by the kernel runner of a compile-only device (``POOT_TEST_DEVICE=null:ARCH``)
    once a case's kernel is compiled (and assembled, where the target has an assembler) for a GPU
    that is not here: the case ends there, and a device run counts it as passed
    (``poot.testing.device_suites``). A kernel that fails to compile, that the assembler refuses, or
    whose registers or workgroup memory exceed what its workgroup may have fails the case instead."""


def _device_runner():  # type: ignore[no-untyped-def]
    """The runner of ``POOT_TEST_DEVICE`` (a device name), from the plugin that owns it (for a
    compile-only device, one that compiles and raises ``Assembled``)."""
    name = os.environ.get("POOT_TEST_DEVICE")
    if not name or name == "cpu":
        return None
    if name not in _RUNNERS:
        from ..plugins import host
        from ..runtime import get_device

        dev = get_device(name)
        if not dev.available():
            raise RuntimeError(f"POOT_TEST_DEVICE={name}: {dev.available()}")
        runner = host().hook.poot_kernel_runner(device=dev)
        if runner is None:
            raise RuntimeError(f"POOT_TEST_DEVICE={name}: no installed plugin runs single kernels there")
        _RUNNERS[name] = runner
    return _RUNNERS[name]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bits (uint16) of the bf16 nearest to each f32 value, ties to even."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest bf16 (ties to even), as f32."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def split_reference(x: np.ndarray) -> np.ndarray:
    """What ``split_bf16x2`` writes for x [m, k], in numpy: the nearest bf16 of each value (ties to
    even), then the nearest bf16 of the remainder, two values a word (the first in the low half) —
    the hi plane, then the lo plane, as int32 words."""
    hi = bf16_bits(x)
    lo = bf16_bits(x.astype(np.float32) - (hi.astype(np.uint32) << 16).view(np.float32))
    return np.concatenate([hi.reshape(-1), lo.reshape(-1)]).view(np.int32).copy()


def random_bf16(rng: np.random.Generator, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Random bf16 values as (their float32 values, their bits as int32 pairs: rows of words as GPU
    matrix kernels bind bf16 weights)."""
    bits = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32), bits.view(np.int32)


def assert_f32_sum_close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, slack: float = 0.0) -> None:
    """Every element of ``got`` written (finite) and within the f32-summation bound 1e-5 * ``scale``
    (the sum of |x||w| a product adds) of the float64 ``want``."""
    assert np.isfinite(got).all(), "an output element was never written"
    bad = np.abs(got - want) > 1e-5 * scale + 1e-6 + slack
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.abs(got - want).max():.3g}"


def assert_draws_match(tokens: np.ndarray, scores: np.ndarray, rtol: float = 1e-5, share: float = 0.01) -> None:
    """Each row's drawn token is the oracle's (the argmax of ``scores``, ``sample_scores``'s f64 scores)
    or ties with it: a kernel adds Gumbel noise in f32 with an approximate log, so a row whose two
    best scores lie within ``rtol`` may go either way. At most ``share`` of the rows (one at least)
    may differ, and only by such a tie."""
    want = np.argmax(scores, axis=1)
    rows = np.nonzero(tokens != want)[0]
    best = scores[rows, want[rows]]
    got = scores[rows, tokens[rows]]
    far = rows[~(got >= best - rtol * np.maximum(1.0, np.abs(best)))]
    assert len(far) == 0, f"rows {far[:8].tolist()} drew {tokens[far[:8]].tolist()}, not the oracle's {want[far[:8]].tolist()} nor a tie with it"
    assert len(rows) <= max(1, share * len(tokens)), f"{len(rows)} of {len(tokens)} rows drew a tie, not the oracle's token"


def features_under_test() -> tuple[int, frozenset[str]]:
    """``POOT_TEST_DEVICE``'s subgroup width (0 where kernels may not use subgroup operations) and
    matrix operations: what decides which GPU-schedule cases run there."""
    name = os.environ.get("POOT_TEST_DEVICE", "cpu")
    if name == "cpu":
        return 0, frozenset()
    from ..runtime import get_device

    caps = get_device(name).capabilities
    if caps is None:
        return 0, frozenset()
    return (caps.subgroup_size if caps.subgroup_ops else 0), caps.matrix_ops


def run_host(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, float | int] | None = None, threads: int = 2) -> None:
    """Run ``k`` on the host, or on ``POOT_TEST_DEVICE`` when that names another device."""
    runner = _device_runner()
    if runner is not None:
        missing = [p.name for p in k.params if isinstance(p, Buffer) and p.name not in buffers]
        if missing:
            raise KeyError(f"kernel {k.name}: no array for buffers {missing}")
        runner(k, grid, buffers, scalars or {})
        return
    key = repr(k)
    hk = _LOADED.get(key)
    if hk is None:
        hk = _LOADED[key] = HostKernel(k, compile_kernel(k, host_target()))
    missing = [p.name for p in k.params if isinstance(p, Buffer) and p.name not in buffers]
    if missing:
        raise KeyError(f"kernel {k.name}: no array for buffers {missing}")
    hk.run(grid, buffers, scalars, threads=threads)


# The kernel suites every device runs (``poot.testing.device_suites``): the host schedules' kernels
# serve host plans only, so a device runs one of them as a canary that the lowering takes them.
DEVICE_KERNEL_SUITES = ("tests/test_kernels_host.py", "tests/test_kernels_dequant.py", "tests/test_kernels_host_schedules.py::test_gemv_lanes_f32[37]")
GPU_SCHEDULES = ("tests/test_kernels_gpu_schedules.py",)  # the cases a device's subgroups allow


def paged_block_tables(rng: np.random.Generator, ctx: Sequence[int], bs: int) -> tuple[int, int, np.ndarray]:
    """Block tables for contexts ``ctx`` over shuffled blocks of ``bs`` (two spare): (blocks, table width, tables)."""
    nblk = [(c + bs - 1) // bs for c in ctx]
    nb, mb = sum(nblk) + 2, max(nblk) + 1
    order, tables, at = rng.permutation(nb), np.zeros((len(ctx), mb), np.int32), 0
    for s in range(len(ctx)):
        tables[s, : nblk[s]] = order[at : at + nblk[s]]
        at += nblk[s]
    return nb, mb, tables


def pools_as(data: dict, pt: str) -> tuple[dict, dict]:
    """(the kernel's pools, the case with its pools as the kernel reads them, widened to f32): f16
    pools hold the case's values rounded to halves, which the reference then takes exactly."""
    if pt == "f32":
        return {"k_pool": data["k"], "v_pool": data["v"], "ks_pool": np.zeros(1, np.float32)}, data
    k, v = data["k"].astype(np.float16), data["v"].astype(np.float16)
    return {"k_pool": k, "v_pool": v, "ks_pool": np.zeros(1, np.float16)}, {**data, "k": k.astype(np.float32), "v": v.astype(np.float32)}
