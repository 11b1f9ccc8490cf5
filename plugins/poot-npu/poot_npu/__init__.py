"""poot-npu (experimental): AMD XDNA2 and Intel NPU4 neural processing units."""

from .device import npu_devices

__all__ = ["npu_devices"]
