"""A simulated AMD GPU for the executor's tests: the agent side of ``poot_rocm.executor.Agent`` in
host memory, with a packet processor that reads the AQL ring as bytes.

No AMD GPU is reachable here, so what the executor hands a GPU is checked by something that takes
it as a GPU would and runs it: device memory is host arrays at made-up addresses (filled with 0xFF,
so a value never written reads as NaN); a loaded code object is its descriptor at an address; the
doorbell makes the processor read each new slot of the ring, decode the packet with offsets written
here from the HSA specification (not with ``poot_rocm.aql``), find the kernel by its descriptor
address, read every argument out of kernarg memory at the offsets of the code object's metadata,
and run the kernel's IR compiled for the host over the packet's grid. Packets between two barrier
bits run last to first, so a missing barrier bit shows as wrong logits; the last packet's
completion signal is decremented as the GPU does, and ``wait`` fails where it never is.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import replace

import numpy as np
import pytest

from poot.backend import Buffer, Device, HostKernel, Kernel, compile_kernel, get_device, host_target
from poot.backend import dtypes as dt
from poot_rocm.aql import AqlRing
from poot_rocm.code_object import read_code_object

BASE = 1 << 40
DESCRIPTORS = 1 << 36


class SimulatedRing:
    """The queue's ring memory: stores land in ``data``; every call is logged in order."""

    def __init__(self, agent: SimulatedAgent, slots: int) -> None:
        self.agent, self.slots = agent, slots
        self.data = bytearray(slots * 64)
        for i in range(slots):
            self.data[i * 64 : i * 64 + 2] = struct.pack("<H", 1)  # INVALID
        self.log: list[tuple] = []
        self.read = 0
        self.written = 0

    def write(self, offset: int, data: bytes) -> None:
        self.data[offset : offset + len(data)] = data
        self.log.append(("write", offset, len(data)))

    def store_release_u32(self, offset: int, value: int) -> None:
        self.data[offset : offset + 4] = struct.pack("<I", value)
        self.log.append(("header", offset))

    def store_write_index(self, index: int) -> None:
        self.written = index
        self.log.append(("index", index))

    def read_index(self) -> int:
        return self.read

    def store_fence(self) -> None:
        self.log.append(("fence",))

    def ring_doorbell(self, index: int) -> None:
        self.log.append(("doorbell", index))
        assert index == self.written - 1, "the doorbell names a packet other than the last written"
        packets = []
        for i in range(self.read, index + 1):
            at = (i % self.slots) * 64
            packets.append(decode(bytes(self.data[at : at + 64])))
            self.data[at : at + 2] = struct.pack("<H", 1)  # consumed: INVALID again
        self.agent.process(packets)
        self.read = index + 1


def decode(raw: bytes) -> dict:
    """An ``hsa_kernel_dispatch_packet_t`` (HSA PSA 1.2, 2.9.6) field by field."""
    (hdr,) = struct.unpack_from("<H", raw, 0)
    return {
        "type": hdr & 0xFF,
        "barrier": hdr >> 8 & 1,
        "acquire": hdr >> 9 & 3,
        "release": hdr >> 11 & 3,
        "dims": struct.unpack_from("<H", raw, 2)[0],
        "workgroup": struct.unpack_from("<HHH", raw, 4),
        "grid": struct.unpack_from("<III", raw, 12),
        "private": struct.unpack_from("<I", raw, 24)[0],
        "group": struct.unpack_from("<I", raw, 28)[0],
        "kernel_object": struct.unpack_from("<Q", raw, 32)[0],
        "kernarg": struct.unpack_from("<Q", raw, 40)[0],
        "signal": struct.unpack_from("<Q", raw, 56)[0],
    }


class SimulatedAgent:
    def __init__(self, arch: str = "gfx942", execute: bool = True) -> None:
        self.arch, self.execute = arch, execute
        self.memory: dict[int, np.ndarray] = {}
        self.kernargs: set[int] = set()
        self.top = BASE
        self.kernels: dict[int, tuple[Kernel, object]] = {}
        self.host: dict[int, HostKernel] = {}
        self.signals: dict[int, int] = {}
        self.rings: list[SimulatedRing] = []
        self.ran: list[dict] = []  # every packet processed, in the order it ran
        self.closed = False

    # memory
    def alloc(self, nbytes: int) -> int:
        base = self.top
        self.top += -(-nbytes // 4096) * 4096 + 4096  # a gap: an access past the end finds no allocation
        self.memory[base] = np.full(nbytes, 0xFF, np.uint8)
        return base

    def free(self, ptr: int) -> None:
        del self.memory[ptr]

    def find(self, ptr: int, nbytes: int = 1) -> tuple[np.ndarray, int]:
        bases = sorted(self.memory)
        i = bisect.bisect_right(bases, ptr) - 1
        assert i >= 0, f"address {ptr:#x} lies in no allocation"
        a = self.memory[bases[i]]
        assert ptr - bases[i] + nbytes <= a.nbytes, f"{nbytes} bytes at {ptr:#x} run past an allocation of {a.nbytes}"
        return a, ptr - bases[i]

    def upload(self, ptr: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        a, off = self.find(ptr, raw.nbytes)
        a[off : off + raw.nbytes] = raw

    def download(self, ptr: int, out: np.ndarray) -> None:
        raw = out.reshape(-1).view(np.uint8)
        a, off = self.find(ptr, raw.nbytes)
        raw[:] = a[off : off + raw.nbytes]

    def kernarg(self, nbytes: int) -> tuple[int, np.ndarray]:
        ptr = self.alloc(nbytes)
        self.kernargs.add(ptr)
        return ptr, self.memory[ptr]

    def free_kernarg(self, ptr: int) -> None:
        self.kernargs.remove(ptr)
        self.free(ptr)

    # code objects
    def load(self, code_object: bytes, kernel: Kernel) -> int:
        info = read_code_object(code_object, kernel.name)[kernel.name]
        kobj = DESCRIPTORS + 64 * len(self.kernels)
        self.kernels[kobj] = (kernel, info)
        return kobj

    # queue and signals
    def queue(self, slots: int) -> AqlRing:
        ring = SimulatedRing(self, slots)
        self.rings.append(ring)
        return AqlRing(ring, slots)

    def signal(self, value: int) -> int:
        handle = 0x5000 + 64 * len(self.signals)
        self.signals[handle] = value
        return handle

    def store_signal(self, signal: int, value: int) -> None:
        self.signals[signal] = value

    def wait(self, signal: int, timeout: float) -> None:
        assert self.signals[signal] < 1, "the completion signal was never decremented: no packet carried it"

    def destroy_signal(self, signal: int) -> None:
        del self.signals[signal]

    def close(self) -> None:
        self.closed = True

    # the packet processor
    def process(self, packets: list[dict]) -> None:
        groups: list[list[dict]] = []
        for p in packets:
            assert p["type"] == 2, f"packet type {p['type']} is not a kernel dispatch"
            if p["barrier"] or not groups:
                groups.append([])
            groups[-1].append(p)
        for group in groups:
            for p in reversed(group):  # no barrier between them: any order may happen; this one exposes a missing bit
                self.run(p)
                self.ran.append(p)
                if p["signal"]:
                    self.signals[p["signal"]] -= 1

    def run(self, p: dict) -> None:
        assert p["kernel_object"] in self.kernels, f"kernel object {p['kernel_object']:#x} was never loaded"
        kernel, info = self.kernels[p["kernel_object"]]
        assert p["workgroup"] == (kernel.threads, 1, 1) and p["dims"] in (1, 2, 3)
        assert p["group"] >= info.group_bytes and p["private"] >= info.private_bytes
        groups = tuple(g // w for g, w in zip(p["grid"], p["workgroup"]))
        block, off = self.find(p["kernarg"], info.kernarg_size)
        assert any(block is self.memory[k] for k in self.kernargs), "kernel arguments outside kernarg memory"
        raw = block[off : off + info.kernarg_size].tobytes()
        params = {q.name: q for q in kernel.params}
        buffers, scalars = {}, {}
        for a in info.args:
            q = params[a.name]
            if isinstance(q, Buffer):
                (ptr,) = struct.unpack_from("<Q", raw, a.offset)
                mem, at = self.find(ptr)
                want = np.dtype(np.uint8 if q.dtype == dt.boolean else np.uint16 if q.dtype == dt.bf16 else q.dtype.numpy)
                n = (mem.nbytes - at) // want.itemsize
                buffers[a.name] = mem[at : at + n * want.itemsize].view(want)
            else:
                code = {"f32": "<f", "i32": "<i", "i64": "<q", "f64": "<d"}[q.dtype.name]
                (scalars[a.name],) = struct.unpack_from(code, raw, a.offset)
        if not self.execute:
            return
        hk = self.host.get(p["kernel_object"])
        if hk is None:
            hk = self.host[p["kernel_object"]] = HostKernel(kernel, compile_kernel(kernel, host_target()))
        hk.run(groups, buffers, scalars, threads=1)


def simulated_device(arch: str) -> Device:
    """``null:ARCH``'s capabilities without subgroup operations (the host runs a workgroup's
    threads as loops, one lane a subgroup), as a rocm device: plans whose kernels the simulated
    GPU can run."""
    null = get_device(f"null:{arch}")
    caps = replace(null.capabilities, subgroup_ops=False, details=(("arch", arch),))
    return Device("rocm", 0, f"simulated {arch}", target="amdgcn", capabilities=caps)


@pytest.fixture
def sim():
    """The simulated GPU and its devices (``SimulatedAgent``, ``simulated_device``)."""
    from types import SimpleNamespace

    return SimpleNamespace(SimulatedAgent=SimulatedAgent, simulated_device=simulated_device)
