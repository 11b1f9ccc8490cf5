"""poot-wgpu: WebGPU adapters through wgpu-py (wgpu-native)."""

from .device import wgpu_devices

__all__ = ["wgpu_devices"]
