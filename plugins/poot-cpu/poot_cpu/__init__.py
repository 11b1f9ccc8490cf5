"""poot-cpu: the host CPU as a poot device, the embedded default."""

from .device import host_device

__all__ = ["host_device"]
