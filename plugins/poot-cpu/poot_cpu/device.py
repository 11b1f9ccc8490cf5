"""The host CPU device: capabilities read from LLVM's view of the host and from the OS."""

from __future__ import annotations

import os
from pathlib import Path

from poot.backend import Capabilities, Device, Unavailable

__all__ = ["host_device", "vector_bits"]

DTYPES = frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"})


def vector_bits(features: dict[str, bool]) -> int:
    """Widest SIMD register the host supports, from LLVM's feature flags."""
    if features.get("avx512f"):
        return 512
    if features.get("avx2") or features.get("avx"):
        return 256
    if any(features.get(f) for f in ("sse2", "neon", "simd128", "altivec")):
        return 128
    if features.get("sve"):
        return 128  # SVE's width is chosen at run time; 128 is the architectural minimum
    return 64


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cache_bytes(level: int) -> int:
    """Data/unified cache size of cpu0 at ``level`` from sysfs (0 when unknown)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            if int((idx / "level").read_text()) == level and (idx / "type").read_text().strip() in ("Data", "Unified"):
                size = (idx / "size").read_text().strip().upper()
                mult = {"K": 1024, "M": 1024**2}.get(size[-1], 1)
                return int(size.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return 0


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def host_device() -> Device:
    try:
        import llvmlite.binding as llvm
    except ImportError as e:
        return Device("cpu", None, "host CPU", target="host", unavailable=Unavailable("no-binding", f"llvmlite is not importable ({e}); pip install llvmlite"))
    llvm.initialize_all_targets()
    cpu = llvm.get_host_cpu_name()
    features = {k: bool(v) for k, v in llvm.get_host_cpu_features().items()}
    bits = vector_bits(features)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    caps = Capabilities(
        dtypes=DTYPES,
        compute_units=cores,
        max_workgroup_size=1024,  # a workgroup's threads run as a loop on one core
        shared_memory_bytes=_cache_bytes(2) or 256 * 1024,  # workgroup memory should stay in L2
        subgroup_size=1,  # a workgroup's threads run as a loop on one core; LLVM vectorises that loop
        memory_bytes=_memory_bytes(),
        vector_bits=bits,
        matrix_ops=frozenset(f for f in ("avx512bf16", "avx512vnni", "avxvnni", "amx-tile", "i8mm", "bf16") if features.get(f)),
        details=(("llvm cpu", cpu), ("triple", llvm.get_process_triple())),
    )
    return Device("cpu", None, f"{_cpu_model()} ({cpu})", target="host", capabilities=caps)
