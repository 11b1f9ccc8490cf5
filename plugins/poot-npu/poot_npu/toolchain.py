"""The AIE toolchain: AMD's Peano (llvm-aie), an LLVM with the AIE backends that upstream LLVM (and
so llvmlite) does not have. It is not on PyPI or in Debian; it is found through
``PEANO_INSTALL_DIR`` (its release's root: ``bin/clang``, ``bin/ld.lld``) or a ``clang`` on PATH
that lists an AIE target. Where it is absent the AIE stages refuse with ``ToolchainMissing``, which
names what to install; every stage before them runs without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from poot.errors import Refusal

__all__ = ["Toolchain", "ToolchainMissing", "find_toolchain", "emit_core_object", "INSTALL"]

INSTALL = (
    "install AMD's Peano (llvm-aie; its releases at https://github.com/Xilinx/llvm-aie, e.g. "
    "pip install llvm-aie -f https://github.com/Xilinx/llvm-aie/releases/expanded_assets/nightly) "
    "and set PEANO_INSTALL_DIR to its root"
)


class ToolchainMissing(Refusal):
    """The AIE stage cannot run: no AIE toolchain here."""

    def __init__(self, stage: str, why: str) -> None:
        super().__init__(stage, "aie", f"{why}: {INSTALL}")


@dataclass(frozen=True)
class Toolchain:
    clang: str
    lld: str
    version: str


def _version(clang: str) -> str:
    try:
        out = subprocess.run([clang, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.splitlines()[0] if out else ""


def _has_aie(clang: str) -> bool:
    try:
        out = subprocess.run([clang, "--print-targets"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.strip().startswith("aie") for line in out.splitlines())


def find_toolchain() -> Toolchain | None:
    """Peano from ``PEANO_INSTALL_DIR``, else a ``clang`` on PATH with an AIE target; None where neither."""
    root = os.environ.get("PEANO_INSTALL_DIR")
    candidates = [str(Path(root) / "bin" / "clang")] if root else []
    path = shutil.which("clang")
    if path:
        candidates.append(path)
    for clang in candidates:
        if os.access(clang, os.X_OK) and _has_aie(clang):
            lld = str(Path(clang).with_name("ld.lld"))
            return Toolchain(clang, lld if os.access(lld, os.X_OK) else "", _version(clang))
    return None


def require_toolchain(stage: str) -> Toolchain:
    tc = find_toolchain()
    if tc is None:
        where = (
            f"PEANO_INSTALL_DIR={os.environ['PEANO_INSTALL_DIR']} has no bin/clang with an AIE target"
            if os.environ.get("PEANO_INSTALL_DIR")
            else "no PEANO_INSTALL_DIR, and no clang on PATH lists an AIE target"
        )
        raise ToolchainMissing(stage, where)
    return tc


def emit_core_object(ir_text: str, tgt, name: str) -> bytes:  # type: ignore[no-untyped-def]
    """``Target.emit`` of the AIE targets: the looped kernel's LLVM IR compiled by Peano's clang for
    the target's triple into an ELF object for one AIE core."""
    tc = require_toolchain(f"the AIE core object of kernel {name}")
    with tempfile.TemporaryDirectory() as d:
        src, obj = Path(d) / "k.ll", Path(d) / "k.o"
        src.write_text(ir_text)
        r = subprocess.run([tc.clang, "-O2", f"--target={tgt.triple}", "-c", str(src), "-o", str(obj)], capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise Refusal(f"kernel {name}", tgt.key, f"Peano's clang failed: {r.stderr.strip()[-800:]}")
        return obj.read_bytes()
