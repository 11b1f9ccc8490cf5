"""Running kernels on the host target in tests: compile (cached on disk), load, run a grid, with
outputs poisoned first so that an element a kernel never wrote shows up as NaN (or a sentinel)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import numpy as np

from ..codegen import compile_kernel, host_target, target
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
    "find_ptxas",
    "ptxas_usage",
    "Assembled",
    "DEVICE_KERNEL_SUITES",
    "GPU_SCHEDULES",
    "NVIDIA_SCHEDULES",
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
    """A case's kernel compiled to PTX and assembled by ptxas, where the GPU it is for is not here
    (``POOT_TEST_DEVICE=ptxas:sm_90a``): the case ends there, and a device run counts it as passed
    (``poot.testing.device_suites``). A kernel that fails to compile, that ptxas refuses, or whose
    registers or workgroup memory exceed what its workgroup may have fails the case instead."""


# what kernels may use on ``ptxas:ARCH``: the matrix instructions and dynamic workgroup memory a
# workgroup may have on that architecture's GPUs (sm_90a: H100/H200's 227 KiB opt-in)
_ASSEMBLE_FOR = {"sm_90a": (frozenset({"mma.sync.f16", "mma.sync.bf16", "wgmma"}), 232448), "sm_80": (frozenset({"mma.sync.f16", "mma.sync.bf16"}), 166912)}


def _assembler(arch: str):  # type: ignore[no-untyped-def]
    """A runner that compiles a kernel for ``nvptx:ARCH``, assembles it with ptxas, checks what a
    launch would refuse (registers times threads past the SM's 65,536, workgroup memory past the
    opt-in maximum) and raises ``Assembled``."""
    from ..codegen.targets import shared_layout

    if arch not in _ASSEMBLE_FOR:
        raise RuntimeError(f"POOT_TEST_DEVICE=ptxas:{arch}: no such architecture here (one of {', '.join(_ASSEMBLE_FOR)})")
    tgt = target(f"nvptx:{arch}")

    def run(k: Kernel, grid: Sequence[int], buffers: Mapping[str, np.ndarray], scalars: Mapping[str, float | int]) -> None:
        missing = [p.name for p in k.params if not isinstance(p, Buffer) and p.name not in scalars]
        assert not missing, f"kernel {k.name}: no value for scalars {missing}"
        regs, spills, _ = ptxas_usage(compile_kernel(k, tgt).data, arch)
        assert regs * k.threads <= 65536, f"{k.name}: {regs} registers a thread x {k.threads} threads exceed an SM's 65,536"
        dynamic = shared_layout(k, tgt)[1]
        assert dynamic <= _ASSEMBLE_FOR[arch][1], f"{k.name}: {dynamic} bytes of workgroup memory, more than {arch} gives a workgroup"
        raise Assembled(f"{k.name} assembled for {arch}: {regs} registers, {spills} bytes spilled")

    return run


def _device_runner():  # type: ignore[no-untyped-def]
    """The runner of ``POOT_TEST_DEVICE`` (a device name), from the plugin that owns it; for
    ``ptxas:ARCH``, the assembler above."""
    name = os.environ.get("POOT_TEST_DEVICE")
    if not name or name == "cpu":
        return None
    if name.startswith("ptxas:"):
        return _RUNNERS.setdefault(name, _assembler(name.removeprefix("ptxas:")))
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
    if name.startswith("ptxas:"):
        return 32, _ASSEMBLE_FOR.get(name.removeprefix("ptxas:"), (frozenset(), 0))[0]
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
GPU_SCHEDULES = ("tests/test_kernels_gpu_schedules.py",)  # the cases a device's subgroups (or tensor cores) allow
NVIDIA_SCHEDULES = ("tests/test_kernels_gpu_schedules.py", "tests/test_kernels_wgmma.py")  # assembled for sm_90a where no GPU is


def find_ptxas() -> str | None:
    """NVIDIA's PTX assembler, for checks of the PTX that codegen emits where no GPU is (registers,
    spills, PTX the driver would refuse): the CUDA toolkit's on PATH, else the one in PyPI's
    ``nvidia-cuda-nvcc-cu12`` where that is installed; None where neither is."""
    path = shutil.which("ptxas")
    if path:
        return path
    try:
        import nvidia.cuda_nvcc as nvcc  # type: ignore[import-not-found]
    except ImportError:
        return None
    for base in getattr(nvcc, "__path__", []):
        exe = os.path.join(base, "bin", "ptxas")
        if os.access(exe, os.X_OK):
            return exe
    return None


def ptxas_usage(ptx: bytes, arch: str) -> tuple[int, int, str]:
    """``ptx`` assembled by ``find_ptxas()`` for ``arch`` (sm_90a, say): (registers a thread, bytes of
    spill stores and loads, ptxas's report); AssertionError with its message where it refuses it."""
    exe = find_ptxas()
    assert exe is not None, "no ptxas here (pip install nvidia-cuda-nvcc-cu12, or the CUDA toolkit)"
    r = subprocess.run([exe, f"-arch={arch}", "-v", "-o", os.devnull, "-"], input=ptx, capture_output=True)
    out = r.stderr.decode(errors="replace")
    assert r.returncode == 0, f"ptxas refused the PTX for {arch}: {out}"
    regs = int(re.search(r"Used (\d+) registers", out).group(1))  # type: ignore[union-attr]
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    return regs, spills, out
