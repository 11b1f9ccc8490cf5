"""poot: a language-model compiler and runtime. Core is device-free; backends and model families are plugins."""

from .errors import DeviceUnavailable, PootError, Refusal, UnknownDevice
from .hookspecs import hookimpl
from . import kernel  # noqa: E402  - ``@poot.kernel`` (the package is callable as the decorator)

__version__ = "0.1.0"
__all__ = ["kernel", "hookimpl", "PootError", "Refusal", "UnknownDevice", "DeviceUnavailable", "__version__"]
