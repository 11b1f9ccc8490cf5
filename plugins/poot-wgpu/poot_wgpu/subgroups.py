"""The subgroup width of a WebGPU adapter, measured.

WebGPU reports a range of subgroup sizes (wgpu: 4 to 128 on every Vulkan adapter), while poot's
kernels are compiled for one width (``codegen.spirv_target(n)``). So the width is measured once per
adapter and driver: a probe kernel of 128 threads writes what a subgroup sum of ones gives each
thread, and its lane id. The adapter's kernels may use subgroup operations of width ``n`` when every
thread saw ``n`` (a power of two from 4 to 128) and lane ``t mod n``: full subgroups of consecutive
threads. Otherwise (no ``subgroup`` feature, naga refusing the module, uneven subgroups) the width is
1 and kernels use none. Measured results are kept in ``cache_dir()/wgpu/subgroups.json``; a probe
that could not run (naga or the driver refusing it, the device lost) is tried again next time.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from poot.backend import Out, cache_dir, i32, kernel

__all__ = ["subgroup_width", "FEATURE"]

FEATURE = "subgroup"
_THREADS = 128


@kernel(workgroup=(_THREADS, 1, 1))
def _probe(y: Out[i32]):
    t = thread_id(0)
    y[2 * t] = subgroup_add(i32(1))
    y[2 * t + 1] = lane_id()


def _key(adapter: Any) -> str:
    """The adapter, its driver and the codegen that compiled the probe."""
    from poot.backend import CODEGEN_VERSION

    info = adapter.info
    return "|".join([str(info.get(k, "")) for k in ("vendor_id", "device_id", "device", "description", "backend_type")] + [str(CODEGEN_VERSION)])


def subgroup_width(adapter: Any) -> int:
    """The subgroup width kernels may use on ``adapter`` (a wgpu GPUAdapter), 1 for none."""
    if FEATURE not in adapter.features:
        return 1
    path = cache_dir() / "wgpu" / "subgroups.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    key = _key(adapter)
    if isinstance(known.get(key), int):
        return known[key]
    width = _measure(adapter)
    if width is None:  # not measured: not remembered either
        return 1
    known[key] = width
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, path)
    return width


def _measure(adapter: Any) -> int | None:
    """The width the probe saw (1 for uneven or partial subgroups), None where it could not run."""
    import wgpu

    from poot.backend import SPIRV_ENTRY as ENTRY
    from poot.backend import compile_kernel, spirv_target
    from poot.backend import spirv_for_wgpu as for_wgpu

    try:
        dev = adapter.request_device_sync(required_features=[FEATURE])
        code = for_wgpu(compile_kernel(_probe.instantiate(), spirv_target(2)).data)
        pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=code), "entry_point": ENTRY})
        out = dev.create_buffer(size=8 * _THREADS, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = dev.create_bind_group(
            layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": out, "offset": 0, "size": out.size}}]
        )
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipe)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(1, 1, 1)
        cpass.end()
        dev.queue.submit([enc.finish()])
        got = np.frombuffer(dev.queue.read_buffer(out), np.int32).reshape(_THREADS, 2)
    except Exception:  # noqa: BLE001 - naga, the driver or the device refused the probe: no subgroup operations now
        return None
    n = int(got[0, 0])
    if not 4 <= n <= _THREADS or n & (n - 1):
        return 1
    if (got[:, 0] != n).any() or (got[:, 1] != np.arange(_THREADS) % n).any():
        return 1
    return n
