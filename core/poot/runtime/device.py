"""The Device contract: a named place to run plans, its capabilities, and why it cannot run if it can't."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Capabilities", "Unavailable", "Availability", "Device", "REASONS"]

# the kinds of reason a device cannot run here
REASONS = (
    "no-binding",  # the Python binding the plugin needs is not importable
    "no-driver",  # the binding loads but the vendor driver / runtime library is missing
    "no-device",  # the driver is there but reports no device
    "unsupported",  # a device is there but poot cannot use it (architecture, API version)
    "missing-feature",  # the device lacks something every plan needs
    "plugin-error",  # the plugin itself failed while probing
)


@dataclass(frozen=True)
class Unavailable:
    """Why a device cannot run here: a reason code from ``REASONS`` and a message saying what to do."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in REASONS:
            raise ValueError(f"unknown unavailability code {self.code!r} (known: {', '.join(REASONS)})")

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class Availability:
    """``bool(device.available())`` is True when the device can run; ``reason`` says why not."""

    reason: Unavailable | None = None

    def __bool__(self) -> bool:
        return self.reason is None

    def __str__(self) -> str:
        return "available" if self.reason is None else str(self.reason)


@dataclass(frozen=True)
class Capabilities:
    """What the planner may assume about a device (read from the driver, never from its name)."""

    dtypes: frozenset[str]
    compute_units: int
    max_workgroup_size: int
    shared_memory_bytes: int
    subgroup_size: int
    memory_bytes: int
    vector_bits: int = 0
    matrix_ops: frozenset[str] = frozenset()
    details: tuple[tuple[str, str], ...] = ()
    max_buffer_bytes: int | None = None  # the largest buffer a kernel may bind (Vulkan's storage buffer range, WebGPU's binding size)
    subgroup_ops: bool = True  # kernels may reduce and shuffle across a subgroup of subgroup_size lanes
    # workgroup memory a kernel may take past shared_memory_bytes, asked for at launch (CUDA's opt-in
    # dynamic shared memory); 0: none
    dynamic_shared_bytes: int = 0

    def summary(self) -> str:
        gib = self.memory_bytes / 2**30
        parts = [
            f"{self.compute_units} CU",
            f"{gib:.1f} GiB",
            f"wg<={self.max_workgroup_size}",
            f"shared {self.shared_memory_bytes // 1024} KiB",
            f"subgroup {self.subgroup_size}" + ("" if self.subgroup_ops or self.subgroup_size <= 1 else " (no subgroup operations)"),
        ]
        if self.vector_bits:
            parts.append(f"vector {self.vector_bits}b")
        parts.append("dtypes " + ",".join(sorted(self.dtypes)))
        if self.matrix_ops:
            parts.append("matrix " + ",".join(sorted(self.matrix_ops)))
        parts += [f"{k} {v}" for k, v in self.details]
        return "; ".join(parts)


@dataclass(frozen=True)
class Device:
    """A device a plugin offers. ``index`` is None for the host CPU and for a backend's placeholder
    entry when it found no device at all (then ``unavailable`` says why)."""

    kind: str
    index: int | str | None
    description: str
    target: str | None = None  # the codegen target that lowers kernels for it
    capabilities: Capabilities | None = None
    unavailable: Unavailable | None = None
    plugin: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    def available(self) -> Availability:
        return Availability(self.unavailable)
