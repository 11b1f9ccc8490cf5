"""Weights in host memory backed by transparent huge pages, for devices that read them in place.

A decode step on the CPU streams every weight from memory once per token, and one core's share of
the memory bandwidth is bounded by how many lines it can have in flight and by its page walks. On
pages of 4 KiB (what a mapped checkpoint gives) the hardware prefetchers stop at every page and the
TLB misses every 64 lines; on 2 MiB pages a core keeps more lines in flight and streams the same
weights faster. The kernel
gives anonymous memory huge pages where it is advised to (``MADV_HUGEPAGE``, the ``madvise`` mode of
``/sys/kernel/mm/transparent_hugepage/enabled`` that most distributions ship), so the weights are
copied once, at load, into one such arena (one pass over the weights). Where transparent huge
pages are off, or ``POOT_HUGE_PAGES=0`` asks so, the arrays mapped from the checkpoint are used as
they are.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

import numpy as np

__all__ = ["HUGE_PAGE", "huge_pages_wanted", "huge_page_copy"]

HUGE_PAGE = 2 << 20
_ALIGN = 64  # each array starts on a cache line


def huge_pages_wanted() -> bool:
    """Whether weights should move to huge pages: ``POOT_HUGE_PAGES=0`` keeps them mapped from the
    checkpoint (for comparison, or where memory is too tight for the copy), and a platform without
    ``MADV_HUGEPAGE`` or with transparent huge pages set to ``never`` has nothing to gain."""
    if os.environ.get("POOT_HUGE_PAGES", "1").strip() in ("0", "no", "off", "false"):
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def huge_page_copy(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays copied into one anonymous mapping advised to use huge pages, each on a 64-byte
    line, read-only, in the order given; their shapes and dtypes as they were. The mapping lives as
    long as any of the returned arrays."""
    offsets: dict[str, int] = {}
    total = 0
    for name, a in arrays.items():
        offsets[name] = total
        total += -(-int(a.nbytes) // _ALIGN) * _ALIGN
    if total == 0:
        return dict(arrays)
    arena = mmap.mmap(
        -1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    )  # private: shared anonymous memory is shmem, whose huge pages are off by default
    raw = np.frombuffer(arena, np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE  # the first huge page boundary: madvise wants page-aligned ranges
    try:
        arena.madvise(mmap.MADV_HUGEPAGE, start, total)
    except (OSError, ValueError):
        pass  # the copy still serves, on small pages
    out: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        src = np.ascontiguousarray(a)
        dst = raw[start + offsets[name] : start + offsets[name] + src.nbytes].view(src.dtype).reshape(src.shape)
        np.copyto(dst, src)
        if type(a) is not np.ndarray:  # a subclass that says what the bytes are (``plan.layouts.LaidOut``) stays one
            dst = dst.view(type(a))
            dst.__dict__.update(a.__dict__)
        dst.flags.writeable = False
        out[name] = dst
    return out
