"""WebGPU adapters from wgpu-native, with their limits and features.

Only native compute backends (Vulkan, Metal, D3D12) are listed: the OpenGL backend's compute
support is too limited for poot's kernels.
"""

from __future__ import annotations

import contextlib
import os

from poot.backend import Capabilities, Device, Unavailable

from .subgroups import subgroup_width

__all__ = ["wgpu_devices", "COMPUTE_BACKENDS"]

COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")


def _placeholder(code: str, message: str) -> list[Device]:
    return [Device("wgpu", None, "WebGPU adapter", target="spirv", unavailable=Unavailable(code, message))]


def _restrict_backends() -> None:
    """Ask wgpu-native for compute-capable backends only (before its instance exists)."""
    try:
        from wgpu.backends.wgpu_native import extras

        extras.set_instance_extras(backends=["Vulkan", "Metal", "DX12"])
    except Exception:  # noqa: BLE001 - older wgpu-py or an instance that already exists: filter below
        pass


@contextlib.contextmanager
def _quiet_stderr():  # type: ignore[no-untyped-def]
    """Silence C-level writes to stderr (fd 2) for the duration; Python-level errors still raise."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def wgpu_devices() -> list[Device]:
    try:
        import wgpu
    except ImportError as e:
        return _placeholder("no-binding", f"wgpu is not importable ({e}); pip install wgpu")
    _restrict_backends()
    try:
        with _quiet_stderr():  # Mesa's WSI layer complains about XDG_RUNTIME_DIR while probing
            adapters = wgpu.gpu.enumerate_adapters_sync()
    except Exception as e:  # noqa: BLE001 - wgpu-native missing or failing to start
        return _placeholder("no-driver", f"wgpu-native could not enumerate adapters ({type(e).__name__}: {e})")
    adapters = [a for a in adapters if a.info.get("backend_type") in COMPUTE_BACKENDS]
    if not adapters:
        return _placeholder("no-device", "wgpu found no Vulkan, Metal or D3D12 adapter; install a Vulkan driver (e.g. mesa-vulkan-drivers)")
    out = []
    for i, a in enumerate(adapters):
        info, lim = a.info, a.limits
        width = subgroup_width(a)
        # i8: kernels may compute on 8-bit integers (LLVM narrows some arithmetic to them): naga takes
        # none, and the SPIR-V post-pass redoes it in 32 bits, so every adapter runs it
        dtypes = {"f32", "i32", "i8", "u8", "bool", "bf16"} | ({"f16"} if "shader-f16" in a.features else set())
        caps = Capabilities(
            dtypes=frozenset(dtypes),
            compute_units=1,  # WebGPU does not expose a compute-unit count
            max_workgroup_size=lim["max-compute-invocations-per-workgroup"],
            shared_memory_bytes=lim["max-compute-workgroup-storage-size"],
            subgroup_size=width if width > 1 else int(info.get("subgroup_min_size") or info.get("stackgroup_min_size") or 0) or 1,
            subgroup_ops=width > 1,  # WebGPU gives a range of widths: the one kernels are compiled for is measured
            memory_bytes=0,  # not exposed by WebGPU
            max_buffer_bytes=int(lim["max-storage-buffer-binding-size"]),
            details=(
                ("backend", str(info.get("backend_type"))),
                ("type", str(info.get("adapter_type"))),
                ("max storage binding", str(lim["max-storage-buffer-binding-size"])),
            ),
        )
        out.append(Device("wgpu", i, str(info.get("device") or info.get("description")), target="spirv", capabilities=caps))
    return out
