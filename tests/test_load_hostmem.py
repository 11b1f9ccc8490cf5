"""Weights copied into huge-page host memory: the same values, read-only, on cache lines, and backed
by transparent huge pages where the kernel offers them."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from poot.load.hostmem import HUGE_PAGE, huge_page_copy, huge_pages_wanted


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no AnonHugePages line")


def test_copies_keep_values_shapes_and_types(rng):
    arrays = {
        "a": rng.standard_normal((37, 5)).astype(np.float32),
        "q": rng.integers(0, 256, 1001, dtype=np.uint8),
        "h": rng.integers(0, 2**16, (3, 7), dtype=np.uint16),  # bf16 bits
        "empty": np.zeros((0, 4), np.float32),
    }
    out = huge_page_copy(arrays)
    assert list(out) == list(arrays)
    for name, a in arrays.items():
        b = out[name]
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(b, a)
        assert not b.flags.writeable
        if b.size:
            assert b.ctypes.data % 64 == 0
            assert not np.shares_memory(a, b)
    with pytest.raises(ValueError):
        out["a"][0, 0] = 1.0


def test_switch_off_by_environment(monkeypatch):
    monkeypatch.setenv("POOT_HUGE_PAGES", "0")
    assert not huge_pages_wanted()


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists() or not hasattr(mmap, "MADV_HUGEPAGE"), reason="needs Linux's smaps_rollup and MADV_HUGEPAGE")
def test_large_weights_land_on_huge_pages(rng, monkeypatch):
    monkeypatch.delenv("POOT_HUGE_PAGES", raising=False)
    if not huge_pages_wanted():
        pytest.skip("transparent huge pages are off on this machine (/sys/kernel/mm/transparent_hugepage/enabled)")
    before = _anon_huge_kib()
    w = rng.integers(0, 256, 8 * HUGE_PAGE, dtype=np.uint8)
    out = huge_page_copy({"w": w})
    gained = _anon_huge_kib() - before
    np.testing.assert_array_equal(out["w"], w)
    assert gained >= 4 * HUGE_PAGE // 1024, f"{gained} KiB of huge pages for a copy of {w.nbytes // 1024} KiB"
