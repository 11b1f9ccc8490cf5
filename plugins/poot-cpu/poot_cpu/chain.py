"""A captured step on the host: a table of launches run by one native function on every thread.

Each record names a kernel's packed entry (``<kernel>_packed(i64* args, i32 start, i32 stop)``),
its argument slots and its number of workgroups. ``poot_chain`` walks the table: every thread takes
its share of each launch's workgroups, and threads meet at a spinning barrier where a launch reads
what the one before wrote. So replaying a step is one native call per thread, with no Python work
per kernel; ctypes releases the GIL for the call, so the threads run in parallel.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence

import llvmlite.binding as llvm
import numpy as np

__all__ = ["RECORD", "NativeChain", "ThreadTeam"]

# fn, args, workgroups, flags (bit 0: barrier after this launch)
RECORD = np.dtype([("fn", np.int64), ("args", np.int64), ("total", np.int32), ("flags", np.int32)])
BARRIER_AFTER = 1

_CHAIN_IR = r"""
%rec = type {{ i64, i64, i32, i32 }}

define internal void @poot_barrier(ptr %bar, i32 %nth) {{
entry:
  %genp = getelementptr i32, ptr %bar, i32 16
  %g = load atomic i32, ptr %genp acquire, align 4
  %c = atomicrmw add ptr %bar, i32 1 acq_rel
  %lastc = sub i32 %nth, 1
  %last = icmp eq i32 %c, %lastc
  br i1 %last, label %release, label %spin
release:
  store atomic i32 0, ptr %bar monotonic, align 4
  %old = atomicrmw add ptr %genp, i32 1 release
  ret void
spin:
  {pause}
  %g2 = load atomic i32, ptr %genp acquire, align 4
  %same = icmp eq i32 %g2, %g
  br i1 %same, label %spin, label %out
out:
  ret void
}}

; this thread's share of record %r's workgroups (lo..hi of its total, split evenly by thread)
define internal void @poot_run_share(ptr %r, i64 %tid64, i64 %nth64) alwaysinline {{
entry:
  %fnp = getelementptr %rec, ptr %r, i32 0, i32 0
  %fni = load i64, ptr %fnp
  %fn = inttoptr i64 %fni to ptr
  %argp = getelementptr %rec, ptr %r, i32 0, i32 1
  %argi = load i64, ptr %argp
  %args = inttoptr i64 %argi to ptr
  %totp = getelementptr %rec, ptr %r, i32 0, i32 2
  %tot = load i32, ptr %totp
  %tot64 = sext i32 %tot to i64
  %lo0 = mul i64 %tot64, %tid64
  %lo = sdiv i64 %lo0, %nth64
  %tid1 = add i64 %tid64, 1
  %hi0 = mul i64 %tot64, %tid1
  %hi = sdiv i64 %hi0, %nth64
  %lo32 = trunc i64 %lo to i32
  %hi32 = trunc i64 %hi to i32
  %any = icmp slt i32 %lo32, %hi32
  br i1 %any, label %call, label %out
call:
  call void %fn(ptr %args, i32 %lo32, i32 %hi32)
  br label %out
out:
  ret void
}}

define void @poot_chain(ptr %recs, i32 %first, i32 %stop, i32 %tid, i32 %nth, ptr %bar) {{
entry:
  %multi = icmp sgt i32 %nth, 1
  %tid64 = sext i32 %tid to i64
  %nth64 = sext i32 %nth to i64
  br label %head
head:
  %i = phi i32 [ %first, %entry ], [ %i1, %next ]
  %more = icmp slt i32 %i, %stop
  br i1 %more, label %body, label %done
body:
  %r = getelementptr %rec, ptr %recs, i32 %i
  call void @poot_run_share(ptr %r, i64 %tid64, i64 %nth64)
  %flp = getelementptr %rec, ptr %r, i32 0, i32 3
  %fl = load i32, ptr %flp
  %bit = and i32 %fl, 1
  %wants = icmp ne i32 %bit, 0
  %sync = and i1 %wants, %multi
  br i1 %sync, label %wait, label %next
wait:
  call void @poot_barrier(ptr %bar, i32 %nth)
  br label %next
next:
  %i1 = add i32 %i, 1
  br label %head
done:
  ret void
}}

; the same walk for profiling: every thread meets before the first launch and after each one, and
; thread 0 reads the clock (``clock(clock_id, timespec*)``, clock_gettime) at each meeting into
; ``stamps``: two i64 words (seconds, nanoseconds) per meeting, so a launch's time is its own
define void @poot_chain_timed(ptr %recs, i32 %first, i32 %stop, i32 %tid, i32 %nth, ptr %bar, ptr %stamps, ptr %clock, i32 %clock_id) {{
entry:
  %multi = icmp sgt i32 %nth, 1
  %lead = icmp eq i32 %tid, 0
  %tid64 = sext i32 %tid to i64
  %nth64 = sext i32 %nth to i64
  br i1 %multi, label %meet0, label %stamp0
meet0:
  call void @poot_barrier(ptr %bar, i32 %nth)
  br label %stamp0
stamp0:
  br i1 %lead, label %tick0, label %head
tick0:
  %c0 = call i32 %clock(i32 %clock_id, ptr %stamps)
  br label %head
head:
  %i = phi i32 [ %first, %stamp0 ], [ %first, %tick0 ], [ %i1, %next ]
  %more = icmp slt i32 %i, %stop
  br i1 %more, label %body, label %done
body:
  %r = getelementptr %rec, ptr %recs, i32 %i
  call void @poot_run_share(ptr %r, i64 %tid64, i64 %nth64)
  br i1 %multi, label %meet, label %stamp
meet:
  call void @poot_barrier(ptr %bar, i32 %nth)
  br label %stamp
stamp:
  %i1 = add i32 %i, 1
  br i1 %lead, label %tick, label %next
tick:
  %k = sub i32 %i1, %first
  %k2 = mul i32 %k, 2
  %sp = getelementptr i64, ptr %stamps, i32 %k2
  %c = call i32 %clock(i32 %clock_id, ptr %sp)
  br label %next
next:
  br label %head
done:
  ret void
}}
{decl}
"""


class NativeChain:
    """The dispatcher, compiled for this process: ``run(records, tid, nth, barrier, first, stop)``."""

    def __init__(self) -> None:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        x86 = llvm.get_process_triple().startswith(("x86_64", "i686"))
        text = _CHAIN_IR.format(pause="call void @llvm.x86.sse2.pause()" if x86 else "", decl="declare void @llvm.x86.sse2.pause()" if x86 else "")
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
        mod = llvm.parse_assembly(text)
        mod.verify()
        self._engine = llvm.create_mcjit_compiler(mod, tm)
        self._engine.finalize_object()
        addr = self._engine.get_function_address("poot_chain")
        args = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
        self._fn = ctypes.CFUNCTYPE(None, *args)(addr)
        timed = self._engine.get_function_address("poot_chain_timed")
        self._timed = ctypes.CFUNCTYPE(None, *args, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(timed)
        libc = ctypes.CDLL(None)
        self._clock = ctypes.cast(libc.clock_gettime, ctypes.c_void_p).value if hasattr(libc, "clock_gettime") else None

    def run(self, records: np.ndarray, tid: int, nth: int, barrier: np.ndarray, first: int = 0, stop: int | None = None) -> None:
        self._fn(records.ctypes.data, first, len(records) if stop is None else stop, tid, nth, barrier.ctypes.data)

    def run_timed(self, records: np.ndarray, tid: int, nth: int, barrier: np.ndarray, first: int, stop: int, stamps: np.ndarray) -> None:
        """``run`` with every thread meeting after each launch, thread 0 writing the monotonic
        clock into ``stamps`` (int64, 2 x (stop - first + 1): seconds and nanoseconds) at each meeting."""
        if self._clock is None:
            raise OSError("this C library has no clock_gettime: launches cannot be timed")
        self._timed(records.ctypes.data, first, stop, tid, nth, barrier.ctypes.data, stamps.ctypes.data, self._clock, time.CLOCK_MONOTONIC)


class ThreadTeam:
    """``threads`` workers (the caller's thread is worker 0) that run a chain together. The extra
    threads persist between steps and wait on semaphores in between."""

    def __init__(self, chain: NativeChain, threads: int) -> None:
        self.chain, self.threads = chain, max(1, threads)
        self.barrier = np.zeros(32, np.int32)  # count and generation on separate cache lines
        self._go = [threading.Semaphore(0) for _ in range(self.threads - 1)]
        self._done = threading.Semaphore(0)
        self._job: tuple[np.ndarray, int, int, np.ndarray | None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._workers = [threading.Thread(target=self._work, args=(t,), name=f"poot-cpu-{t}", daemon=True) for t in range(1, self.threads)]
        for w in self._workers:
            w.start()

    def _work(self, tid: int) -> None:
        while True:
            self._go[tid - 1].acquire()
            if self._closed or self._job is None:
                return
            recs, first, stop, stamps = self._job
            try:
                if stamps is None:
                    self.chain.run(recs, tid, self.threads, self.barrier, first, stop)
                else:
                    self.chain.run_timed(recs, tid, self.threads, self.barrier, first, stop, stamps)
            except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
                self._error = e
            finally:
                self._done.release()

    def run(self, records: np.ndarray, first: int = 0, stop: int | None = None) -> None:
        self._run(records, first, len(records) if stop is None else stop, None)

    def run_timed(self, records: np.ndarray, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Run the launches ``first..stop`` once, the threads meeting after each; seconds per launch."""
        stop = len(records) if stop is None else stop
        stamps = np.zeros((stop - first + 1, 2), np.int64)
        self._run(records, first, stop, stamps)
        t = stamps[:, 0].astype(np.float64) + stamps[:, 1] * 1e-9
        return np.diff(t)

    def _run(self, records: np.ndarray, first: int, stop: int, stamps: np.ndarray | None) -> None:
        self._job = (records, first, stop, stamps)
        for g in self._go:
            g.release()
        if stamps is None:
            self.chain.run(records, 0, self.threads, self.barrier, first, stop)
        else:
            self.chain.run_timed(records, 0, self.threads, self.barrier, first, stop, stamps)
        for _ in self._go:
            self._done.acquire()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for g in self._go:
            g.release()
        for w in self._workers:
            w.join(timeout=5)


def records_table(entries: Sequence[tuple[int, int, int, bool]]) -> np.ndarray:
    """A record table from (fn address, args address, workgroups, barrier after)."""
    recs = np.zeros(len(entries), RECORD)
    for i, (fn, args, total, bar) in enumerate(entries):
        recs[i] = (fn, args, total, BARRIER_AFTER if bar else 0)
    return recs
