"""The HSA runtime (ROCr, ``libhsa-runtime64``) through ctypes: what an AQL executor needs that HIP
does not expose. HIP launches through its own queues and hides a loaded kernel's descriptor
address, which a dispatch packet must carry; so code objects are loaded, the queue created, its
ring written, and signals waited on here, through the runtime's documented C API (``hsa.h``,
``hsa_ext_amd.h``). Device memory and transfers stay with hip-python (``runtime``): HIP's
allocations are the same runtime's memory, valid in any packet of the same GPU.

Every failing call raises ``HsaError`` naming the call and the runtime's own status string.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import Any

from poot.errors import DeviceUnavailable, PootError

__all__ = ["Hsa", "HsaError", "HsaQueueMemory", "QueueStruct", "find_library", "HostFence"]

# hsa_agent_info_t, hsa_device_type_t
AGENT_INFO_NAME, AGENT_INFO_DEVICE = 0, 17
DEVICE_TYPE_CPU, DEVICE_TYPE_GPU = 0, 1
# hsa_amd_memory_pool_info_t, hsa_amd_segment_t, hsa_amd_memory_pool_global_flag_t
POOL_INFO_SEGMENT, POOL_INFO_GLOBAL_FLAGS = 0, 1
SEGMENT_GLOBAL = 0
FLAG_KERNARG_INIT = 1
# hsa_queue_type_t, hsa_signal_condition_t, hsa_wait_state_t
QUEUE_TYPE_SINGLE = 1
CONDITION_LT = 2
WAIT_STATE_BLOCKED = 0
# hsa_profile_t, hsa_default_float_rounding_mode_t, hsa_executable_symbol_info_t
PROFILE_FULL = 1
ROUNDING_DEFAULT = 0
SYMBOL_INFO_KERNEL_OBJECT = 22
STATUS_INFO_BREAK = 0x1  # what an iteration callback returns to stop early
UINT32_MAX = 0xFFFFFFFF


class QueueStruct(ctypes.Structure):
    """``hsa_queue_t`` (large model): the ring's address, its doorbell signal and size in packets."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("base_address", ctypes.c_uint64),
        ("doorbell_signal", ctypes.c_uint64),
        ("size", ctypes.c_uint32),
        ("reserved1", ctypes.c_uint32),
        ("id", ctypes.c_uint64),
    ]


class HsaError(PootError):
    """An HSA runtime call failed: ``call`` and the runtime's status."""

    def __init__(self, call: str, status: int, text: str) -> None:
        super().__init__(f"{call} failed: {text} (status {status:#x})")
        self.call, self.status = call, status


def find_library() -> str | None:
    """``libhsa-runtime64``: under ``ROCM_PATH`` (or /opt/rocm), else wherever the loader finds it."""
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root:
            for name in ("libhsa-runtime64.so.1", "libhsa-runtime64.so"):
                p = Path(root) / "lib" / name
                if p.exists():
                    return str(p)
    return ctypes.util.find_library("hsa-runtime64")


_CALLBACK_AGENT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p)
_CALLBACK_POOL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p)

# name -> (result type, argument types); hsa_agent_t, hsa_signal_t and the other handles are
# structs of one uint64, passed and returned as one
_U64, _U32, _I64, _P = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int64, ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "hsa_init": (ctypes.c_int, []),
    "hsa_shut_down": (ctypes.c_int, []),
    "hsa_status_string": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
    "hsa_iterate_agents": (ctypes.c_int, [_CALLBACK_AGENT, _P]),
    "hsa_agent_get_info": (ctypes.c_int, [_U64, ctypes.c_int, _P]),
    "hsa_amd_agent_iterate_memory_pools": (ctypes.c_int, [_U64, _CALLBACK_POOL, _P]),
    "hsa_amd_memory_pool_get_info": (ctypes.c_int, [_U64, ctypes.c_int, _P]),
    "hsa_amd_memory_pool_allocate": (ctypes.c_int, [_U64, ctypes.c_size_t, _U32, ctypes.POINTER(_P)]),
    "hsa_amd_memory_pool_free": (ctypes.c_int, [_P]),
    "hsa_amd_agents_allow_access": (ctypes.c_int, [_U32, ctypes.POINTER(_U64), ctypes.POINTER(_U32), _P]),
    "hsa_queue_create": (ctypes.c_int, [_U64, _U32, _U32, _P, _P, _U32, _U32, ctypes.POINTER(ctypes.POINTER(QueueStruct))]),
    "hsa_queue_destroy": (ctypes.c_int, [ctypes.POINTER(QueueStruct)]),
    "hsa_queue_load_read_index_scacquire": (_U64, [ctypes.POINTER(QueueStruct)]),
    "hsa_queue_store_write_index_screlease": (None, [ctypes.POINTER(QueueStruct), _U64]),
    "hsa_signal_create": (ctypes.c_int, [_I64, _U32, _P, ctypes.POINTER(_U64)]),
    "hsa_signal_destroy": (ctypes.c_int, [_U64]),
    "hsa_signal_store_screlease": (None, [_U64, _I64]),
    "hsa_signal_store_relaxed": (None, [_U64, _I64]),
    "hsa_signal_wait_scacquire": (_I64, [_U64, ctypes.c_int, _I64, _U64, ctypes.c_int]),
    "hsa_code_object_reader_create_from_memory": (ctypes.c_int, [_P, ctypes.c_size_t, ctypes.POINTER(_U64)]),
    "hsa_code_object_reader_destroy": (ctypes.c_int, [_U64]),
    "hsa_executable_create_alt": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_U64)]),
    "hsa_executable_load_agent_code_object": (ctypes.c_int, [_U64, _U64, _U64, ctypes.c_char_p, _P]),
    "hsa_executable_freeze": (ctypes.c_int, [_U64, ctypes.c_char_p]),
    "hsa_executable_destroy": (ctypes.c_int, [_U64]),
    "hsa_executable_get_symbol_by_name": (ctypes.c_int, [_U64, ctypes.c_char_p, ctypes.POINTER(_U64), ctypes.POINTER(_U64)]),
    "hsa_executable_symbol_get_info": (ctypes.c_int, [_U64, ctypes.c_int, _P]),
}


class Hsa:
    """The HSA runtime, initialised (``hsa_init``) for as long as this object is open."""

    def __init__(self, path: str | None = None) -> None:
        path = path or find_library()
        if path is None:
            raise DeviceUnavailable("the HSA runtime (libhsa-runtime64) is not installed: install ROCm (it ships with HIP)")
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise DeviceUnavailable(f"the HSA runtime at {path} does not load: {e}") from None
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise DeviceUnavailable(f"the HSA runtime at {path} lacks {name}: ROCm 5.0 or newer is needed")
            fn.restype, fn.argtypes = res, args
        status = self.lib.hsa_init()
        if status:
            raise DeviceUnavailable(f"hsa_init failed: {self.status_text(status)} (is /dev/kfd there and readable by this user?)")
        self.open = True

    def status_text(self, status: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.hsa_status_string(status, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode(errors="replace")
        return f"HSA status {status:#x}"

    def check(self, call: str, status: int) -> None:
        if status not in (0, STATUS_INFO_BREAK):
            raise HsaError(call, status, self.status_text(status))

    def close(self) -> None:
        if getattr(self, "open", False):
            self.lib.hsa_shut_down()
            self.open = False

    # -- agents and memory pools ----------------------------------------------------------------
    def agents(self) -> list[tuple[int, int, str]]:
        """Every agent as (handle, device type, name: 'gfx942' for a GPU)."""
        out: list[tuple[int, int, str]] = []

        def visit(agent: int, _data: Any) -> int:
            kind = ctypes.c_int()
            name = ctypes.create_string_buffer(64)
            if self.lib.hsa_agent_get_info(agent, AGENT_INFO_DEVICE, ctypes.byref(kind)) or self.lib.hsa_agent_get_info(agent, AGENT_INFO_NAME, name):
                return 0
            out.append((agent, kind.value, name.value.decode(errors="replace")))
            return 0

        self.check("hsa_iterate_agents", self.lib.hsa_iterate_agents(_CALLBACK_AGENT(visit), None))
        return out

    def kernarg_pool(self, cpu_agent: int) -> int:
        """The host's memory pool for kernel arguments (global segment, KERNARG_INIT)."""
        found: list[int] = []

        def visit(pool: int, _data: Any) -> int:
            segment, flags = ctypes.c_int(), ctypes.c_uint32()
            self.lib.hsa_amd_memory_pool_get_info(pool, POOL_INFO_SEGMENT, ctypes.byref(segment))
            self.lib.hsa_amd_memory_pool_get_info(pool, POOL_INFO_GLOBAL_FLAGS, ctypes.byref(flags))
            if segment.value == SEGMENT_GLOBAL and flags.value & FLAG_KERNARG_INIT:
                found.append(pool)
                return STATUS_INFO_BREAK
            return 0

        self.check("hsa_amd_agent_iterate_memory_pools", self.lib.hsa_amd_agent_iterate_memory_pools(cpu_agent, _CALLBACK_POOL(visit), None))
        if not found:
            raise HsaError("hsa_amd_agent_iterate_memory_pools", 0, "the host agent has no kernarg memory pool")
        return found[0]

    def pool_allocate(self, pool: int, nbytes: int, gpu: int) -> int:
        ptr = ctypes.c_void_p()
        self.check("hsa_amd_memory_pool_allocate", self.lib.hsa_amd_memory_pool_allocate(pool, nbytes, 0, ctypes.byref(ptr)))
        agents = (ctypes.c_uint64 * 1)(gpu)
        self.check("hsa_amd_agents_allow_access", self.lib.hsa_amd_agents_allow_access(1, agents, None, ptr))
        return int(ptr.value or 0)

    def pool_free(self, ptr: int) -> None:
        self.check("hsa_amd_memory_pool_free", self.lib.hsa_amd_memory_pool_free(ptr))

    # -- code objects ---------------------------------------------------------------------------
    def load(self, gpu: int, code_object: bytes, symbol: str) -> tuple[int, int, int]:
        """Load a code object for ``gpu`` into a frozen executable: (executable, reader, the kernel
        object of ``symbol``: its descriptor's address)."""
        data = ctypes.create_string_buffer(code_object, len(code_object))
        reader, exe, sym, kobj = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        self.check(
            "hsa_code_object_reader_create_from_memory", self.lib.hsa_code_object_reader_create_from_memory(data, len(code_object), ctypes.byref(reader))
        )
        try:
            self.check("hsa_executable_create_alt", self.lib.hsa_executable_create_alt(PROFILE_FULL, ROUNDING_DEFAULT, None, ctypes.byref(exe)))
            self.check("hsa_executable_load_agent_code_object", self.lib.hsa_executable_load_agent_code_object(exe, gpu, reader, None, None))
            self.check("hsa_executable_freeze", self.lib.hsa_executable_freeze(exe, None))
            agent = ctypes.c_uint64(gpu)
            self.check(
                f"hsa_executable_get_symbol_by_name({symbol})",
                self.lib.hsa_executable_get_symbol_by_name(exe, symbol.encode(), ctypes.byref(agent), ctypes.byref(sym)),
            )
            self.check("hsa_executable_symbol_get_info", self.lib.hsa_executable_symbol_get_info(sym, SYMBOL_INFO_KERNEL_OBJECT, ctypes.byref(kobj)))
        except BaseException:
            if exe.value:
                self.lib.hsa_executable_destroy(exe)
            self.lib.hsa_code_object_reader_destroy(reader)
            raise
        return exe.value, reader.value, kobj.value

    def unload(self, executable: int, reader: int) -> None:
        self.lib.hsa_executable_destroy(executable)
        self.lib.hsa_code_object_reader_destroy(reader)

    # -- queues and signals ---------------------------------------------------------------------
    def queue(self, gpu: int, slots: int) -> Any:
        """A single-producer AQL queue of ``slots`` packets: its ``hsa_queue_t``."""
        q = ctypes.POINTER(QueueStruct)()
        self.check("hsa_queue_create", self.lib.hsa_queue_create(gpu, slots, QUEUE_TYPE_SINGLE, None, None, UINT32_MAX, UINT32_MAX, ctypes.byref(q)))
        return q

    def signal(self, value: int) -> int:
        s = ctypes.c_uint64()
        self.check("hsa_signal_create", self.lib.hsa_signal_create(value, 0, None, ctypes.byref(s)))
        return s.value

    def wait_below_one(self, signal: int, timeout_ns: int) -> int:
        """Wait (blocked) until ``signal`` is below 1 or the timeout passes: its value."""
        return int(self.lib.hsa_signal_wait_scacquire(signal, CONDITION_LT, 1, timeout_ns, WAIT_STATE_BLOCKED))


class HsaQueueMemory:
    """``aql.RingMemory`` over an HSA queue: the ring at ``hsa_queue_t.base_address`` (host-coherent
    memory ROCr allocates), its write and read indices and doorbell signal through the runtime.
    Python's stores are plain x86-64 stores, which are release-ordered (TSO): the header store
    becomes visible after the body's. ``store_fence`` is ``HostFence`` (``sfence``), which also
    orders write-combining stores to device memory."""

    def __init__(self, hsa: Hsa, queue: Any) -> None:
        self.hsa, self.queue = hsa, queue
        self.base = int(queue.contents.base_address)
        self._fence: Any = None

    def write(self, offset: int, data: bytes) -> None:
        ctypes.memmove(self.base + offset, data, len(data))

    def store_release_u32(self, offset: int, value: int) -> None:
        ctypes.c_uint32.from_address(self.base + offset).value = value

    def store_write_index(self, index: int) -> None:
        self.hsa.lib.hsa_queue_store_write_index_screlease(self.queue, index)

    def read_index(self) -> int:
        return int(self.hsa.lib.hsa_queue_load_read_index_scacquire(self.queue))

    def store_fence(self) -> None:
        if self._fence is None:
            self._fence = HostFence()
        self._fence()

    def ring_doorbell(self, index: int) -> None:
        self.hsa.lib.hsa_signal_store_screlease(self.queue.contents.doorbell_signal, index)


class HostFence:
    """A store fence on the host CPU, compiled by LLVM: ``sfence`` on x86-64 (it orders every earlier
    store, write-combining stores to device memory included, before every later one), a sequentially
    consistent fence elsewhere. The JIT engine that holds its code lives as long as this object."""

    def __init__(self) -> None:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        triple = llvm.get_default_triple()
        if triple.startswith("x86_64"):
            body = "declare void @llvm.x86.sse.sfence()\ndefine void @poot_fence() {\n  call void @llvm.x86.sse.sfence()\n  ret void\n}\n"
        else:
            body = "define void @poot_fence() {\n  fence seq_cst\n  ret void\n}\n"
        self.assembly = llvm.Target.from_triple(triple).create_target_machine().emit_assembly(llvm.parse_assembly(body))
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(body), llvm.Target.from_triple(triple).create_target_machine())
        self._engine.finalize_object()
        self._fn = ctypes.CFUNCTYPE(None)(self._engine.get_function_address("poot_fence"))

    def __call__(self) -> None:
        self._fn()
