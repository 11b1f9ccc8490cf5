"""poot-rocm: AMD GPUs through linked AMDGCN code objects and hip-python."""

from .device import rocm_devices

__all__ = ["rocm_devices"]
