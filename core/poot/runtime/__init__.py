"""The runtime contracts: devices (and, with the planner, executors)."""

from .device import Availability, Capabilities, Device, Unavailable
from .devices import NULL_KIND, get_device, list_devices, normalize_name, null_devices

__all__ = ["Availability", "Capabilities", "Device", "Unavailable", "get_device", "list_devices", "normalize_name", "null_devices", "NULL_KIND"]
