"""AQL kernel-dispatch packets and the queue ring a step is replayed through.

A captured step is a list of ``DispatchPacket``s encoded once (``encode``: the 64-byte
``hsa_kernel_dispatch_packet_t`` of the HSA Platform System Architecture specification, 1.2, section
2.9). Replay publishes them into the queue's ring (``AqlRing.publish``) in the order the packet
processor requires: each packet's body (bytes 4..63) first, then its header and setup (bytes 0..3)
as one 32-bit store with release semantics (the processor treats a slot whose header is still INVALID as not yet
written), then the queue's write index, then, where the ring lives in device memory (a discrete
GPU's ring placed in VRAM for lower latency), a store fence so the body and header reach the device
before the doorbell, and last the doorbell signal with the index of the last packet.

The ring's memory is behind ``RingMemory``: the HSA runtime's queue on a GPU, and in tests a memory
that records every store, so the order is checked without one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from poot.errors import DeviceUnavailable

__all__ = [
    "PACKET_BYTES",
    "PACKET_TYPE_INVALID",
    "PACKET_TYPE_KERNEL_DISPATCH",
    "FENCE_SCOPE_NONE",
    "FENCE_SCOPE_AGENT",
    "FENCE_SCOPE_SYSTEM",
    "DispatchPacket",
    "header",
    "encode",
    "RingMemory",
    "AqlRing",
    "barriers",
]

PACKET_BYTES = 64
# hsa_packet_type_t
PACKET_TYPE_INVALID = 1
PACKET_TYPE_KERNEL_DISPATCH = 2
# hsa_fence_scope_t
FENCE_SCOPE_NONE, FENCE_SCOPE_AGENT, FENCE_SCOPE_SYSTEM = 0, 1, 2
# hsa_packet_header_t: bit offsets of the header's fields
_TYPE_SHIFT, _BARRIER_SHIFT, _ACQUIRE_SHIFT, _RELEASE_SHIFT = 0, 8, 9, 11
# the body after the 16-bit header: setup, workgroup x/y/z, reserved, grid x/y/z, private and group
# segment bytes, kernel object, kernarg address, reserved, completion signal
_BODY = struct.Struct("<HHHHHIIIIIQQQQ")


def header(packet_type: int, barrier: bool, acquire: int, release: int) -> int:
    """The 16-bit AQL packet header: type, barrier bit (wait for every earlier packet of the queue),
    acquire and release fence scopes."""
    if not 0 <= packet_type < 256 or not (0 <= acquire <= 2 and 0 <= release <= 2):
        raise ValueError(f"packet type {packet_type} or fence scopes {acquire}/{release} out of range")
    return packet_type << _TYPE_SHIFT | int(barrier) << _BARRIER_SHIFT | acquire << _ACQUIRE_SHIFT | release << _RELEASE_SHIFT


@dataclass(frozen=True)
class DispatchPacket:
    """One kernel launch as the packet processor takes it. ``grid`` counts work-items (workgroups
    times ``workgroup``), as HSA's grid size does; ``kernel_object`` is the address of the kernel's
    descriptor in the loaded code object; ``kernarg`` the address of its arguments, filled at capture;
    ``barrier``: the launch waits for the one before it (it reads what that one writes)."""

    workgroup: tuple[int, int, int]
    grid: tuple[int, int, int]
    private_bytes: int
    group_bytes: int
    kernel_object: int
    kernarg: int
    completion_signal: int = 0
    barrier: bool = True
    acquire: int = FENCE_SCOPE_SYSTEM
    release: int = FENCE_SCOPE_SYSTEM

    def __post_init__(self) -> None:
        if any(not 1 <= w <= 1024 for w in self.workgroup) or self.workgroup[0] * self.workgroup[1] * self.workgroup[2] > 1024:
            raise ValueError(f"workgroup {self.workgroup}: 1 to 1024 work-items")
        if any(not 1 <= g < 1 << 32 for g in self.grid) or any(g % w for g, w in zip(self.grid, self.workgroup)):
            raise ValueError(f"grid {self.grid} must be whole workgroups of {self.workgroup}, each size below 2^32")
        if self.kernel_object % 64:
            raise ValueError(f"kernel descriptor at {self.kernel_object:#x}: descriptors are 64-byte aligned")
        if self.kernarg % 16:
            raise ValueError(f"kernel arguments at {self.kernarg:#x}: the kernarg segment is 16-byte aligned")

    @property
    def dimensions(self) -> int:
        """The grid's dimensions (the setup field): 1 to 3, the last one of size above 1."""
        return 3 if self.grid[2] > 1 else 2 if self.grid[1] > 1 else 1

    @property
    def header(self) -> int:
        return header(PACKET_TYPE_KERNEL_DISPATCH, self.barrier, self.acquire, self.release)


def encode(p: DispatchPacket) -> bytes:
    """``p`` as the 64 bytes of ``hsa_kernel_dispatch_packet_t``, little-endian, header included."""
    body = _BODY.pack(p.dimensions, *p.workgroup, 0, *p.grid, p.private_bytes, p.group_bytes, p.kernel_object, p.kernarg, 0, p.completion_signal)
    return struct.pack("<H", p.header) + body


class RingMemory(Protocol):
    """Where a queue's ring lives and how its stores reach the packet processor."""

    def write(self, offset: int, data: bytes) -> None:
        """Plain stores of ``data`` at byte ``offset`` of the ring."""

    def store_release_u32(self, offset: int, value: int) -> None:
        """One 32-bit store with release semantics: every earlier store is visible before it."""

    def store_write_index(self, index: int) -> None:
        """The queue's write index (packets ever written), with release semantics."""

    def read_index(self) -> int:
        """Packets the processor has consumed (its slots may be written again)."""

    def store_fence(self) -> None:
        """A fence ordering every earlier store to device memory before later stores (sfence)."""

    def ring_doorbell(self, index: int) -> None:
        """The doorbell signal: ``index`` (the last packet's) is ready."""


class AqlRing:
    """A queue of ``slots`` packet slots (a power of two) in ``memory``. ``in_device_memory``: the ring
    lives in the GPU's memory (a discrete GPU's VRAM), so publication fences before the doorbell; an
    integrated GPU (``apu``) has no such memory and refuses that ring."""

    def __init__(self, memory: RingMemory, slots: int, in_device_memory: bool = False, apu: bool = False) -> None:
        if slots < 1 or slots & (slots - 1):
            raise ValueError(f"an AQL ring has a power of two of slots, got {slots}")
        if in_device_memory and apu:
            raise DeviceUnavailable(
                "an integrated GPU (APU) shares the host's memory: its AQL ring cannot be placed in device memory (use a host-coherent ring)"
            )
        self.memory, self.slots, self.in_device_memory = memory, slots, in_device_memory
        self.write_index = 0

    def free(self) -> int:
        """Slots the packet processor has released for new packets."""
        return self.slots - (self.write_index - self.memory.read_index())

    def publish(self, packets: list[bytes]) -> int:
        """Publish encoded packets (``encode``) in order and ring the doorbell once; returns the
        index of the last. Raises RuntimeError where the ring has too few free slots: a step longer
        than the ring is split by its caller."""
        if not packets:
            return self.write_index - 1
        free = self.free()
        if len(packets) > free:
            raise RuntimeError(f"{len(packets)} packets for {free} free slots of an AQL ring of {self.slots}")
        for raw in packets:
            if len(raw) != PACKET_BYTES:
                raise ValueError(f"an AQL packet is {PACKET_BYTES} bytes, got {len(raw)}")
            at = (self.write_index % self.slots) * PACKET_BYTES
            self.memory.write(at + 4, raw[4:])  # the body, past header and setup
            self.memory.store_release_u32(at, int.from_bytes(raw[:4], "little"))  # then header + setup, released
            self.write_index += 1
        self.memory.store_write_index(self.write_index)
        if self.in_device_memory:
            self.memory.store_fence()
        self.memory.ring_doorbell(self.write_index - 1)
        return self.write_index - 1


Range = tuple[object, int, int]  # (memory it lies in: the arena, a bound buffer..., first byte, end)


def _overlap(a: Range, b: Range) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def barriers(accesses: list[tuple[list[Range], list[Range]]]) -> list[bool]:
    """Which launches of a step need the barrier bit, from each launch's (reads, writes) byte
    ranges: packets between two barriers may run at once, so a launch waits for all before it where
    it reads what one of them writes, writes what one of them reads or writes (ranges, not values:
    the arena gives a dead value's bytes to a later one). The first launch always waits (for what
    the step's inputs and the step before left)."""
    out: list[bool] = []
    group_reads: list[Range] = []
    group_writes: list[Range] = []
    for reads, writes in accesses:
        conflict = (
            not out or any(_overlap(r, w) for r in reads for w in group_writes) or any(_overlap(w, x) for w in writes for x in group_writes + group_reads)
        )
        if conflict:
            group_reads, group_writes = [], []
        out.append(conflict)
        group_reads += reads
        group_writes += writes
    return out
