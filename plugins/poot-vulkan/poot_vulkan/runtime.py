"""A minimal Vulkan compute runtime on the ``vulkan`` (cffi) package: a device, host-visible buffers
mapped as numpy views, and one compute pipeline per kernel.

    with VulkanDevice(0) as dev:
        k = VulkanKernel(kernel, compile_kernel(kernel, spirv_target(dev.subgroup)).data, dev)
        k.run((groups, 1, 1), {"x": x, "y": y}, {"n": len(x)})

A kernel's descriptor set 0 follows ``poot.codegen.spirv.bindings``: one storage buffer per Buffer
parameter, then one of scalar words. ``run`` copies every given array into its binding (so an output
keeps the values a kernel does not write), dispatches, waits, and copies the writable buffers back.
The command buffer is recorded once per grid and resubmitted while the grid and buffers stay the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from poot.backend import SPIRV_ENTRY as ENTRY
from poot.backend import SPIRV_SCALARS as SCALARS
from poot.backend import Kernel, cache_dir, uses_subgroups
from poot.backend import spirv_bindings as bindings
from poot.backend import spirv_scalar_words as scalar_words
from poot.errors import DeviceUnavailable

from .device import subgroup_width

__all__ = ["VulkanDevice", "VulkanKernel", "HostBuffer", "DeviceBuffer", "WHOLE_SIZE"]

WHOLE_SIZE = 2**64 - 1  # VK_WHOLE_SIZE as a uint64: the `vulkan` package defines it as -1
_NUMPY = {"f32": np.float32, "i32": np.int32, "u8": np.uint8, "bf16": np.uint16, "f16": np.float16}  # u8, bf16, f16: read-only, read as words
_API = (1, 3)
STAGING = 64 << 20  # bytes a staging copy moves at most


def _vk():  # type: ignore[no-untyped-def]
    try:
        import vulkan as vk
    except (ModuleNotFoundError, OSError) as e:
        raise DeviceUnavailable(
            f"vulkan: the Vulkan loader or its Python binding is missing ({e}); "
            "install libvulkan1 and a driver (e.g. mesa-vulkan-drivers), and pip install vulkan"
        ) from None
    return vk


class VulkanDevice:
    """Instance, logical device and one compute queue on physical device ``index``. ``close()`` (or
    leaving a ``with`` block) releases it and every kernel made on it."""

    def __init__(self, index: int = 0) -> None:
        vk = self.vk = _vk()
        self.instance = self.device = None
        self._kernels: list[VulkanKernel] = []
        self._staging: HostBuffer | None = None
        self._transfer: tuple | None = None
        self._storage_bits: int | None = None
        self._pipeline_cache: object | None = None
        app = vk.VkApplicationInfo(pApplicationName="poot", apiVersion=vk.VK_MAKE_VERSION(*_API, 0))
        try:
            self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        except vk.VkError as e:
            raise DeviceUnavailable(f"vulkan:{index}: vkCreateInstance failed ({type(e).__name__}): no Vulkan driver") from None
        try:
            phys = vk.vkEnumeratePhysicalDevices(self.instance)
            if not 0 <= index < len(phys):
                raise DeviceUnavailable(f"vulkan:{index}: the driver lists {len(phys)} physical device(s)")
            self.physical = phys[index]
            props = vk.vkGetPhysicalDeviceProperties(self.physical)
            self.name = props.deviceName if isinstance(props.deviceName, str) else vk.ffi.string(props.deviceName).decode()
            major, minor = props.apiVersion >> 22 & 0x7F, props.apiVersion >> 12 & 0x3FF
            if (major, minor) < _API:
                raise DeviceUnavailable(f"vulkan:{index} ({self.name}) offers Vulkan {major}.{minor}; poot's SPIR-V needs 1.3")
            families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
            self.family = next((i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
            if self.family is None:
                raise DeviceUnavailable(f"vulkan:{index} ({self.name}) has no compute queue")
            queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1, pQueuePriorities=[1.0])
            self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(pNext=self._features(), pQueueCreateInfos=[queue]), None)
            self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
            self.memory = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        except BaseException:
            self.close()
            raise
        self.index = index

    def _features(self):  # type: ignore[no-untyped-def]
        """The optional features kernels may need, enabled where the device has them: shaderInt8
        (packed-weight kernels compute with bytes), and subgroup size control with full compute
        subgroups (kernels that use subgroup operations get exactly ``subgroup`` lanes a subgroup,
        every subgroup full). Sets ``subgroup`` (codegen.spirv_target's width) and ``full_subgroups``."""
        vk = self.vk
        f12 = vk.VkPhysicalDeviceVulkan12Features()
        vk.vkGetPhysicalDeviceFeatures2(self.physical, vk.VkPhysicalDeviceFeatures2(pNext=f12))
        self.subgroup, self.full_subgroups = subgroup_width(vk, self.physical)
        self.int8 = bool(f12.shaderInt8)
        return vk.VkPhysicalDeviceVulkan12Features(
            shaderInt8=self.int8, pNext=vk.VkPhysicalDeviceVulkan13Features(subgroupSizeControl=self.full_subgroups, computeFullSubgroups=self.full_subgroups)
        )

    def compute_pipeline(self, kernel: Kernel, module, layout):  # type: ignore[no-untyped-def]
        """The compute pipeline of ``kernel``'s shader ``module`` (through the pipeline cache). A
        kernel that uses subgroup operations gets exactly the width it was compiled for, in full
        subgroups (lane i of subgroup s is thread s * subgroup + i), where the device can promise it."""
        vk = self.vk
        extra = {}
        if self.full_subgroups and uses_subgroups(kernel) and kernel.workgroup[0] % self.subgroup == 0:
            extra = {
                "pNext": vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(requiredSubgroupSize=self.subgroup),
                "flags": vk.VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT,
            }  # the 1.3 core name is missing from the binding
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName=ENTRY, **extra)
        info = vk.VkComputePipelineCreateInfo(stage=stage, layout=layout)
        return vk.vkCreateComputePipelines(self.device, self.pipeline_cache(), 1, [info], None)[0]

    def memory_type(self, bits: int) -> int:
        """A host-visible, host-coherent memory type allowed by ``bits`` (a memoryTypeBits mask)."""
        vk = self.vk
        want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        for i in range(self.memory.memoryTypeCount):
            if bits >> i & 1 and self.memory.memoryTypes[i].propertyFlags & want == want:
                return i
        raise DeviceUnavailable(f"vulkan:{self.index} ({self.name}) has no host-visible coherent memory for a storage buffer")

    def device_local_type(self, bits: int) -> int | None:
        """A device-local memory type the host cannot map (a discrete GPU's own memory) allowed by
        ``bits``, or None where device-local memory is host-visible too (lavapipe, integrated GPUs:
        mapped buffers are already where the device reads)."""
        vk = self.vk
        for i in range(self.memory.memoryTypeCount):
            flags = self.memory.memoryTypes[i].propertyFlags
            if bits >> i & 1 and flags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT and not flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT:
                return i
        return None

    def transfer(self, record) -> None:  # type: ignore[no-untyped-def]
        """Record copy commands with ``record(cmd)`` into a one-time command buffer, submit it and wait."""
        vk, d = self.vk, self.device
        if self._transfer is None:
            pool = vk.vkCreateCommandPool(
                d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=self.family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None
            )
            cmd = vk.vkAllocateCommandBuffers(
                d, vk.VkCommandBufferAllocateInfo(commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1)
            )[0]
            self._transfer = (pool, cmd, vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None))
        _, cmd, fence = self._transfer
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        # a fence wait does not make device writes visible to later commands or to the host: barriers do
        before = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_HOST_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
        )
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, [before], 0, None, 0, None)
        record(cmd)
        after = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
        )
        vk.vkCmdPipelineBarrier(
            cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [after], 0, None, 0, None
        )
        vk.vkEndCommandBuffer(cmd)
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[cmd])], fence)
        vk.vkWaitForFences(d, 1, [fence], vk.VK_TRUE, WHOLE_SIZE)
        vk.vkResetFences(d, 1, [fence])

    def staging(self, nbytes: int) -> "HostBuffer":
        """The device's host-visible staging buffer, at least ``min(nbytes, STAGING)`` bytes."""
        want = min(max(nbytes, 1 << 20), STAGING) + 255 & ~255  # whole words
        if self._staging is None or self._staging.nbytes < want:
            if self._staging is not None:
                self._staging.close()
            self._staging = HostBuffer(self, want)
        return self._staging

    def pipeline_cache(self) -> object:
        """The device's VkPipelineCache, seeded from the file ``pipeline_cache_path()`` names (the
        driver's compiled pipelines of earlier runs: a driver ignores data that is not its own);
        ``close()`` writes it back."""
        if self._pipeline_cache is None:
            vk = self.vk
            path = self.pipeline_cache_path()
            data = path.read_bytes() if path.is_file() else b""
            info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(data), pInitialData=vk.ffi.from_buffer(data) if data else vk.ffi.NULL)
            try:
                self._pipeline_cache = vk.vkCreatePipelineCache(self.device, info, None)
            except vk.VkError:  # data the driver refuses: start empty
                self._pipeline_cache = vk.vkCreatePipelineCache(self.device, vk.VkPipelineCacheCreateInfo(), None)
        return self._pipeline_cache

    def pipeline_cache_path(self) -> Path:
        """Where this device's pipeline cache lives: under poot's cache directory, one file per device
        (vendor, device id and driver version: another driver's data is of no use)."""
        props = self.vk.vkGetPhysicalDeviceProperties(self.physical)
        return cache_dir() / "vulkan" / f"pipelines-{props.vendorID:04x}-{props.deviceID:04x}-{props.driverVersion:08x}.bin"

    def _save_pipeline_cache(self) -> None:
        vk = self.vk  # (the binding wraps no vkGetPipelineCacheData: the loader's own, through cffi)
        size = vk.ffi.new("size_t *")
        if vk.lib.vkGetPipelineCacheData(self.device, self._pipeline_cache, size, vk.ffi.NULL) != vk.VK_SUCCESS or not size[0]:
            return
        data = vk.ffi.new("char[]", size[0])
        if vk.lib.vkGetPipelineCacheData(self.device, self._pipeline_cache, size, data) != vk.VK_SUCCESS:
            return
        raw = vk.ffi.buffer(data, size[0])[:]
        if raw:
            path = self.pipeline_cache_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(raw)
            os.replace(tmp, path)  # whole or not at all: another process may be reading it

    def close(self) -> None:
        vk = self.vk
        for k in list(reversed(self._kernels)):
            k.close()
        if getattr(self, "_pipeline_cache", None) is not None and self.device is not None:
            try:
                self._save_pipeline_cache()
            except OSError:
                pass  # a read-only cache directory: the next run compiles again
            vk.vkDestroyPipelineCache(self.device, self._pipeline_cache, None)
            self._pipeline_cache = None
        if getattr(self, "_staging", None) is not None:
            self._staging.close()
            self._staging = None
        if getattr(self, "_transfer", None) is not None and self.device is not None:
            pool, _, fence = self._transfer
            vk.vkDestroyFence(self.device, fence, None)
            vk.vkDestroyCommandPool(self.device, pool, None)
            self._transfer = None
        if self.device is not None:
            vk.vkDeviceWaitIdle(self.device)
            vk.vkDestroyDevice(self.device, None)
            self.device = None
        if self.instance is not None:
            vk.vkDestroyInstance(self.instance, None)
            self.instance = None

    def __enter__(self) -> "VulkanDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"VulkanDevice({self.index}, {self.name!r})"


def _usage(vk) -> int:  # type: ignore[no-untyped-def]
    return vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT


class HostBuffer:
    """A storage buffer in host-visible coherent memory, mapped for its lifetime: ``view(dtype)`` is a
    numpy array over the mapped bytes."""

    mapped = True

    def __init__(self, dev: VulkanDevice, nbytes: int) -> None:
        vk = dev.vk
        self.dev, self.nbytes = dev, max(16, nbytes)  # a Vulkan buffer is never empty
        self.buffer = self.memory = None
        try:
            info = vk.VkBufferCreateInfo(size=self.nbytes, usage=_usage(vk), sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
            self.buffer = vk.vkCreateBuffer(dev.device, info, None)
            req = vk.vkGetBufferMemoryRequirements(dev.device, self.buffer)
            alloc = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=dev.memory_type(req.memoryTypeBits))
            self.memory = vk.vkAllocateMemory(dev.device, alloc, None)
            vk.vkBindBufferMemory(dev.device, self.buffer, self.memory, 0)
            self._mapped = vk.vkMapMemory(dev.device, self.memory, 0, self.nbytes, 0)
        except BaseException:
            self.close()
            raise

    def view(self, dtype: type) -> np.ndarray:
        return np.frombuffer(self._mapped, dtype=dtype)

    def write(self, offset: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.view(np.uint8)[offset : offset + raw.nbytes] = raw

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.view(np.uint8)[offset : offset + nbytes].copy()

    def close(self) -> None:
        vk, dev = self.dev.vk, self.dev.device
        if self.memory is not None:
            self._mapped = None
            vk.vkUnmapMemory(dev, self.memory)
            vk.vkFreeMemory(dev, self.memory, None)
            self.memory = None
        if self.buffer is not None:
            vk.vkDestroyBuffer(dev, self.buffer, None)
            self.buffer = None


class DeviceBuffer:
    """A storage buffer in memory the host cannot map (a discrete GPU's own): written and read by
    copy commands through the device's staging buffer. Zero-filled when made."""

    mapped = False

    def __init__(self, dev: VulkanDevice, nbytes: int, memory_type: int) -> None:
        vk = dev.vk
        self.dev, self.nbytes = dev, max(16, (nbytes + 3) // 4 * 4)
        self.buffer = self.memory = None
        try:
            info = vk.VkBufferCreateInfo(size=self.nbytes, usage=_usage(vk), sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
            self.buffer = vk.vkCreateBuffer(dev.device, info, None)
            req = vk.vkGetBufferMemoryRequirements(dev.device, self.buffer)
            self.memory = vk.vkAllocateMemory(dev.device, vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=memory_type), None)
            vk.vkBindBufferMemory(dev.device, self.buffer, self.memory, 0)
            dev.transfer(lambda cmd: vk.vkCmdFillBuffer(cmd, self.buffer, 0, self.nbytes, 0))
        except BaseException:
            self.close()
            raise

    def write(self, offset: int, data: np.ndarray) -> None:
        """Copy ``data``'s bytes to ``offset`` in staging-sized pieces (a buffer copy has no alignment
        rule: the bytes past the data stay as they are)."""
        vk = self.dev.vk
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        stage = self.dev.staging(raw.nbytes)
        for lo in range(0, raw.nbytes, stage.nbytes):
            piece = raw[lo : lo + stage.nbytes]
            stage.view(np.uint8)[: piece.nbytes] = piece
            region = vk.VkBufferCopy(srcOffset=0, dstOffset=offset + lo, size=piece.nbytes)
            self.dev.transfer(lambda cmd, region=region: vk.vkCmdCopyBuffer(cmd, stage.buffer, self.buffer, 1, [region]))

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        vk = self.dev.vk
        out = np.empty(nbytes, np.uint8)
        stage = self.dev.staging(nbytes)
        for lo in range(0, nbytes, stage.nbytes):
            size = min(stage.nbytes, nbytes - lo)
            region = vk.VkBufferCopy(srcOffset=offset + lo, dstOffset=0, size=size)
            self.dev.transfer(lambda cmd, region=region: vk.vkCmdCopyBuffer(cmd, self.buffer, stage.buffer, 1, [region]))
            out[lo : lo + size] = stage.view(np.uint8)[:size]
        return out

    def close(self) -> None:
        vk, dev = self.dev.vk, self.dev.device
        if self.memory is not None:
            vk.vkFreeMemory(dev, self.memory, None)
            self.memory = None
        if self.buffer is not None:
            vk.vkDestroyBuffer(dev, self.buffer, None)
            self.buffer = None


def storage_buffer(dev: VulkanDevice, nbytes: int, data: np.ndarray | None = None, staged: bool | None = None) -> HostBuffer | DeviceBuffer:
    """A zero-filled storage buffer of whole words holding ``data``: in device-local memory written
    through staging where the host cannot map it, else host-visible and mapped. ``staged=True``
    takes the staging path on any device (device-local memory, mappable or not: how the path is
    tested on lavapipe); ``False`` always maps."""
    vk = dev.vk
    if dev._storage_bits is None:
        probe = vk.vkCreateBuffer(dev.device, vk.VkBufferCreateInfo(size=16, usage=_usage(vk), sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        dev._storage_bits = vk.vkGetBufferMemoryRequirements(dev.device, probe).memoryTypeBits
        vk.vkDestroyBuffer(dev.device, probe, None)
    bits = dev._storage_bits
    local = None if staged is False else dev.device_local_type(bits)
    if local is None and staged:
        local = next(
            i for i in range(dev.memory.memoryTypeCount) if bits >> i & 1 and dev.memory.memoryTypes[i].propertyFlags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        )
    buf: HostBuffer | DeviceBuffer
    if local is None:
        buf = HostBuffer(dev, (nbytes + 3) // 4 * 4)
        buf.view(np.uint8)[:] = 0
    else:
        buf = DeviceBuffer(dev, nbytes, local)
    if data is not None and data.nbytes:
        buf.write(0, data)
    return buf


class VulkanKernel:
    """A compute pipeline for ``kernel`` from its SPIR-V (codegen's ``spirv_target(device.subgroup)``
    artifact)."""

    def __init__(self, kernel: Kernel, spirv: bytes, device: VulkanDevice) -> None:
        vk = device.vk
        self.kernel, self.dev, self._spirv = kernel, device, bytes(spirv)
        self.bindings = bindings(kernel)
        self.buffers: dict[str, HostBuffer] = {}
        self._grid: tuple[int, int, int] | None = None  # the grid the command buffer holds
        self.module = self.set_layout = self.layout = self.pipeline = self.pool = self.cmd_pool = self.fence = None
        d = device.device
        try:
            self.module = vk.vkCreateShaderModule(d, vk.VkShaderModuleCreateInfo(codeSize=len(self._spirv), pCode=self._spirv), None)
            slots = [
                vk.VkDescriptorSetLayoutBinding(
                    binding=b, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT
                )
                for b, *_ in self.bindings
            ]
            self.set_layout = vk.vkCreateDescriptorSetLayout(d, vk.VkDescriptorSetLayoutCreateInfo(pBindings=slots), None)
            self.layout = vk.vkCreatePipelineLayout(d, vk.VkPipelineLayoutCreateInfo(pSetLayouts=[self.set_layout]), None)
            self.pipeline = device.compute_pipeline(kernel, self.module, self.layout)
            sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=max(1, len(self.bindings)))]
            self.pool = vk.vkCreateDescriptorPool(d, vk.VkDescriptorPoolCreateInfo(maxSets=1, pPoolSizes=sizes), None)
            alloc = vk.VkDescriptorSetAllocateInfo(descriptorPool=self.pool, pSetLayouts=[self.set_layout])
            self.set = vk.vkAllocateDescriptorSets(d, alloc)[0]
            pool = vk.VkCommandPoolCreateInfo(queueFamilyIndex=device.family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT)
            self.cmd_pool = vk.vkCreateCommandPool(d, pool, None)
            cmd = vk.VkCommandBufferAllocateInfo(commandPool=self.cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1)
            self.cmd = vk.vkAllocateCommandBuffers(d, cmd)[0]
            self.fence = vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None)
        except BaseException:
            self.close()
            raise
        device._kernels.append(self)

    # -- buffers and the command buffer -------------------------------------------------------------
    def _bind(self, name: str, binding: int, nbytes: int) -> HostBuffer:
        """The binding's buffer, (re)allocated and written into the descriptor set when too small."""
        vk = self.dev.vk
        buf = self.buffers.get(name)
        if buf is not None and buf.nbytes >= nbytes:
            return buf
        if buf is not None:
            buf.close()
        buf = self.buffers[name] = HostBuffer(self.dev, (nbytes + 3) // 4 * 4)  # whole 32-bit words
        info = vk.VkDescriptorBufferInfo(buffer=buf.buffer, offset=0, range=WHOLE_SIZE)
        write = vk.VkWriteDescriptorSet(
            dstSet=self.set, dstBinding=binding, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info]
        )
        vk.vkUpdateDescriptorSets(self.dev.device, 1, [write], 0, None)
        self._grid = None  # the recorded command buffer refers to the old descriptor contents
        return buf

    def _record(self, grid: tuple[int, int, int]) -> None:
        vk = self.dev.vk
        vk.vkResetCommandBuffer(self.cmd, 0)
        vk.vkBeginCommandBuffer(self.cmd, vk.VkCommandBufferBeginInfo())
        vk.vkCmdBindPipeline(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline)
        vk.vkCmdBindDescriptorSets(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1, [self.set], 0, None)
        vk.vkCmdDispatch(self.cmd, *grid)
        barrier = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkCmdPipelineBarrier(self.cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, [barrier], 0, None, 0, None)
        vk.vkEndCommandBuffer(self.cmd)
        self._grid = grid

    def run(self, grid: tuple[int, ...] | int, buffers: dict[str, np.ndarray], scalars: dict[str, float | int] | None = None) -> None:
        """Dispatch ``grid`` workgroups with ``buffers`` (by parameter name) and ``scalars``; the writable
        buffers' final contents are copied back into the given arrays."""
        vk, k = self.dev.vk, self.kernel
        if self.fence is None:
            raise RuntimeError(f"kernel {k.name}: the Vulkan kernel is closed")
        g = (grid,) if isinstance(grid, int) else tuple(grid)
        g3 = (tuple(int(x) for x in g) + (1, 1, 1))[:3]
        if len(g) > 3 or min(g3) < 1:
            raise ValueError(f"kernel {k.name}: grid {grid} must be 1 to 3 positive workgroup counts")
        names = {p.name for p in k.buffers}
        if set(buffers) != names:
            raise ValueError(f"kernel {k.name}: buffers {sorted(buffers)} do not match its buffer parameters {sorted(names)}")
        arrays: dict[str, np.ndarray] = {}
        for binding, name, t, writable in self.bindings:
            if name == SCALARS:
                data = scalar_words(k, scalars or {})
            else:
                a = buffers[name]
                if not isinstance(a, np.ndarray) or a.dtype != _NUMPY[t.name]:
                    raise TypeError(
                        f"kernel {k.name}: buffer '{name}' must be a numpy {np.dtype(_NUMPY[t.name])} array, got {getattr(a, 'dtype', type(a).__name__)}"
                    )
                if writable and not (a.flags.writeable and a.flags.c_contiguous):
                    raise ValueError(f"kernel {k.name}: output buffer '{name}' must be a writable C-contiguous array")
                data = arrays[name] = a
            buf = self._bind(name, binding, data.nbytes)
            buf.view(np.uint8)[: data.nbytes] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if self._grid != g3:
            self._record(g3)
        vk.vkQueueSubmit(self.dev.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[self.cmd])], self.fence)
        vk.vkWaitForFences(self.dev.device, 1, [self.fence], vk.VK_TRUE, WHOLE_SIZE)
        vk.vkResetFences(self.dev.device, 1, [self.fence])
        for _, name, t, writable in self.bindings:
            if writable:
                a = arrays[name]
                a.reshape(-1)[:] = self.buffers[name].view(a.dtype)[: a.size]

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the pipeline, its buffers and every other Vulkan object of this kernel (idempotent)."""
        vk, d = self.dev.vk, self.dev.device
        if d is None:
            return
        if self.fence is not None:
            vk.vkQueueWaitIdle(self.dev.queue)
        for buf in self.buffers.values():
            buf.close()
        self.buffers.clear()
        for attr, destroy in (
            ("fence", vk.vkDestroyFence),
            ("cmd_pool", vk.vkDestroyCommandPool),
            ("pool", vk.vkDestroyDescriptorPool),
            ("pipeline", vk.vkDestroyPipeline),
            ("layout", vk.vkDestroyPipelineLayout),
            ("set_layout", vk.vkDestroyDescriptorSetLayout),
            ("module", vk.vkDestroyShaderModule),
        ):
            obj = getattr(self, attr)
            if obj is not None:
                destroy(d, obj, None)  # a command pool frees its command buffer, a descriptor pool its set
                setattr(self, attr, None)
        if self in self.dev._kernels:
            self.dev._kernels.remove(self)

    def __enter__(self) -> "VulkanKernel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kernel_runner(device: VulkanDevice):  # type: ignore[no-untyped-def]
    """``run(kernel, grid, buffers, scalars)`` on ``device`` for the kernel tests: SPIR-V from codegen,
    one pipeline per kernel kept for reuse, writable buffers copied back into the arrays."""
    from poot.backend import compile_kernel, spirv_target

    loaded: dict[str, VulkanKernel] = {}

    def run(k: Kernel, grid, buffers, scalars) -> None:  # type: ignore[no-untyped-def]
        key = repr(k)
        vk = loaded.get(key)
        if vk is None:
            vk = loaded[key] = VulkanKernel(k, compile_kernel(k, spirv_target(device.subgroup)).data, device)
        vk.run(tuple(grid), {p.name: buffers[p.name] for p in k.buffers}, dict(scalars))

    return run
