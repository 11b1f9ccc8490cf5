"""poot: a language-model compiler and runtime. Core is device-free; backends and model families are plugins."""

from . import kernel  # noqa: E402  - ``@poot.kernel`` (the package is callable as the decorator)
from .errors import DeviceUnavailable, PootError, Refusal, UnknownDevice
from .hookspecs import hookimpl

__version__ = "0.1.0"


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``poot.load(model, device=...)`` without importing the loaders at ``import poot``."""
    if name in ("load", "llm"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'poot' has no attribute {name!r}")


__all__ = ["kernel", "load", "hookimpl", "PootError", "Refusal", "UnknownDevice", "DeviceUnavailable", "__version__"]
