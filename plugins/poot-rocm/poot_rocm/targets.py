"""The AMDGCN targets this backend brings (``poot_targets``; facts: shared/TARGETS.md): code
objects (v5) for gfx90a and gfx942 (CDNA 2 and 3, wave64), gfx1100, gfx1151 and gfx1201 (RDNA 3,
3.5 and 4, wave32), lowered by ``lowering.AmdgpuLowering`` and linked by
ld.lld (``link_code_object``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from poot.backend import CompileError, Target

__all__ = ["TARGETS", "find_lld", "link_code_object"]


def _amdgcn(arch: str, wave: int) -> Target:
    return Target(
        "amdgcn",
        "amdgcn-amd-amdhsa",
        arch,
        "",
        1,
        3,
        wave,
        1024,
        64 * 1024,
        "code-object",
        (),  # MFMA / WMMA: no lowering yet
        lowering="poot_rocm.lowering:AmdgpuLowering",
        link="poot_rocm.targets:link_code_object",
        reloc="pic",
    )


TARGETS: dict[str, Target] = {
    "amdgcn:gfx90a": _amdgcn("gfx90a", 64),
    "amdgcn:gfx942": _amdgcn("gfx942", 64),
    "amdgcn:gfx1100": _amdgcn("gfx1100", 32),
    "amdgcn:gfx1151": _amdgcn("gfx1151", 32),  # RDNA 3.5 (Strix Halo, an APU)
    "amdgcn:gfx1201": _amdgcn("gfx1201", 32),  # RDNA 4
}


def find_lld() -> list[str] | None:
    """An ld.lld that links AMDGPU code object v5 (LLVM 20+): Debian's lld-22, or PyPI's ziglang."""
    for exe in ("ld.lld-22", "ld.lld"):
        path = shutil.which(exe)
        if path:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            if any(f"LLD {v}." in out for v in range(20, 40)):
                return [path]
    try:
        import ziglang  # noqa: F401

        return [sys.executable, "-m", "ziglang", "ld.lld"]
    except ImportError:
        return None


def link_code_object(obj: bytes, name: str) -> bytes:
    """The relocatable object LLVM emitted, linked into a loadable code object."""
    lld = find_lld()
    if lld is None:
        raise CompileError(f"kernel {name}: linking an AMDGPU code object needs ld.lld from LLVM 20+ (apt install lld-22, or pip install ziglang)")
    with tempfile.TemporaryDirectory() as d:
        o, so = Path(d) / "k.o", Path(d) / "k.hsaco"
        o.write_bytes(obj)
        r = subprocess.run(lld + ["-shared", str(o), "-o", str(so)], capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise CompileError(f"kernel {name}: ld.lld failed: {r.stderr.strip()[-500:]}")
        return so.read_bytes()
