"""Vulkan physical devices: properties, subgroup size, features and memory heaps from the driver."""

from __future__ import annotations

from poot.backend import Capabilities, Device, Unavailable

__all__ = ["null_device", "vulkan_devices", "subgroup_width", "MIN_API"]

MIN_API = (1, 3)  # codegen emits SPIR-V for the vulkan1.3 environment
_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}


def subgroup_width(vk, physical) -> tuple[int, bool]:  # type: ignore[no-untyped-def]
    """(the subgroup width kernels may use on ``physical``, whether pipelines can demand it in full
    subgroups). The width is the device's subgroup size where compute shaders run subgroup
    reductions and shuffles and every compute subgroup is that wide: the size is fixed (minimum =
    maximum), or subgroup size control can require it of a pipeline (Vulkan 1.3). Else 1: kernels
    use no subgroup operations (codegen.spirv_target(1) serves any device)."""
    sub = vk.VkPhysicalDeviceSubgroupProperties()
    p13 = vk.VkPhysicalDeviceVulkan13Properties(pNext=sub)
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=p13))
    f13 = vk.VkPhysicalDeviceVulkan13Features()
    vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(pNext=f13))
    need = vk.VK_SUBGROUP_FEATURE_BASIC_BIT | vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT
    n = int(sub.subgroupSize)
    if not (sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT and sub.supportedOperations & need == need and n > 1 and not n & (n - 1)):
        return 1, False
    control = bool(
        f13.subgroupSizeControl
        and f13.computeFullSubgroups
        and p13.requiredSubgroupSizeStages & vk.VK_SHADER_STAGE_COMPUTE_BIT
        and p13.minSubgroupSize <= n <= p13.maxSubgroupSize
    )
    fixed = p13.minSubgroupSize == p13.maxSubgroupSize == n
    return (n, control) if control or fixed else (1, False)


def _placeholder(code: str, message: str) -> list[Device]:
    return [Device("vulkan", None, "Vulkan device", target="spirv", unavailable=Unavailable(code, message))]


def _version(v: int) -> tuple[int, int, int]:
    return (v >> 22) & 0x7F, (v >> 12) & 0x3FF, v & 0xFFF


def vulkan_devices() -> list[Device]:
    try:
        import vulkan as vk
    except ModuleNotFoundError as e:
        return _placeholder("no-binding", f"the vulkan package is not importable ({e}); pip install vulkan")
    except OSError as e:  # the binding dlopens the loader at import
        return _placeholder("no-driver", f"no Vulkan loader: {e}; install libvulkan1 and a driver (e.g. mesa-vulkan-drivers)")
    app = vk.VkApplicationInfo(pApplicationName="poot", apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
    try:
        inst = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    except vk.VkError as e:
        return _placeholder("no-driver", f"vkCreateInstance failed ({type(e).__name__}): no Vulkan driver (ICD) is installed")
    try:
        phys = vk.vkEnumeratePhysicalDevices(inst)
        if not phys:
            return _placeholder("no-device", "the Vulkan loader found no physical device")
        return [_describe(vk, i, pd) for i, pd in enumerate(phys)]
    finally:
        vk.vkDestroyInstance(inst, None)


def _describe(vk, index: int, pd) -> Device:  # type: ignore[no-untyped-def]
    sub = vk.VkPhysicalDeviceSubgroupProperties()
    props2 = vk.VkPhysicalDeviceProperties2(pNext=sub)
    vk.vkGetPhysicalDeviceProperties2(pd, props2)
    props = props2.properties
    f12 = vk.VkPhysicalDeviceVulkan12Features()
    feats2 = vk.VkPhysicalDeviceFeatures2(pNext=f12)
    vk.vkGetPhysicalDeviceFeatures2(pd, feats2)
    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    local = [mem.memoryHeaps[i].size for i in range(mem.memoryHeapCount) if mem.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT]
    dtypes = {"f32", "i32", "u8", "bool", "bf16"}  # 16-bit weights are read as 32-bit words
    if f12.shaderFloat16:
        dtypes.add("f16")
    if f12.shaderInt8:
        dtypes.add("i8")
    if feats2.features.shaderInt64:
        dtypes.add("i64")
    api = _version(props.apiVersion)
    name = vk.ffi.string(props.deviceName).decode() if not isinstance(props.deviceName, str) else props.deviceName
    lim = props.limits
    caps = Capabilities(
        dtypes=frozenset(dtypes),
        max_buffer_bytes=int(lim.maxStorageBufferRange),
        compute_units=1,  # Vulkan does not expose a compute-unit count
        max_workgroup_size=lim.maxComputeWorkGroupInvocations,
        shared_memory_bytes=lim.maxComputeSharedMemorySize,
        subgroup_size=sub.subgroupSize,
        subgroup_ops=subgroup_width(vk, pd)[0] > 1,
        memory_bytes=max(local, default=0),
        details=(
            ("type", _TYPES.get(props.deviceType, str(props.deviceType))),
            ("api", "{}.{}.{}".format(*api)),
            ("max storage buffer", str(lim.maxStorageBufferRange)),
        ),
    )
    reason = None
    if api[:2] < MIN_API:
        reason = Unavailable("unsupported", f"Vulkan {api[0]}.{api[1]} is below the {MIN_API[0]}.{MIN_API[1]} poot's SPIR-V needs")
    return Device("vulkan", index, name, target="spirv", capabilities=caps, unavailable=reason)


def null_device() -> Device:
    """A compile-only Vulkan 1.3 device as a desktop GPU reports itself (subgroups of 32 with their
    operations, 1,024 invocations a workgroup, storage buffers up to 4 GiB): plans and SPIR-V, no
    hardware."""
    caps = Capabilities(
        dtypes=frozenset({"f32", "f16", "bf16", "i8", "u8", "i32", "i64", "bool"}),
        max_buffer_bytes=2**32 - 1,
        compute_units=1,
        max_workgroup_size=1024,
        shared_memory_bytes=48 * 1024,
        subgroup_size=32,
        subgroup_ops=True,
        memory_bytes=0,
        details=(("api", "1.3"), ("compile only", "yes")),
    )
    return Device("null", "vulkan", "compile-only Vulkan 1.3 device: plans and SPIR-V, no hardware", target="spirv", capabilities=caps)
