"""poot-ptx: NVIDIA GPUs through PTX from LLVM's NVPTX target and cuda-python's driver API."""

from .device import cuda_devices

__all__ = ["cuda_devices"]
