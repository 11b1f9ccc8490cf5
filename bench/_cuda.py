"""What the GPU kernel benchmarks share: cuda:0 opened through poot-ptx, and the CUDA-event timing of
launches queued back to back (so the host's launch time stays out of a kernel's)."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any


def open_cuda0() -> tuple[Any, Any] | None:
    """(cuda:0's device, a CudaContext on it), or None after saying on stderr why it is unavailable."""
    from poot.runtime import get_device
    from poot_ptx.runtime import CudaContext

    dev = get_device("cuda:0")
    if not dev.available():
        print(f"cuda:0 is unavailable: {dev.available()}", file=sys.stderr)
        return None
    return dev, CudaContext(dev.index)


def median_seconds(ctx: Any, run: Callable[[], None], repeat: int, batch: int, warm: int) -> float:
    """Seconds one ``run()`` (its launches) takes on the GPU: the median of ``repeat`` timings after
    ``warm`` untimed ones, each timing the mean of ``batch`` runs queued between two CUDA events."""
    from poot_ptx.runtime import _check

    d = ctx.driver
    start, end = (_check(d, "cuEventCreate", d.cuEventCreate(0)) for _ in range(2))
    times = []
    for _ in range(repeat + warm):
        _check(d, "cuEventRecord", d.cuEventRecord(start, 0))
        for _ in range(batch):
            run()
        _check(d, "cuEventRecord", d.cuEventRecord(end, 0))
        _check(d, "cuEventSynchronize", d.cuEventSynchronize(end))
        times.append(_check(d, "cuEventElapsedTime", d.cuEventElapsedTime(start, end)) / 1e3 / batch)
    d.cuEventDestroy(start)
    d.cuEventDestroy(end)
    return statistics.median(times[warm:])
