"""The one scheduling loop: a thread that owns the engine. Requests and cancellations arrive through
an inbox; between steps the loop admits new sequences (continuous batching: the engine fits them
into the next step, prompts in chunks, decode tokens first), steps, and hands each event to its
request's callback. A sequence's KV blocks are released the moment it finishes or is cancelled
(a client that disconnects cancels). Nothing a request does can stop the loop: errors go back to
that request only.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..errors import PootError
from ..llm.engine import Engine, Event
from ..llm.params import SamplingParams

__all__ = ["Scheduler", "QueueFull", "ShuttingDown", "Stats"]


class QueueFull(PootError):
    """More requests are waiting than the server accepts (--max-queue)."""


class ShuttingDown(PootError):
    """The server is stopping: it takes no new request."""


@dataclass
class Stats:
    queue_depth: int
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_per_second: float
    ttft_count: int
    ttft_sum: float
    ttft_quantiles: dict[float, float]
    requests_total: int
    tokens_total: int


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int = 256) -> None:
        self.engine, self.max_queue = engine, max_queue
        self._inbox: queue.Queue[tuple] = queue.Queue()
        self._subs: dict[int, tuple[Callable[[Event], None], float, list[bool]]] = {}
        self._pending = 0  # requests accepted, not yet admitted into the engine
        self._request_of: dict[int, int] = {}  # sequence id -> the request (its first sequence's id) it belongs to
        self._lock = threading.Lock()
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self._ttft: collections.deque[float] = collections.deque(maxlen=2048)
        self._ttft_sum, self._ttft_count, self._requests, self._tokens = 0.0, 0, 0, 0
        self._stop = threading.Event()
        self.draining = False  # stopping: new requests are refused, those in flight were ended
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="poot-scheduler", daemon=True)
        self._thread.start()

    # -- called from request handlers ---------------------------------------------------------------
    def submit(
        self, prompts: Sequence[list[int]], params: Sequence[SamplingParams], on_event: Callable[[Event], None], constraints: Sequence[Any] | None = None
    ) -> Future:
        """Queue sequences; the future gives their ids (or the ``ParameterError`` that refused
        them). ``on_event`` runs on the loop thread: it must only hand the event over.
        ``constraints``: the sequences' output constraints compiled already (``Engine.constraints``,
        off this loop), else the engine compiles them as it adds them."""
        if self.draining:
            raise ShuttingDown("the server is shutting down; send the request again to another one, or once it is back")
        with self._lock:
            # requests beyond those the next step admits (its free rows, counted as requests of one sequence)
            free = max(0, self.engine.max_seqs - len(self.engine.running))
            waiting = max(0, self._pending + self._waiting_requests() - free)
            if waiting + 1 > self.max_queue:
                raise QueueFull(f"{waiting} requests are already waiting to run (at most {self.max_queue} may); try again later")
            self._pending += 1
        fut: Future = Future()
        self._inbox.put(("add", list(prompts), list(params), on_event, fut, list(constraints or [None] * len(prompts))))
        return fut

    def _waiting_requests(self) -> int:
        """Requests admitted whose sequences (choices, prompts) have not all started running."""
        return len({self._request_of.get(s.id) for s in list(self.engine.waiting)})

    def cancel(self, seq_ids: Sequence[int]) -> None:
        self._inbox.put(("cancel", list(seq_ids)))

    def drain(self) -> None:
        """The server begins to stop (SIGTERM, Ctrl-C): every request in flight ends now, with an
        error event saying so, so that its handler answers at once instead of being cut off when
        the grace period runs out; new requests are refused. Safe from a signal handler."""
        self.draining = True
        self._inbox.put(("drain",))

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(("stop",))
        self._thread.join(timeout=10)

    # -- the loop -----------------------------------------------------------------------------------
    def _drop(self, seq_id: int) -> tuple[Callable[[Event], None], float, list[bool]] | None:
        """Forget a finished or cancelled sequence: its subscriber (returned) and its request."""
        self._request_of.pop(seq_id, None)
        return self._subs.pop(seq_id, None)

    def _handle(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, prompts, params, cb, fut, compiled = cmd
            ids: list[int] = []
            if not fut.set_running_or_notify_cancel():  # its handler was cancelled meanwhile: nothing waits for it
                with self._lock:
                    self._pending -= 1
                return
            try:
                if self.draining:  # (submitted as the drain began)
                    raise ShuttingDown("the server is shutting down; send the request again to another one, or once it is back")
                for p, sp, c in zip(prompts, params, compiled):
                    ids.append(self.engine.add(p, sp, c))
            except Exception as e:  # noqa: BLE001 - the request is refused, the loop goes on
                for i in ids:
                    self.engine.cancel(i)
                fut.set_exception(e)
            else:
                now = time.perf_counter()
                for i in ids:
                    self._subs[i] = (cb, now, [False])
                    self._request_of[i] = ids[0]
                self._requests += 1
                fut.set_result(ids)
            finally:
                with self._lock:
                    self._pending -= 1
        elif cmd[0] == "drain":
            for s in list(self.engine.running) + list(self.engine.waiting):
                cb = self._drop(s.id)
                self.engine.cancel(s.id)
                if cb is not None:
                    cb[0](Event(s.id, None, "", "shutdown", error="the server is shutting down"))
        elif cmd[0] == "cancel":
            for i in cmd[1]:
                sub = self._drop(i)
                if self.engine.cancel(i) and sub is not None:
                    try:  # the request waiting on it ends too (a handler whose client left must not wait forever)
                        sub[0](Event(i, None, "", "cancelled"))
                    except Exception:  # noqa: BLE001 - a broken subscriber loses its events only
                        pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                block = not self.engine.has_work()
                cmd = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
                self._handle(cmd)
                while True:  # everything that arrived meanwhile, before the next step
                    self._handle(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if self._stop.is_set() or not self.engine.has_work():
                continue
            try:
                events = self.engine.step()
            except Exception as e:  # noqa: BLE001 - a failed step ends its sequences, not the server
                self.error = e
                traceback.print_exc()  # the server's log says what failed, not only /health
                for s in list(self.engine.running) + list(self.engine.waiting):
                    cb = self._drop(s.id)
                    self.engine.cancel(s.id)
                    if cb is not None:
                        cb[0](Event(s.id, None, "", "error", error=f"the step failed: {e}"))
                continue
            self.error = None  # /health: degraded while steps fail, ok again once one succeeds
            now = time.perf_counter()
            n = 0
            for ev in events:
                sub = self._subs.get(ev.seq_id)
                if sub is None:
                    continue
                cb, t0, first = sub
                if ev.token is not None:
                    n += 1
                    if not first[0]:
                        first[0] = True
                        self._ttft.append(now - t0)
                        self._ttft_sum += now - t0
                        self._ttft_count += 1
                if ev.finished is not None:
                    self._drop(ev.seq_id)
                try:
                    cb(ev)
                except Exception:  # noqa: BLE001 - a broken subscriber loses its events only
                    self._drop(ev.seq_id)
                    self.engine.cancel(ev.seq_id)
            self._tokens += n
            self._window.append((now, n))
            while self._window and now - self._window[0][0] > 10.0:
                self._window.popleft()

    # -- metrics ------------------------------------------------------------------------------------
    def stats(self) -> Stats:
        now = time.perf_counter()
        window = [(t, n) for t, n in list(self._window) if now - t <= 10.0]
        span = (now - window[0][0]) if window else 0.0
        tps = sum(n for _, n in window) / span if span > 0 else 0.0
        ttft = sorted(self._ttft)
        q = {p: (ttft[min(len(ttft) - 1, int(p * len(ttft)))] if ttft else 0.0) for p in (0.5, 0.9, 0.99)}
        blocks = self.engine.blocks
        return Stats(
            self._pending + self._waiting_requests(),
            len(self.engine.running),
            blocks.num_blocks - blocks.free_blocks,
            blocks.num_blocks,
            tps,
            self._ttft_count,
            self._ttft_sum,
            q,
            self._requests,
            self._tokens,
        )
