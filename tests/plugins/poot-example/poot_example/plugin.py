"""Hook implementations of the example plugin, written only against poot's public API."""

from typing import Any

from poot import hookimpl
from poot.backend import Device, Unavailable
from poot.models import ModelFamily


class ExampleFamily(ModelFamily):
    name = "example"
    gguf_architectures = ("example-arch",)
    hf_architectures = ("ExampleForCausalLM",)

    def parse_config(self, checkpoint: Any) -> Any:
        return dict(checkpoint.metadata)

    def trace(self, config: Any, weights: Any, shapes: Any = None) -> Any:
        raise NotImplementedError("the example family traces no graph")


@hookimpl
def poot_devices() -> list[Device]:
    from .backend import devices

    return [Device("example", 0, "example accelerator", unavailable=Unavailable("no-device", "the example plugin has no hardware")), *devices()]


@hookimpl
def poot_codegen_target(device: Device) -> Any:
    if device.kind != "excpu":
        return None
    from .backend import baseline_target

    return baseline_target()


@hookimpl
def poot_kernel_runner(device: Device) -> Any:
    if device.kind != "excpu":
        return None
    from .backend import kernel_runner

    return kernel_runner()


@hookimpl
def poot_model_families() -> list[ModelFamily]:
    return [ExampleFamily()]
