"""Progress of long work (compiling a plan's kernels) for people at a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["compile_progress"]

T = TypeVar("T")


def compile_progress(items: Iterable[T], enabled: bool, total: int | None = None) -> Iterator[T]:
    """``items`` (a plan's kernels to compile), with a bar on standard error where ``enabled`` and
    standard error is a terminal: a pipe or a log gets no carriage returns. The bar appears only
    after a second, so kernels all found in the cache show nothing."""
    from tqdm import tqdm

    show = enabled and sys.stderr.isatty()
    yield from tqdm(items, total=total, desc="poot: compiling kernels", unit="kernel", disable=not show, leave=False, delay=1.0)
