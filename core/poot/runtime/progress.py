"""Progress of long work (compiling a plan's kernels, reading a long prompt) for people at a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["compile_progress", "prefill_progress"]

T = TypeVar("T")


def compile_progress(items: Iterable[T], enabled: bool, total: int | None = None) -> Iterator[T]:
    """``items`` (a plan's kernels to compile), with a bar on standard error where ``enabled`` and
    standard error is a terminal: a pipe or a log gets no carriage returns. The bar appears only
    after a second, so kernels all found in the cache show nothing."""
    from tqdm import tqdm

    show = enabled and sys.stderr.isatty()
    yield from tqdm(items, total=total, desc="poot: compiling kernels", unit="kernel", disable=not show, leave=False, delay=1.0)


def prefill_progress(total: int, enabled: bool) -> Any:
    """A bar over a prompt's ``total`` tokens as they enter the KV cache (``update`` it with tokens
    done, ``close`` it when the first new token comes): on a terminal only, and only after a second,
    so a short prompt shows nothing."""
    from tqdm import tqdm

    show = enabled and sys.stderr.isatty()
    return tqdm(total=total, desc="poot: reading the prompt", unit="token", disable=not show, leave=False, delay=1.0)
