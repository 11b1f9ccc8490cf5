"""llama.cpp's own CUDA build as a benchmark peer: built once from its source (the tree inside
llama-cpp-python's sdist, or a tarball of it) with cmake and ninja for one GPU architecture, then
``llama-bench`` (prefill of ``pp`` tokens, decode of ``tg``, flash attention on, every layer on the
GPU) and ``llama-batched-bench`` (``npl`` sequences decoding at once after 128-token prompts) run on
a GGUF file. ``bench/gpu_llama8b.py --vs-llamacpp SRC`` uses it on the files it writes.

    python bench/llamacpp_cuda.py build SRC [--dir /tmp/llamacpp-cuda] [--arch 90a]
    python bench/llamacpp_cuda.py run MODEL.gguf [--dir ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

__all__ = ["build", "llama_bench", "batched_bench", "version"]

DEFAULT_DIR = Path("/tmp/llamacpp-cuda")
TARGETS = ("llama-bench", "llama-batched-bench")


def say(msg: str) -> None:
    print(f"llama.cpp: {msg}", file=sys.stderr, flush=True)


def _source(src: Path, into: Path) -> Path:
    """The llama.cpp tree: ``src`` itself, the one inside an sdist folder, or unpacked from a tarball."""
    if src.is_dir():
        for cand in (src, src / "vendor" / "llama.cpp"):
            if (cand / "ggml" / "CMakeLists.txt").exists():
                return cand
        raise SystemExit(f"{src}: no llama.cpp tree (ggml/CMakeLists.txt) there or in vendor/llama.cpp")
    out = into / "src"
    if not (out / ".unpacked").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        with tarfile.open(src) as t:
            t.extractall(out, filter="data")
        (out / ".unpacked").touch()
    found = [p.parent.parent for p in out.glob("**/ggml/CMakeLists.txt")]
    if not found:
        raise SystemExit(f"{src}: no llama.cpp tree inside")
    return min(found, key=lambda p: len(p.parts))


def build(src: Path, into: Path = DEFAULT_DIR, arch: str = "90a", jobs: int | None = None) -> Path:
    """``llama-bench`` and ``llama-batched-bench`` built for CUDA architecture ``arch`` under
    ``into`` (once: a second call finds them, after waiting while a file ``building`` there says
    another process is building them); their folder."""
    bindir = into / "build" / "bin"
    if (into / "building").exists():  # a build under way in another process (scripts/gpu-check's, detached)
        say(f"waiting for the build under way in {into}")
        while (into / "building").exists():
            time.sleep(5)
    if all((bindir / t).exists() for t in TARGETS):
        return bindir
    into.mkdir(parents=True, exist_ok=True)
    (into / "building").touch()
    try:
        _build(src, into, arch, jobs)
    finally:
        (into / "building").unlink(missing_ok=True)
    return bindir


def _build(src: Path, into: Path, arch: str, jobs: int | None) -> None:
    tree = _source(src, into)
    for tool in ("cmake", "ninja", "nvcc"):
        if shutil.which(tool) is None and not (tool == "nvcc" and Path("/usr/local/cuda/bin/nvcc").exists()):
            raise SystemExit(f"building llama.cpp for CUDA needs {tool} on PATH")
    env = dict(os.environ)
    if shutil.which("nvcc") is None:
        env["PATH"] = "/usr/local/cuda/bin:" + env["PATH"]
    t0 = time.perf_counter()
    say(f"configuring {tree} for sm_{arch}")
    subprocess.run(
        [
            "cmake",
            "-S",
            str(tree),
            "-B",
            str(into / "build"),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_CUDA=ON",
            f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    say("building llama-bench and llama-batched-bench (several minutes)")
    subprocess.run(
        ["cmake", "--build", str(into / "build"), "--target", *TARGETS, "-j", str(jobs or os.cpu_count() or 4)], check=True, env=env, stdout=subprocess.DEVNULL
    )
    say(f"built in {time.perf_counter() - t0:.0f} s")


def version(bindir: Path) -> str:
    """llama.cpp's build (``version: 7123 (abcdef0)``, as its tools print it)."""
    out = subprocess.run([str(bindir / "llama-bench"), "--version"], capture_output=True, text=True)
    lines = [line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip().startswith("version")]
    return lines[0].removeprefix("version:").strip() if lines else "unknown"


def llama_bench(bindir: Path, model: Path, pp: int = 2048, tg: int = 128, reps: int = 3) -> dict[str, float]:
    """llama-bench's prefill of ``pp`` tokens and decode of ``tg`` (tok/s, its average over ``reps``)."""
    cmd = [str(bindir / "llama-bench"), "-m", str(model), "-ngl", "99", "-fa", "1", "-r", str(reps), "-o", "json"]
    cmd += ["-p", str(pp), "-n", "0"] if pp else ["-p", "0"]
    out: dict[str, float] = {}
    if pp:
        rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        out["prefill"] = float(rows[0]["avg_ts"])
    cmd = [str(bindir / "llama-bench"), "-m", str(model), "-ngl", "99", "-fa", "1", "-r", str(reps), "-o", "json", "-p", "0", "-n", str(tg)]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    out["decode_b1"] = float(rows[0]["avg_ts"])
    return out


def batched_bench(bindir: Path, model: Path, batches: list[int], npp: int = 128, ntg: int = 128) -> dict[int, float]:
    """llama-batched-bench: decode tok/s (all sequences together) with ``b`` sequences of ``npp``
    prompt tokens each generating ``ntg``, for each ``b`` in ``batches``."""
    ctx = (npp + ntg) * max(batches) + 256
    cmd = [str(bindir / "llama-batched-bench"), "-m", str(model), "-ngl", "99", "-fa", "on", "-c", str(ctx), "-b", "2048", "-ub", "512"]
    cmd += ["-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, batches)), "--output-format", "jsonl"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = {}
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            out[int(row["pl"])] = float(row["speed_tg"])
    missing = [b for b in batches if b not in out]
    if missing:
        raise RuntimeError(f"llama-batched-bench gave no row for batches {missing}: {r.stderr[-500:]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("src", type=Path)
    b.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    b.add_argument("--arch", default="90a")
    b.add_argument("--jobs", type=int, help="parallel compile jobs (default: every core)")
    r = sub.add_parser("run")
    r.add_argument("model", type=Path)
    r.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    r.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    args = ap.parse_args()
    if args.cmd == "build":
        print(build(args.src, args.dir, args.arch, args.jobs))
        return
    bindir = args.dir / "build" / "bin"
    res = {"version": version(bindir), **llama_bench(bindir, args.model), "batched": batched_bench(bindir, args.model, args.batches)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
