"""The HSA runtime binding where no AMD GPU is: the real ROCr library (Debian's
libhsa-runtime64-1 in CI) loads, every entry point the executor binds resolves, and ``hsa_init``'s
failure comes back typed with the runtime's own status string; ``hsa_queue_t``'s layout is the
header's; the host store fence is an ``sfence``."""

from __future__ import annotations

import ctypes
import os
import platform

import pytest

from poot.errors import DeviceUnavailable
from poot_rocm import hsa


@pytest.mark.skipif(hsa.find_library() is None, reason="no libhsa-runtime64 here (apt install libhsa-runtime64-1)")
@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has an AMD GPU driver: hsa_init may succeed")
def test_the_runtime_binds_every_entry_point_and_reports_why_it_cannot_start():
    with pytest.raises(DeviceUnavailable, match=r"hsa_init failed: HSA_STATUS_ERROR_\w+: .*/dev/kfd") as e:
        hsa.Hsa()
    assert "lacks" not in str(e.value)  # every entry point resolved before hsa_init ran
    lib = ctypes.CDLL(hsa.find_library())
    for name in hsa._SIGNATURES:
        assert getattr(lib, name, None) is not None, name


def test_no_runtime_is_a_typed_reason(monkeypatch):
    monkeypatch.setattr(hsa, "find_library", lambda: None)
    with pytest.raises(DeviceUnavailable, match="libhsa-runtime64.*install ROCm"):
        hsa.Hsa()
    with pytest.raises(DeviceUnavailable, match="does not load"):
        hsa.Hsa("/nonexistent/libhsa-runtime64.so.1")


def test_queue_struct_is_the_headers_hsa_queue_t():
    """hsa.h (large model): type u32 @0, features u32 @4, base_address @8, doorbell_signal @16,
    size u32 @24, reserved1 u32 @28, id u64 @32; 40 bytes."""
    q = hsa.QueueStruct
    assert [(f, getattr(q, f).offset, getattr(q, f).size) for f, _ in q._fields_] == [
        ("type", 0, 4),
        ("features", 4, 4),
        ("base_address", 8, 8),
        ("doorbell_signal", 16, 8),
        ("size", 24, 4),
        ("reserved1", 28, 4),
        ("id", 32, 8),
    ]
    assert ctypes.sizeof(q) == 40


def test_ring_stores_land_in_the_queues_ring():
    """The body and the released header of a slot written through ``HsaQueueMemory`` land at the
    ring address the queue struct gives."""
    ring = (ctypes.c_uint8 * 128)()
    q = hsa.QueueStruct(base_address=ctypes.addressof(ring), size=2)
    mem = hsa.HsaQueueMemory(None, ctypes.pointer(q))  # type: ignore[arg-type]
    mem.write(64 + 4, bytes(range(60)))
    mem.store_release_u32(64, 0x0003_1502)
    assert bytes(ring[68:128]) == bytes(range(60)) and bytes(ring[64:68]) == (0x0003_1502).to_bytes(4, "little") and not any(ring[:64])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the sfence check is x86-64's")
def test_the_store_fence_is_an_sfence_and_runs():
    fence = hsa.HostFence()
    assert "\tsfence" in fence.assembly
    fence()
