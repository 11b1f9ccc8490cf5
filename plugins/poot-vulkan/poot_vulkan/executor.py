"""The Vulkan executor: a plan's kernels as compute pipelines (SPIR-V from codegen, created once),
weights, constants and KV pools in storage buffers bound once, and each captured step one recorded
command buffer (a descriptor set per launch pointing into the step's activation arena, a scalar-word
region per launch, a memory barrier between dispatches) that ``replay`` resubmits after writing the
step's inputs. Values a launch reads are bound at their storage's offset, so the arena's slots
are aligned to the device's ``minStorageBufferOffsetAlignment`` (at least 64 bytes).

Memory: weights, constants, KV pools, the activation arena and the scalar words live in
device-local memory. On a discrete GPU that memory cannot be mapped: it is written through a staging
buffer by copy commands, and the step's outputs are copied into host-visible read-back buffers by the
step's own command buffer (outputs up to ``EAGER_READBACK`` bytes; larger ones, the logits, are
copied back when read). Step inputs stay in host-visible memory, written in place before each replay.
On lavapipe and integrated GPUs device-local memory is host-visible: everything is mapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poot.backend import (
    EAGER_READBACK,
    Executor,
    Kernel,
    Plan,
    StoragePlan,
    checked_pool,
    checked_weight,
    compile_kernel,
    compile_kernels,
    compile_progress,
    computed_outputs,
    get_device,
    plan_storage,
    require_pools,
    scalar_block,
    spirv_target,
    storage_dtype,
    value_region,
)
from poot.backend import SPIRV_SCALARS as SCALARS
from poot.backend import spirv_bindings as bindings
from poot.backend import spirv_scalar_words as scalar_words
from poot.errors import PootError

from .runtime import WHOLE_SIZE, DeviceBuffer, HostBuffer, VulkanDevice, storage_buffer

__all__ = ["VulkanExecutor"]

Key = tuple[int, int]


class _Pipeline:
    """A compute pipeline and its descriptor-set layout for one kernel."""

    def __init__(self, dev: VulkanDevice, kernel: Kernel) -> None:
        vk, d = dev.vk, dev.device
        self.dev, self.kernel = dev, kernel
        self.bindings = bindings(kernel)
        self.module = self.set_layout = self.layout = self.pipeline = None
        code = compile_kernel(kernel, spirv_target(self.dev.subgroup)).data
        try:
            self.module = vk.vkCreateShaderModule(d, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
            slots = [
                vk.VkDescriptorSetLayoutBinding(
                    binding=b, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT
                )
                for b, *_ in self.bindings
            ]
            self.set_layout = vk.vkCreateDescriptorSetLayout(d, vk.VkDescriptorSetLayoutCreateInfo(pBindings=slots), None)
            self.layout = vk.vkCreatePipelineLayout(d, vk.VkPipelineLayoutCreateInfo(pSetLayouts=[self.set_layout]), None)
            self.pipeline = dev.compute_pipeline(kernel, self.module, self.layout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        vk, d = self.dev.vk, self.dev.device
        for attr, destroy in (
            ("pipeline", vk.vkDestroyPipeline),
            ("layout", vk.vkDestroyPipelineLayout),
            ("set_layout", vk.vkDestroyDescriptorSetLayout),
            ("module", vk.vkDestroyShaderModule),
        ):
            obj = getattr(self, attr)
            if obj is not None:
                destroy(d, obj, None)
                setattr(self, attr, None)


@dataclass
class VulkanStep:
    storage: StoragePlan
    arena: HostBuffer | DeviceBuffer
    inputs: dict[str, tuple[HostBuffer, np.dtype, tuple[int, ...]]]
    outputs: dict[str, tuple[HostBuffer | DeviceBuffer, int, np.dtype, tuple[int, ...]]]  # buffer, byte offset, dtype, shape
    scalars: HostBuffer | DeviceBuffer
    pool: Any  # descriptor pool (frees the step's sets)
    cmd_pool: Any
    cmd: Any
    launches: int
    binding: int
    names: list[str] = field(default_factory=list)
    owned: list[HostBuffer | DeviceBuffer] = field(default_factory=list)
    dispatches: list[tuple[Any, Any, tuple[int, int, int]]] = field(default_factory=list)  # pipeline, set, grid (per launch)


class VulkanExecutor(Executor):
    def __init__(self, plan: Plan, threads: int | None = None, progress: bool = False, staged: bool | None = None) -> None:
        """``staged``: None places buffers as the device's memory wants (``storage_buffer``); True
        writes and reads every device buffer through staging even where it could be mapped."""
        super().__init__(plan)
        self.staged = staged
        device = get_device(plan.device)
        if device.kind != "vulkan" or not isinstance(device.index, int):
            raise PootError(f"the Vulkan executor runs plans made for a vulkan device, not {plan.device}")
        self.dev = VulkanDevice(device.index)
        vk = self.dev.vk
        limits = vk.vkGetPhysicalDeviceProperties(self.dev.physical).limits
        self.align = max(64, int(limits.minStorageBufferOffsetAlignment))
        self.max_range = int(limits.maxStorageBufferRange)

        self._pipes: dict[int, _Pipeline] = {}
        by_value: dict[str, list[Kernel]] = {}
        for launch in plan.launches:
            by_value.setdefault(repr(launch.kernel), []).append(launch.kernel)
        try:
            # compiled side by side first (the pipelines then find them in the cache)
            compile_kernels([ks[0] for ks in by_value.values()], spirv_target(self.dev.subgroup), progress)
            for ks in compile_progress(by_value.values(), progress, len(by_value)):
                pipe = _Pipeline(self.dev, ks[0])
                for k in ks:
                    self._pipes[id(k)] = pipe
        except BaseException:
            self.close()
            raise
        g = plan.graph
        self._fixed: dict[int, HostBuffer] = {}  # id of a small array a launch names (lut, dummy) -> its buffer
        self._keep: list[np.ndarray] = []
        self._consts: dict[Key, HostBuffer] = {}
        for n in g.nodes:
            if n.op == "constant":
                self._consts[(n.id, 0)] = self._buffer(np.ascontiguousarray(n.attrs["value"].array.astype(storage_dtype(n.attrs["dtype"]))))
        self._weight_nodes = {n.attrs["name"]: n for n in g.nodes if n.op == "weight"}
        self._weights: dict[Key, HostBuffer] = {}
        self._weight_src: dict[Key, int] = {}
        self._pools: dict[Key, tuple[HostBuffer, np.ndarray]] = {}
        self._steps: dict[tuple[tuple[str, int], ...], VulkanStep] = {}
        self._binding = 0
        self.fence = vk.vkCreateFence(self.dev.device, vk.VkFenceCreateInfo(), None)

    # -- buffers --------------------------------------------------------------------------------
    def _buffer(self, a: np.ndarray | None = None, nbytes: int = 0, local: bool = True) -> Any:
        """A storage buffer of whole 32-bit words holding ``a`` (or ``nbytes`` of zeros): device-local
        (``storage_buffer``), or with ``local=False`` host-visible and mapped (step inputs, read-backs)."""
        size = a.nbytes if a is not None else nbytes
        if size > self.max_range:
            raise PootError(f"vulkan:{self.dev.index}: a buffer of {size} bytes exceeds the device's maxStorageBufferRange ({self.max_range})")
        if local:
            return storage_buffer(self.dev, size, None if a is None else np.ascontiguousarray(a), self.staged)
        buf = HostBuffer(self.dev, (size + 3) // 4 * 4)
        view = buf.view(np.uint8)
        view[:] = 0
        if a is not None and a.nbytes:
            view[: a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        return buf

    def bind(self, weights: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray] | None = None) -> None:
        for name, n in self._weight_nodes.items():
            if name not in weights:
                raise PootError(f"weight '{name}' is not bound (the plan reads it)")
            key = (n.id, 0)
            if self._weight_src.get(key) == id(weights[name]):
                continue
            a = checked_weight(name, n.outputs[0], weights[name])
            if key in self._weights:
                self._weights[key].close()
            self._weights[key] = self._buffer(a)
            self._weight_src[key] = id(weights[name])
            self._binding += 1
        inputs = self.plan.inputs
        for name, a in (pools or {}).items():
            v = inputs[name]
            key = (v.node.id, v.index)
            a = checked_pool(name, v, a)
            if key in self._pools:
                old, host = self._pools[key]
                if host is a:
                    old.write(0, a)  # the caller's copy is the truth at bind
                    continue
                old.close()
            self._pools[key] = (self._buffer(a), a)
            self._binding += 1

    def write_pool(self, name: str, index: int, values: np.ndarray) -> None:
        v = self.plan.inputs[name]
        entry = self._pools.get((v.node.id, v.index))
        if entry is None:
            raise PootError(f"pool '{name}' is not bound")
        buf, host = entry
        row = np.ascontiguousarray(values, dtype=host.dtype).reshape(host.shape[1:])
        host[index] = row
        buf.write(index * row.nbytes, row)

    # -- capture --------------------------------------------------------------------------------
    def capture(self, env: Mapping[str, int]) -> VulkanStep:
        key = tuple(sorted(env.items()))
        step = self._steps.get(key)
        if step is not None and step.binding == self._binding:
            return step
        if step is not None:
            self._free_step(step)
        vk, d = self.dev.vk, self.dev.device
        g = self.plan.graph
        sp = plan_storage(self.plan, env, alignment=self.align)
        values = {(n.id, v.index): v for n in g.nodes for v in n.outputs}
        require_pools(sp, self._pools)
        arena = self._buffer(nbytes=max(sp.arena_bytes, 16))
        owned = [arena]
        by_root: dict[Key, HostBuffer] = dict(self._weights)
        by_root.update(self._consts)
        by_root.update({k: b for k, (b, _) in self._pools.items()})
        step_inputs: dict[str, tuple[HostBuffer, np.dtype, tuple[int, ...]]] = {}
        for name, k in sp.inputs.items():
            dtype = storage_dtype(values[k].dtype)
            buf = self._buffer(nbytes=max(4, sp.nbytes(k, values[k].dtype)), local=False)
            owned.append(buf)
            step_inputs[name] = (buf, dtype, sp.shapes[k])
            by_root[k] = buf

        bound = set(self._weights) | set(self._consts) | set(self._pools)

        def where(ref: Key | np.ndarray) -> tuple[Any, int, int]:
            r = value_region(sp, values, bound, ref)
            if r.kind == "fixed":
                if id(r.array) not in self._fixed:
                    self._keep.append(r.array)  # type: ignore[arg-type]
                    self._fixed[id(r.array)] = self._buffer(np.ascontiguousarray(r.array))
                return self._fixed[id(r.array)], 0, WHOLE_SIZE
            if r.kind == "arena":
                return arena, r.offset, r.nbytes  # type: ignore[return-value]
            return by_root[r.key], 0, WHOLE_SIZE  # type: ignore[index]

        block, at = scalar_block([l.kernel for l in sp.launches], [l.scalars(env) for l in sp.launches], scalar_words, self.align)
        scal = self._buffer(block)
        owned.append(scal)
        nsets = max(1, len(sp.launches))
        ndesc = max(1, sum(len(self._pipes[id(l.kernel)].bindings) for l in sp.launches))
        pool = vk.vkCreateDescriptorPool(
            d,
            vk.VkDescriptorPoolCreateInfo(
                maxSets=nsets, pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=ndesc)]
            ),
            None,
        )
        cmd_pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=self.dev.family), None)
        try:
            cmd = vk.vkAllocateCommandBuffers(
                d, vk.VkCommandBufferAllocateInfo(commandPool=cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1)
            )[0]
            sets = []
            if sp.launches:
                layouts = [self._pipes[id(l.kernel)].set_layout for l in sp.launches]
                sets = vk.vkAllocateDescriptorSets(d, vk.VkDescriptorSetAllocateInfo(descriptorPool=pool, descriptorSetCount=len(layouts), pSetLayouts=layouts))
            writes = []
            for launch, s, (off, nbytes) in zip(sp.launches, sets, at):
                for binding, name, _t, _writable in self._pipes[id(launch.kernel)].bindings:
                    buf, o, rng = (scal, off, nbytes) if name == SCALARS else where(launch.buffers[name])
                    info = vk.VkDescriptorBufferInfo(buffer=buf.buffer, offset=o, range=rng)
                    writes.append(
                        vk.VkWriteDescriptorSet(
                            dstSet=s, dstBinding=binding, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info]
                        )
                    )
            if writes:
                vk.vkUpdateDescriptorSets(d, len(writes), writes, 0, None)
            dispatches = [
                (self._pipes[id(launch.kernel)], s, (tuple(int(x) for x in launch.grid(env)) + (1, 1, 1))[:3]) for launch, s in zip(sp.launches, sets)
            ]
            outputs: dict[str, tuple[Any, int, np.dtype, tuple[int, ...]]] = {}
            copies: list[tuple[Any, int, Any, int]] = []  # device-local output -> its read-back buffer, by the step itself
            for name, k in computed_outputs(g.outputs, sp, bound).items():
                buf, o, _ = where(k)
                dtype = storage_dtype(values[k].dtype)
                nbytes = max(4, int(np.prod(sp.shapes[k], dtype=np.int64)) * dtype.itemsize)
                if not buf.mapped and sp.roots[k] not in self._pools and nbytes <= EAGER_READBACK:
                    back = self._buffer(nbytes=nbytes, local=False)
                    owned.append(back)
                    copies.append((buf, o, back, nbytes))
                    buf, o = back, 0
                outputs[name] = (buf, o, dtype, sp.shapes[k])
            self._record(cmd, dispatches, copies=copies)
        except BaseException:
            vk.vkDestroyCommandPool(d, cmd_pool, None)
            vk.vkDestroyDescriptorPool(d, pool, None)
            for b in owned:
                b.close()
            raise
        step = VulkanStep(
            sp,
            arena,
            step_inputs,
            outputs,
            scal,
            pool,
            cmd_pool,
            cmd,
            len(sp.launches),
            self._binding,
            [l.label or l.kernel.name for l in sp.launches],
            owned,
            dispatches,
        )
        self._steps[key] = step
        return step

    def _record(
        self, cmd: Any, dispatches: list[tuple[Any, Any, tuple[int, int, int]]], queries: Any = None, copies: list[tuple[Any, int, Any, int]] = ()
    ) -> None:  # type: ignore[assignment]
        """The step's dispatches, a memory barrier between each two; with ``queries``, a timestamp
        before the first and after each; then ``copies`` (source, offset, read-back buffer, bytes) of
        device-local outputs into host-visible memory."""
        vk = self.dev.vk
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        # uploads and pool writes of earlier submissions made visible to the shaders
        uploads = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
        )
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [uploads], 0, None, 0, None)
        if queries is not None:
            vk.vkCmdResetQueryPool(cmd, queries, 0, len(dispatches) + 1)
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries, 0)
        between = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        for i, (pipe, s, grid) in enumerate(dispatches):
            if i:
                vk.vkCmdPipelineBarrier(
                    cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [between], 0, None, 0, None
                )
            if min(grid) >= 1:
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.pipeline)
                vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.layout, 0, 1, [s], 0, None)
                vk.vkCmdDispatch(cmd, *grid)
            if queries is not None:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, i + 1)
        if copies:
            to_copy = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT)
            vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, [to_copy], 0, None, 0, None)
            for src, off, dst, nbytes in copies:
                vk.vkCmdCopyBuffer(cmd, src.buffer, dst.buffer, 1, [vk.VkBufferCopy(srcOffset=off, dstOffset=0, size=nbytes)])
            to_host = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
            vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, [to_host], 0, None, 0, None)
        else:
            to_host = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
            vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, [to_host], 0, None, 0, None)
        vk.vkEndCommandBuffer(cmd)

    def profile(self, step: VulkanStep, inputs: Mapping[str, np.ndarray], repeat: int = 3) -> list[tuple[str, float]]:
        """Seconds per launch from timestamp queries (median of ``repeat`` runs of the step), in plan
        order; the differences of consecutive timestamps, so a launch includes its barrier."""
        vk, d = self.dev.vk, self.dev.device
        props = vk.vkGetPhysicalDeviceProperties(self.dev.physical)
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.dev.physical)
        if not families[self.dev.family].timestampValidBits:
            raise PootError(f"vulkan:{self.dev.index} ({self.dev.name}): its compute queue has no timestamps")
        n = len(step.dispatches)
        queries = vk.vkCreateQueryPool(d, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=n + 1), None)
        cmd = vk.vkAllocateCommandBuffers(
            d, vk.VkCommandBufferAllocateInfo(commandPool=step.cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1)
        )[0]
        try:
            self._record(cmd, step.dispatches, queries)
            self.replay(step, inputs)  # the inputs in place (and a warm-up)
            times = np.zeros((repeat, n))
            for r in range(repeat):
                vk.vkQueueSubmit(self.dev.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[cmd])], self.fence)
                vk.vkWaitForFences(d, 1, [self.fence], vk.VK_TRUE, WHOLE_SIZE)
                vk.vkResetFences(d, 1, [self.fence])
                data = vk.ffi.new(f"uint64_t[{n + 1}]")
                vk.vkGetQueryPoolResults(d, queries, 0, n + 1, (n + 1) * 8, data, 8, vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
                ticks = np.frombuffer(vk.ffi.buffer(data), np.uint64).astype(np.float64)
                times[r] = np.diff(ticks) * props.limits.timestampPeriod * 1e-9
        finally:
            vk.vkFreeCommandBuffers(d, step.cmd_pool, 1, [cmd])
            vk.vkDestroyQueryPool(d, queries, None)
        return list(zip(step.names, np.median(times, axis=0).tolist()))

    # -- replay ---------------------------------------------------------------------------------
    def replay(self, step: VulkanStep, inputs: Mapping[str, np.ndarray]) -> None:
        vk = self.dev.vk
        for name, (buf, dtype, shape) in step.inputs.items():
            if name not in inputs:
                raise PootError(f"missing input '{name}'")
            a = np.asarray(inputs[name])
            if a.shape != shape:
                raise PootError(f"input '{name}' has shape {a.shape}; this step was captured for {shape}")
            buf.view(dtype)[: a.size] = a.reshape(-1)
        vk.vkQueueSubmit(self.dev.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[step.cmd])], self.fence)
        vk.vkWaitForFences(self.dev.device, 1, [self.fence], vk.VK_TRUE, WHOLE_SIZE)
        vk.vkResetFences(self.dev.device, 1, [self.fence])

    def read(self, step: VulkanStep, name: str) -> np.ndarray:
        if name not in step.outputs:
            raise PootError(f"output '{name}' is not computed in this step (its launch is conditional on the step's symbols)")
        buf, off, dtype, shape = step.outputs[name]
        v = self.plan.graph.outputs[name]
        root = step.storage.roots[(v.node.id, v.index)]
        if root in self._pools:  # a pool: refresh the caller's host copy
            pbuf, host = self._pools[root]
            host.reshape(-1)[:] = pbuf.read(0, host.nbytes).view(host.dtype)
            return host
        count = int(np.prod(shape, dtype=np.int64))
        if not buf.mapped:  # a large output (logits) only when asked for: copied back through staging now
            return buf.read(off, count * dtype.itemsize).view(dtype).reshape(shape)
        return buf.view(np.uint8)[off : off + count * dtype.itemsize].view(dtype).reshape(shape).copy()

    # -- lifetime -------------------------------------------------------------------------------
    def _free_step(self, step: VulkanStep) -> None:
        vk, d = self.dev.vk, self.dev.device
        vk.vkDestroyCommandPool(d, step.cmd_pool, None)
        vk.vkDestroyDescriptorPool(d, step.pool, None)
        for b in step.owned:
            b.close()

    def close(self) -> None:
        if getattr(self, "dev", None) is None or self.dev.device is None:
            return
        vk, d = self.dev.vk, self.dev.device
        vk.vkDeviceWaitIdle(d)
        for step in getattr(self, "_steps", {}).values():
            self._free_step(step)
        self._steps = {}
        for b in list(getattr(self, "_weights", {}).values()) + list(getattr(self, "_consts", {}).values()) + list(getattr(self, "_fixed", {}).values()):
            b.close()
        for b, _ in getattr(self, "_pools", {}).values():
            b.close()
        self._weights, self._consts, self._fixed, self._pools = {}, {}, {}, {}
        seen: set[int] = set()
        for pipe in getattr(self, "_pipes", {}).values():
            if id(pipe) not in seen:
                seen.add(id(pipe))
                pipe.close()
        self._pipes = {}
        if getattr(self, "fence", None) is not None:
            vk.vkDestroyFence(d, self.fence, None)
            self.fence = None
        self.dev.close()
