"""An AMD GPU as the ROCm executor uses it (``executor.Agent``): device memory and transfers
through hip-python; code objects, kernarg memory, the AQL queue and signals through the HSA runtime
(``hsa``). HIP device ``index`` is matched to the HSA GPU agent of the same place in the runtime's
agent order, checked by its gfx name."""

from __future__ import annotations

from typing import Any

import numpy as np

from poot.errors import DeviceUnavailable, PootError

from .aql import AqlRing
from .hsa import DEVICE_TYPE_CPU, DEVICE_TYPE_GPU, Hsa, HsaQueueMemory

__all__ = ["HsaAgent", "HipError"]


class HipError(PootError):
    """A HIP call failed: the call and HIP's error name."""


def _hip() -> Any:
    try:
        from hip import hip
    except ImportError as e:
        raise DeviceUnavailable(f"hip-python is not importable ({e}); pip install hip-python") from None
    return hip


class HsaAgent:
    """HIP device ``index`` and its HSA agent."""

    def __init__(self, index: int) -> None:
        self.hip = hip = _hip()
        self._check("hipSetDevice", hip.hipSetDevice(index))
        props = hip.hipDeviceProp_t()
        self._check("hipGetDeviceProperties", hip.hipGetDeviceProperties(props, index))
        arch = props.gcnArchName
        self.arch = (arch.decode() if isinstance(arch, bytes) else str(arch)).split(":", 1)[0]
        self.apu = bool(props.integrated)
        self.hsa = Hsa()
        try:
            agents = self.hsa.agents()
            gpus = [a for a in agents if a[1] == DEVICE_TYPE_GPU]
            cpus = [a for a in agents if a[1] == DEVICE_TYPE_CPU]
            if index >= len(gpus) or not cpus:
                raise DeviceUnavailable(f"rocm:{index}: the HSA runtime lists {len(gpus)} GPU agents and {len(cpus)} host agents")
            self.gpu, _, name = gpus[index]
            if name != self.arch:
                raise DeviceUnavailable(f"rocm:{index}: HIP calls it {self.arch} but HSA GPU agent {index} is {name} (set HIP_VISIBLE_DEVICES to none or all)")
            self._kernarg_pool = self.hsa.kernarg_pool(cpus[0][0])
        except BaseException:
            self.hsa.close()
            raise
        self._executables: list[tuple[int, int]] = []
        self._signals: set[int] = set()
        self._queues: list[Any] = []

    def _check(self, call: str, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.hip.hipError_t.hipSuccess:
            raise HipError(f"{call} failed: {getattr(err, 'name', err)}")
        return rest[0] if len(rest) == 1 else rest

    # memory
    def alloc(self, nbytes: int) -> int:
        return int(self._check("hipMalloc", self.hip.hipMalloc(max(nbytes, 1))))

    def free(self, ptr: int) -> None:
        self._check("hipFree", self.hip.hipFree(ptr))

    def upload(self, ptr: int, data: np.ndarray) -> None:
        a = np.ascontiguousarray(data)
        if a.nbytes:
            self._check("hipMemcpyHtoD", self.hip.hipMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))

    def download(self, ptr: int, out: np.ndarray) -> None:
        if out.nbytes:
            self._check("hipMemcpyDtoH", self.hip.hipMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))

    def kernarg(self, nbytes: int) -> tuple[int, np.ndarray]:
        import ctypes

        ptr = self.hsa.pool_allocate(self._kernarg_pool, nbytes, self.gpu)
        return ptr, np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))

    def free_kernarg(self, ptr: int) -> None:
        self.hsa.pool_free(ptr)

    # code objects
    def load(self, code_object: bytes, kernel: Any) -> int:
        exe, reader, kobj = self.hsa.load(self.gpu, code_object, f"{kernel.name}.kd")
        self._executables.append((exe, reader))
        return kobj

    # queue and signals
    def queue(self, slots: int) -> AqlRing:
        q = self.hsa.queue(self.gpu, slots)
        self._queues.append(q)
        # ROCr places the ring in host-coherent system memory: no fence before the doorbell
        return AqlRing(HsaQueueMemory(self.hsa, q), int(q.contents.size), in_device_memory=False, apu=self.apu)

    def signal(self, value: int) -> int:
        s = self.hsa.signal(value)
        self._signals.add(s)
        return s

    def store_signal(self, signal: int, value: int) -> None:
        self.hsa.lib.hsa_signal_store_screlease(signal, value)

    def wait(self, signal: int, timeout: float) -> None:
        if self.hsa.wait_below_one(signal, int(timeout * 1e9)) >= 1:
            raise PootError(f"{self.arch}: a step did not finish in {timeout:.0f} s (a hung GPU? see dmesg and rocm-smi)")

    def destroy_signal(self, signal: int) -> None:
        self._signals.discard(signal)
        self.hsa.lib.hsa_signal_destroy(signal)

    def close(self) -> None:
        if not getattr(self.hsa, "open", False):
            return
        for q in self._queues:
            self.hsa.lib.hsa_queue_destroy(q)
        for s in self._signals:
            self.hsa.lib.hsa_signal_destroy(s)
        for exe, reader in self._executables:
            self.hsa.unload(exe, reader)
        self._queues, self._signals, self._executables = [], set(), []
        self.hsa.close()
