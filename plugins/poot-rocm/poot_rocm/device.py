"""AMD GPUs, probed with hip-python (hipGetDeviceCount, hipGetDeviceProperties)."""

from __future__ import annotations

from poot.backend import Capabilities, Device, Unavailable

__all__ = ["rocm_devices", "null_devices", "SUPPORTED_ARCHS"]

SUPPORTED_ARCHS = ("gfx90a", "gfx942", "gfx1100", "gfx1151", "gfx1201")  # the AMDGCN targets codegen links code objects for
# what `poot devices` says of a supported GPU: the executor has run on a simulated GPU, not on one
STATUS = "experimental: the AQL executor is verified on a simulated GPU, not yet on AMD hardware (scripts/rocm-check)"


def _placeholder(code: str, message: str) -> list[Device]:
    return [Device("rocm", None, "AMD GPU", target="amdgcn", unavailable=Unavailable(code, message))]


def rocm_devices() -> list[Device]:
    try:
        from hip import hip
    except ImportError as e:
        return _placeholder("no-binding", f"hip-python is not importable ({e}); pip install hip-python")
    try:
        err, count = hip.hipGetDeviceCount()
    except RuntimeError as e:  # hip-python raises when libamdhip64 cannot be opened
        return _placeholder("no-driver", f"no ROCm runtime: {e}; install ROCm (libamdhip64)")
    if err != hip.hipError_t.hipSuccess or count == 0:
        name = getattr(err, "name", str(err))
        code = "no-device" if count == 0 or name == "hipErrorNoDevice" else "no-driver"
        return _placeholder(code, f"hipGetDeviceCount returned {name}: no usable AMD GPU (check rocm-smi and /dev/kfd)")
    from .hsa import find_library

    hsa = find_library()
    out = []
    for i in range(count):
        props = hip.hipDeviceProp_t()
        (perr,) = hip.hipGetDeviceProperties(props, i)
        if perr != hip.hipError_t.hipSuccess:
            out.append(Device("rocm", i, "AMD GPU", target="amdgcn", unavailable=Unavailable("no-driver", f"hipGetDeviceProperties({i}) returned {perr}")))
            continue
        arch = props.gcnArchName.decode().split(":", 1)[0] if isinstance(props.gcnArchName, bytes) else str(props.gcnArchName).split(":", 1)[0]
        caps = Capabilities(
            dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"}),
            compute_units=props.multiProcessorCount,
            max_workgroup_size=props.maxThreadsPerBlock,
            shared_memory_bytes=props.sharedMemPerBlock,
            subgroup_size=props.warpSize,
            memory_bytes=props.totalGlobalMem,
            matrix_ops=frozenset(),  # MFMA (gfx9) and WMMA (gfx11) have no lowering yet: no schedule may ask for them
            details=(("arch", arch), ("status", STATUS)),
        )
        reason = None
        if arch not in SUPPORTED_ARCHS:
            reason = Unavailable("unsupported", f"{arch} is not one of the targets poot links for ({', '.join(SUPPORTED_ARCHS)})")
        elif hsa is None:
            reason = Unavailable("no-driver", "HIP finds this GPU but the HSA runtime (libhsa-runtime64) is not found: set ROCM_PATH")
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
        out.append(Device("rocm", i, name, target="amdgcn", capabilities=caps, unavailable=reason))
    return out


def _null(arch: str, description: str, units: int, wave: int, shared: int) -> Device:
    caps = Capabilities(
        dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"}),
        compute_units=units,
        max_workgroup_size=1024,
        shared_memory_bytes=shared,
        subgroup_size=wave,
        memory_bytes=0,
        matrix_ops=frozenset(),
        details=(("arch", arch), ("compile only", "yes")),
    )
    return Device("null", arch, f"compile-only {description} ({arch}): plans and code objects, no hardware", target="amdgcn", capabilities=caps)


def null_devices() -> list[Device]:
    """Compile-only AMD GPUs with the capabilities a real one reports: an Instinct MI300 (gfx942,
    CDNA 3, 64-lane wavefronts) and a Radeon RX 7900 XTX (gfx1100, RDNA 3, 32-lane wavefronts):
    plans and code objects, no hardware."""
    return [_null("gfx942", "AMD CDNA 3", 304, 64, 64 * 1024), _null("gfx1100", "AMD RDNA 3", 96, 32, 64 * 1024)]
