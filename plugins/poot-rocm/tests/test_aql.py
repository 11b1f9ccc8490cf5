"""AQL packets and the queue ring, checked without an AMD GPU: every field of the encoded
``hsa_kernel_dispatch_packet_t`` against the HSA specification's layout (written out again here, as
a ctypes structure), the header's bit positions, and the order in which replay publishes packets
(body, header with release, write index, fence where the ring is in device memory, doorbell) on a
memory that records every store."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from poot.errors import DeviceUnavailable
from poot_rocm.aql import PACKET_BYTES, AqlRing, DispatchPacket, barriers, encode


class HsaKernelDispatchPacket(ctypes.LittleEndianStructure):
    """hsa_kernel_dispatch_packet_t (HSA Platform System Architecture Specification 1.2, 2.9.6)."""

    _fields_ = [
        ("header", ctypes.c_uint16),
        ("setup", ctypes.c_uint16),
        ("workgroup_size_x", ctypes.c_uint16),
        ("workgroup_size_y", ctypes.c_uint16),
        ("workgroup_size_z", ctypes.c_uint16),
        ("reserved0", ctypes.c_uint16),
        ("grid_size_x", ctypes.c_uint32),
        ("grid_size_y", ctypes.c_uint32),
        ("grid_size_z", ctypes.c_uint32),
        ("private_segment_size", ctypes.c_uint32),
        ("group_segment_size", ctypes.c_uint32),
        ("kernel_object", ctypes.c_uint64),
        ("kernarg_address", ctypes.c_uint64),
        ("reserved2", ctypes.c_uint64),
        ("completion_signal", ctypes.c_uint64),
    ]


# the specification's byte offsets of each field
OFFSETS = {
    "header": 0,
    "setup": 2,
    "workgroup_size_x": 4,
    "workgroup_size_y": 6,
    "workgroup_size_z": 8,
    "reserved0": 10,
    "grid_size_x": 12,
    "grid_size_y": 16,
    "grid_size_z": 20,
    "private_segment_size": 24,
    "group_segment_size": 28,
    "kernel_object": 32,
    "kernarg_address": 40,
    "reserved2": 48,
    "completion_signal": 56,
}


def _random_packet(rng: np.random.Generator, dims: int = 3, barrier: bool = True) -> DispatchPacket:
    wg = (int(rng.choice([64, 128, 256])), 1, 1) if dims == 1 else (int(rng.choice([8, 16])), int(rng.choice([2, 4])), 2 if dims == 3 else 1)
    groups = [int(rng.integers(2, 5000)), int(rng.integers(2, 300)) if dims > 1 else 1, int(rng.integers(2, 9)) if dims > 2 else 1]
    return DispatchPacket(
        wg,
        tuple(g * w for g, w in zip(groups, wg)),  # type: ignore[arg-type]
        int(rng.integers(0, 1 << 16)),
        int(rng.integers(0, 64 * 1024)),
        int(rng.integers(1, 1 << 40)) * 64,
        int(rng.integers(1, 1 << 40)) * 16,
        int(rng.integers(1, 1 << 62)),
        barrier,
        int(rng.integers(0, 3)),
        int(rng.integers(0, 3)),
    )


def test_the_ctypes_layout_is_the_specifications():
    assert ctypes.sizeof(HsaKernelDispatchPacket) == PACKET_BYTES == 64
    assert {name: getattr(HsaKernelDispatchPacket, name).offset for name in OFFSETS} == OFFSETS


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_every_field_is_where_the_specification_puts_it(rng, dims):
    for _ in range(20):
        p = _random_packet(rng, dims, barrier=bool(rng.integers(0, 2)))
        raw = encode(p)
        assert len(raw) == 64
        got = HsaKernelDispatchPacket.from_buffer_copy(raw)
        assert (got.workgroup_size_x, got.workgroup_size_y, got.workgroup_size_z) == p.workgroup
        assert (got.grid_size_x, got.grid_size_y, got.grid_size_z) == p.grid
        assert (got.private_segment_size, got.group_segment_size) == (p.private_bytes, p.group_bytes)
        assert (got.kernel_object, got.kernarg_address, got.completion_signal) == (p.kernel_object, p.kernarg, p.completion_signal)
        assert got.reserved0 == 0 and got.reserved2 == 0
        assert got.setup & 0b11 == dims and got.setup >> 2 == 0  # dimensions in bits 0-1, the rest reserved
        # header: type in bits 0-7 (2: kernel dispatch), barrier bit 8, acquire scope bits 9-10, release 11-12
        assert got.header & 0xFF == 2
        assert (got.header >> 8) & 1 == p.barrier
        assert (got.header >> 9) & 0b11 == p.acquire and (got.header >> 11) & 0b11 == p.release and got.header >> 13 == 0


def test_a_system_scoped_dispatch_has_the_headers_known_value():
    """Type 2 with system-scope acquire and release is 0x1402 (5122), as HSA runtimes write it; with
    the barrier bit, 0x1502."""
    p = DispatchPacket((64, 1, 1), (64, 1, 1), 0, 0, 64, 16, barrier=False)
    assert int.from_bytes(encode(p)[:4], "little") == 0x1402 | 1 << 16  # setup: one dimension
    assert encode(DispatchPacket((64, 1, 1), (64, 1, 1), 0, 0, 64, 16))[:2] == (0x1502).to_bytes(2, "little")


def test_packets_that_cannot_be_launched_are_refused():
    with pytest.raises(ValueError, match="whole workgroups"):
        DispatchPacket((64, 1, 1), (100, 1, 1), 0, 0, 64, 16)
    with pytest.raises(ValueError, match="1 to 1024 work-items"):
        DispatchPacket((64, 32, 1), (64, 32, 1), 0, 0, 64, 16)
    with pytest.raises(ValueError, match="64-byte aligned"):
        DispatchPacket((64, 1, 1), (64, 1, 1), 0, 0, 96, 16)
    with pytest.raises(ValueError, match="16-byte aligned"):
        DispatchPacket((64, 1, 1), (64, 1, 1), 0, 0, 64, 8)


class RecordingRing:
    """Ring memory that records every store in order, holds the ring's bytes, and consumes packets
    when told to (as a packet processor would: a slot it consumed is INVALID again)."""

    def __init__(self, slots: int) -> None:
        self.bytes = bytearray(slots * 64)
        self.events: list[tuple] = []
        self.consumed = 0
        for s in range(slots):  # slots start INVALID (type 1)
            self.bytes[s * 64 : s * 64 + 2] = (1).to_bytes(2, "little")

    def write(self, offset: int, data: bytes) -> None:
        assert int.from_bytes(self.bytes[offset - offset % 64 : offset - offset % 64 + 2], "little") == 1, "a body written into a live slot"
        self.bytes[offset : offset + len(data)] = data
        self.events.append(("write", offset, len(data)))

    def store_release_u32(self, offset: int, value: int) -> None:
        self.bytes[offset : offset + 4] = value.to_bytes(4, "little")
        self.events.append(("header", offset))

    def store_write_index(self, index: int) -> None:
        self.events.append(("write_index", index))

    def read_index(self) -> int:
        return self.consumed

    def store_fence(self) -> None:
        self.events.append(("fence",))

    def ring_doorbell(self, index: int) -> None:
        self.events.append(("doorbell", index))

    def consume(self, n: int, slots: int) -> None:
        for i in range(self.consumed, self.consumed + n):
            at = (i % slots) * 64
            self.bytes[at : at + 2] = (1).to_bytes(2, "little")
        self.consumed += n


@pytest.mark.parametrize("device_memory", [False, True])
def test_replay_publishes_body_then_header_then_index_fence_and_doorbell(rng, device_memory):
    slots = 4
    mem = RecordingRing(slots)
    ring = AqlRing(mem, slots, in_device_memory=device_memory)
    first = [encode(_random_packet(rng)) for _ in range(3)]
    assert ring.publish(first) == 2
    for i, raw in enumerate(first):
        assert bytes(mem.bytes[i * 64 : i * 64 + 64]) == raw
    fence = [("fence",)] if device_memory else []
    assert mem.events == [
        ("write", 4, 60),
        ("header", 0),
        ("write", 68, 60),
        ("header", 64),
        ("write", 132, 60),
        ("header", 128),
        ("write_index", 3),
        *fence,
        ("doorbell", 2),
    ]
    # the next step wraps around the ring into the slots the processor has consumed
    mem.consume(3, slots)
    mem.events.clear()
    second = [encode(_random_packet(rng)) for _ in range(3)]
    assert ring.publish(second) == 5
    assert [e for e in mem.events if e[0] == "header"] == [("header", 192), ("header", 0), ("header", 64)]
    assert mem.events[-1] == ("doorbell", 5) and mem.events[-2 - len(fence)] == ("write_index", 6)
    assert bytes(mem.bytes[192:256]) == second[0] and bytes(mem.bytes[0:64]) == second[1]
    # more packets than free slots: refused, nothing written
    mem.events.clear()
    with pytest.raises(RuntimeError, match="free slots"):
        ring.publish([encode(_random_packet(rng)) for _ in range(2)])
    assert mem.events == []


def test_an_integrated_gpu_refuses_a_ring_in_device_memory():
    with pytest.raises(DeviceUnavailable, match="integrated GPU"):
        AqlRing(RecordingRing(8), 8, in_device_memory=True, apu=True)
    AqlRing(RecordingRing(8), 8, in_device_memory=False, apu=True)  # a host-coherent ring serves it
    with pytest.raises(ValueError, match="power of two"):
        AqlRing(RecordingRing(6), 6)


def _conflict(a: tuple[list, list], b: tuple[list, list]) -> bool:
    """Two launches conflict where one writes bytes the other reads or writes (the oracle, by pairs)."""

    def over(x, y):  # type: ignore[no-untyped-def]
        return x[0] == y[0] and max(x[1], y[1]) < min(x[2], y[2])

    return any(over(w, r) for w in a[1] for r in b[0] + b[1]) or any(over(w, r) for w in b[1] for r in a[0])


def test_barriers_order_exactly_the_launches_that_touch_each_others_bytes(rng):
    """Random steps of launches reading and writing byte ranges of a few memories: between two
    barriers no two launches conflict (so they may run at once), and every barrier is needed (its
    launch conflicts with one since the last barrier)."""
    for _ in range(300):
        n = int(rng.integers(1, 12))
        steps = []
        for _ in range(n):

            def ranges(k: int) -> list:
                out = []
                for _ in range(k):
                    start = int(rng.integers(0, 256))
                    out.append((str(rng.choice(["arena", "arena", "pool", "x"])), start, start + int(rng.integers(1, 64))))
                return out

            steps.append((ranges(int(rng.integers(0, 4))), ranges(int(rng.integers(0, 3)))))
        bits = barriers(steps)
        assert len(bits) == n and bits[0]
        start = 0
        for i in range(n):
            if bits[i]:
                if i:
                    assert any(_conflict(steps[j], steps[i]) for j in range(start, i)), (i, steps)
                start = i
            else:
                assert not any(_conflict(steps[j], steps[i]) for j in range(start, i)), (i, steps)
    # a dead value's bytes reused by a later one: the later write waits for the read
    assert barriers([([("arena", 0, 64)], [("arena", 64, 128)]), ([("x", 0, 8)], [("arena", 0, 32)])]) == [True, True]
    # two products of one x into separate outputs run together
    assert barriers([([("arena", 0, 64)], [("arena", 64, 96)]), ([("arena", 0, 64)], [("arena", 96, 128)])]) == [True, False]
