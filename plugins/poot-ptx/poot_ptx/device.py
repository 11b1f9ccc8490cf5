"""CUDA devices, probed with cuda-python's driver API (cuInit, cuDeviceGet*)."""

from __future__ import annotations

from poot.backend import Capabilities, Device, Unavailable

__all__ = ["cuda_devices", "null_devices", "MIN_COMPUTE_CAPABILITY"]

MIN_COMPUTE_CAPABILITY = (8, 0)  # codegen emits PTX for sm_80 and newer


def _placeholder(code: str, message: str) -> list[Device]:
    return [Device("cuda", None, "NVIDIA GPU", target="nvptx", unavailable=Unavailable(code, message))]


class CudaCallError(RuntimeError):
    def __init__(self, call: str, name: str) -> None:
        self.call, self.name = call, name
        super().__init__(f"{call} failed: {name}")


def _check(driver, call: str, result):  # type: ignore[no-untyped-def]
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaCallError(call, name.decode() if isinstance(name, bytes) else str(err))
    return rest[0] if len(rest) == 1 else rest


def cuda_devices() -> list[Device]:
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return _placeholder("no-binding", f"cuda-python is not importable ({e}); pip install cuda-python")
    try:
        _check(driver, "cuInit", driver.cuInit(0))
    except CudaCallError as e:
        code = "no-device" if e.name == "CUDA_ERROR_NO_DEVICE" else "no-driver"
        return _placeholder(code, f"{e}; check the NVIDIA driver with nvidia-smi")
    except Exception as e:  # noqa: BLE001 - cuda-python raises its loader's error when libcuda is absent
        return _placeholder("no-driver", f"no NVIDIA driver: libcuda could not be loaded ({type(e).__name__}: {e})")
    count = _check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount())
    if count == 0:
        return _placeholder("no-device", "the NVIDIA driver reports no CUDA device")
    A = driver.CUdevice_attribute
    out = []
    for i in range(count):
        dev = _check(driver, "cuDeviceGet", driver.cuDeviceGet(i))

        def attr(a, dev=dev):  # type: ignore[no-untyped-def]
            return _check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(a, dev))

        raw = _check(driver, "cuDeviceGetName", driver.cuDeviceGetName(256, dev))
        name = raw.split(b"\0", 1)[0].decode(errors="replace")
        cc = (attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        mem = _check(driver, "cuDeviceTotalMem", driver.cuDeviceTotalMem(dev))
        matrix = {"mma.sync.f16", "mma.sync.bf16"} if cc >= (8, 0) else set()
        if cc == (9, 0):  # sm_90a code (wgmma) runs on compute capability 9.0 alone
            matrix |= {"wgmma"}
        caps = Capabilities(
            dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"}),
            compute_units=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            max_workgroup_size=attr(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            # kernels declare their workgroup memory statically, which PTX caps at the per-block
            # default (48 KiB); the opt-in maximum is for dynamic shared memory only
            shared_memory_bytes=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
            subgroup_size=attr(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
            memory_bytes=int(mem),
            # past the 48 KiB PTX declares statically, for the sm_90a code that places arrays there
            dynamic_shared_bytes=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) if cc == (9, 0) else 0,
            matrix_ops=frozenset(matrix),
            details=(("compute capability", f"{cc[0]}.{cc[1]}"), ("arch", f"sm_{cc[0]}{cc[1]}")),
        )
        reason = None
        if cc < MIN_COMPUTE_CAPABILITY:
            reason = Unavailable(
                "unsupported", f"compute capability {cc[0]}.{cc[1]} is below the {MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} poot targets"
            )
        out.append(Device("cuda", i, name, target="nvptx", capabilities=caps, unavailable=reason))
    return out


def _null(arch: str, description: str, sms: int, dynamic_shared: int, matrix: set[str]) -> Device:
    caps = Capabilities(
        dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"}),
        compute_units=sms,
        max_workgroup_size=1024,
        shared_memory_bytes=48 * 1024,
        subgroup_size=32,
        memory_bytes=0,  # no memory: nothing is allocated on a compile-only device
        dynamic_shared_bytes=dynamic_shared,
        matrix_ops=frozenset(matrix),
        details=(("arch", arch), ("compile only", "yes")),
    )
    return Device("null", arch, f"compile-only {description} ({arch}): plans and PTX, no hardware", target="nvptx", capabilities=caps)


def null_devices() -> list[Device]:
    """Compile-only NVIDIA devices with the capabilities a real one reports: an A100 (sm_80) and an
    H100/H200 (sm_90a, with wgmma and 227 KiB of opt-in workgroup memory)."""
    mma = {"mma.sync.f16", "mma.sync.bf16"}
    return [
        _null("sm_80", "NVIDIA Ampere", 108, 0, mma),
        _null("sm_90a", "NVIDIA Hopper", 132, 227 * 1024, mma | {"wgmma"}),
    ]
