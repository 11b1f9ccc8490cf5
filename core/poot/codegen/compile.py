"""Compile stages: Kernel IR -> LLVM IR -> optimised LLVM IR -> artifact, in a worker process.

llvmlite's LLVM is built with assertions: a bad module aborts the whole process. So LLVM runs in a
worker process; a worker that dies becomes a typed ``CompileError`` naming the kernel and target,
and the next compile gets a fresh worker. Artifacts are cached on disk by content hash, and every
stage's output can be dumped with ``POOT_DUMP=dir``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import PootError
from ..kernel.ir import Kernel
from .lower import lower_kernel
from .targets import Target, import_ref

__all__ = ["CompileError", "Artifact", "compile_kernel", "compile_kernels", "compile_jobs", "compile_ir", "CODEGEN_VERSION"]

CODEGEN_VERSION = "2"


class CompileError(PootError):
    """LLVM failed (or crashed) on a kernel; names the kernel, the target and what LLVM said."""


@dataclass(frozen=True)
class Artifact:
    kernel: str
    target: str
    kind: str  # object | ptx | code-object | spirv
    data: bytes
    cached: bool = False


def _dump(name: str, stage: str, data: str | bytes) -> None:
    d = os.environ.get("POOT_DUMP")
    if not d:
        return
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    (p / f"{name}.{stage}").write_bytes(data if isinstance(data, bytes) else data.encode())


def compile_ir(ir_text: str, tgt: Target, name: str, loop_vectorize: bool = True) -> tuple[bytes, str]:
    """Run LLVM on ``ir_text`` for ``tgt`` (in this process): (artifact bytes, optimised IR); a
    target with a toolchain of its own (``Target.emit``) gets the IR as lowered. ``loop_vectorize``
    False keeps LLVM's loop vectorizer off (``Kernel.loop_vectorize``)."""
    if tgt.emit:
        try:
            emit = import_ref(tgt.emit)
        except (ImportError, AttributeError) as e:
            raise CompileError(f"target {tgt.key}: its toolchain step {tgt.emit} cannot be loaded ({e}): is its backend installed?") from None
        return emit(ir_text, tgt, name), ir_text
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    if tgt.artifact == "spirv":
        # SimplifyCFG sinks a store that sibling branches make to different buffers into their join,
        # through a phi of the two buffer handles, which LLVM 22's SPIR-V backend cannot select (it
        # asserts). The option is process-wide: this runs in a worker retired after each SPIR-V module.
        llvm.set_option("", "-simplifycfg-sink-common=false")
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    target = llvm.Target.from_triple(tgt.triple)
    tm = target.create_target_machine(cpu=tgt.cpu, features=tgt.features, opt=3, reloc=tgt.reloc, codemodel="default")
    mod.triple = tgt.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = loop_vectorize
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    opt_ir = str(mod)
    if tgt.artifact == "ptx":
        return tm.emit_assembly(mod).encode(), opt_ir
    obj = tm.emit_object(mod)
    if tgt.link:
        try:
            link = import_ref(tgt.link)
        except (ImportError, AttributeError) as e:
            raise CompileError(f"target {tgt.key}: its link step {tgt.link} cannot be loaded ({e}): is its backend installed?") from None
        return link(obj, name), opt_ir
    return obj, opt_ir


class _Worker:
    """A persistent ``python -m poot.codegen.worker`` process, replaced when it dies. (A subprocess
    rather than multiprocessing, so that user scripts need no ``__main__`` guard.)"""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-m", "poot.codegen.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return self._proc

    def retire(self) -> None:
        """End the worker (the next compile starts a fresh one)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.close()  # the worker returns at end of input
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def run(self, ir_text: str, tgt: Target, name: str, loop_vectorize: bool = True) -> tuple[bytes, str]:
        proc = self._start()
        msg = pickle.dumps((ir_text, tgt, name, loop_vectorize))
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(struct.pack("<Q", len(msg)) + msg)
            proc.stdin.flush()
            head = proc.stdout.read(8)
            if len(head) < 8:
                raise EOFError
            (n,) = struct.unpack("<Q", head)
            ok, payload = pickle.loads(proc.stdout.read(n))
        except (EOFError, BrokenPipeError, OSError):
            err = proc.stderr.read().decode(errors="replace")[-1500:] if proc.stderr is not None else ""
            proc.kill()
            self._proc = None
            raise CompileError(
                f"kernel {name}: LLVM crashed compiling for {tgt.key} (the compile worker died). LLVM said: {err.strip() or 'nothing'}"
            ) from None
        if not ok:
            raise CompileError(f"kernel {name}: LLVM rejected the module for {tgt.key}: {payload}")
        return payload


_POOL = _Worker()


def _cache_dir() -> Path:
    from ..load.sources import cache_dir

    return cache_dir() / "kernels"


@functools.cache
def _codegen_source_hash(lowering: str = "", link: str = "", emit: str = "") -> str:
    """Artifacts depend on the stages after LLVM IR too (post-passes, a target's link step): their
    source is in the key, with the kernel-layer helpers the lowering expands (f16 rounding and
    encoding, half widening) and the modules of the target's own lowering and link step."""
    import importlib.util

    h = hashlib.sha256()
    here = Path(__file__).parent
    files = [*sorted(here.glob("*.py")), here.parent / "kernel" / "library" / "elementwise.py", here.parent / "kernel" / "translate.py"]
    for ref in (lowering, link, emit):
        try:
            spec = importlib.util.find_spec(ref.partition(":")[0]) if ref else None
        except (ImportError, ValueError):  # its package is missing: lowering it refuses, naming it
            spec = None
        if spec is not None and spec.origin and spec.origin not in map(str, files):
            files.append(Path(spec.origin))
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class _Pending:
    """A kernel lowered to LLVM IR and missing from the cache: what its compile needs and where its
    artifact is kept."""

    kernel: Kernel
    ir_text: str
    paths: tuple[Path, ...]  # by IR, by kernel (empty: not cached)


def _lookup(k: Kernel, tgt: Target, use_cache: bool) -> Artifact | _Pending:
    """``k``'s artifact from the cache, or the kernel lowered and ready to compile."""
    import llvmlite

    # a dump shows every stage, so it compiles afresh: a cache hit would skip the later ones
    use_cache = use_cache and not os.environ.get("POOT_DUMP")
    stamp = [CODEGEN_VERSION, _codegen_source_hash(tgt.lowering, tgt.link, tgt.emit), llvmlite.__version__, tgt.key, tgt.triple, tgt.features]
    if not k.loop_vectorize:  # (the IR text does not say it)
        stamp.append("no-loop-vectorize")
    # by the kernel itself first (Kernel IR is a deterministic value): a hit skips lowering too
    fast = _cache_dir() / "by-kernel" / (hashlib.sha256("\n".join(stamp + [repr(k)]).encode()).hexdigest() + f".{tgt.artifact}")
    if use_cache and fast.exists():
        return Artifact(k.name, tgt.key, tgt.artifact, fast.read_bytes(), cached=True)
    module = lower_kernel(k, tgt)
    ir_text = str(module)
    _dump(k.name, f"{tgt.name}.ll", ir_text)
    key = hashlib.sha256("\n".join(stamp + [ir_text]).encode()).hexdigest()
    path = _cache_dir() / key[:2] / f"{key}.{tgt.artifact}"
    if use_cache and path.exists():
        data = path.read_bytes()
        _store(fast, data)
        return Artifact(k.name, tgt.key, tgt.artifact, data, cached=True)
    return _Pending(k, ir_text, (path, fast) if use_cache else ())


def _build(job: _Pending, tgt: Target, worker: _Worker) -> Artifact:
    """Compile ``job`` in ``worker`` and keep its artifact in the cache."""
    k = job.kernel
    try:
        data, opt_ir = worker.run(job.ir_text, tgt, k.name, k.loop_vectorize)
    finally:
        if tgt.artifact == "spirv":
            # LLVM 22's SPIR-V backend keeps a block -> label-id table in process-wide state keyed by
            # MachineFunction address; a later module can inherit earlier ids and come out with
            # duplicate labels (about one compile in thirty). Each SPIR-V module gets a fresh worker.
            worker.retire()
    _dump(k.name, f"{tgt.name}.opt.ll", opt_ir)
    _dump(k.name, f"{tgt.name}.{ {'ptx': 'ptx', 'object': 'o', 'code-object': 'hsaco', 'spirv': 'spv'}.get(tgt.artifact, 'bin') }", data)
    for path in job.paths:
        _store(path, data)
    return Artifact(k.name, tgt.key, tgt.artifact, data)


def compile_kernel(k: Kernel, tgt: Target, use_cache: bool = True) -> Artifact:
    """Lower, optimise and emit ``k`` for ``tgt``; a second compile of the same kernel is a cache hit."""
    found = _lookup(k, tgt, use_cache)
    return found if isinstance(found, Artifact) else _build(found, tgt, _POOL)


def compile_jobs() -> int:
    """Compile workers ``compile_kernels`` runs at once: ``POOT_COMPILE_JOBS``, else the CPUs this
    process may run on."""
    env = os.environ.get("POOT_COMPILE_JOBS", "").strip()
    if env:
        try:
            jobs = int(env)
        except ValueError:
            raise PootError(f"POOT_COMPILE_JOBS={env!r}: give a whole number of compile workers (1 or more)") from None
        if jobs < 1:
            raise PootError(f"POOT_COMPILE_JOBS={env!r}: give a whole number of compile workers (1 or more)")
        return jobs
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def compile_kernels(kernels: Sequence[Kernel], tgt: Target, progress: bool = False, jobs: int | None = None) -> list[Artifact]:
    """``compile_kernel`` of each of ``kernels`` (their artifacts in order): cache hits first, then
    the rest in ``jobs`` worker processes at once (``compile_jobs()``), the largest modules first, so
    that a plan's first load waits for its longest compiles side by side rather than one after
    another. ``progress``: a bar on a terminal (``compile_progress``)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from ..runtime.progress import compile_progress

    found = [_lookup(k, tgt, True) for k in kernels]
    todo = sorted((i for i, f in enumerate(found) if isinstance(f, _Pending)), key=lambda i: -len(found[i].ir_text))  # type: ignore[union-attr]
    out: list[Artifact | None] = [f if isinstance(f, Artifact) else None for f in found]
    if not todo:
        return out  # type: ignore[return-value]
    n = max(1, min(jobs or compile_jobs(), len(todo)))
    workers = [_POOL] + [_Worker() for _ in range(n - 1)]
    free = list(workers)

    def one(i: int) -> tuple[int, Artifact]:
        w = free.pop()  # (list.pop and append are atomic: each thread holds one worker at a time)
        try:
            return i, _build(found[i], tgt, w)  # type: ignore[arg-type]
        finally:
            free.append(w)

    try:
        with ThreadPoolExecutor(n) as ex:
            for fut in compile_progress(as_completed([ex.submit(one, i) for i in todo]), progress, len(todo)):
                i, art = fut.result()
                out[i] = art
    finally:
        for w in workers[1:]:
            w.retire()
    return out  # type: ignore[return-value]


def _store(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
