"""The typed errors poot raises. Every error says what went wrong and, where it can, what to do next."""

from __future__ import annotations

__all__ = [
    "PootError",
    "GraphError",
    "ShapeError",
    "VerifyError",
    "Refusal",
    "DeviceError",
    "UnknownDevice",
    "DeviceUnavailable",
    "PluginError",
    "LoadError",
    "ParameterError",
    "PootWarning",
]


class PootError(Exception):
    """Base class of every error poot raises on purpose."""


class PootWarning(UserWarning):
    """Something poot does as asked but that the user should know: a context past the model's
    trained length, a checkpoint quirk it worked around. The CLI prints these as ``poot: warning:``."""


class GraphError(PootError):
    """A graph is malformed: a bad op, attribute or operand."""


class ShapeError(GraphError):
    """Shapes or dtypes of an op's operands do not fit together."""


class VerifyError(GraphError):
    """The graph verifier found a broken invariant (raised after the pass that broke it)."""


class Refusal(PootError):
    """A device cannot do something a graph or kernel asks for. Raised at compile time, never guessed around.

    ``op`` names what was refused, ``device`` where, ``reason`` why.
    """

    def __init__(self, op: str, device: str, reason: str) -> None:
        self.op, self.device, self.reason = op, device, reason
        super().__init__(f"{device} refuses {op}: {reason}")


class DeviceError(PootError):
    """Something about a device name or device selection is wrong."""


class UnknownDevice(DeviceError):
    """A device name that no installed plugin offers."""


class DeviceUnavailable(DeviceError):
    """A known device that cannot run on this machine (the reason says why)."""


class PluginError(PootError):
    """A plugin failed to load or registered something invalid."""


class ParameterError(PootError):
    """A parameter out of range (sampling, a request, a load or plan option); ``name`` says which."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(f"{name}: {message}")


class LoadError(PootError):
    """A checkpoint (or model source) cannot be loaded. Names the file and what is wrong with it."""

    def __init__(self, file: object, what: str) -> None:
        self.file, self.what = str(file), what
        super().__init__(f"{file}: {what}")
