"""The AIE compile stages as typed, serializable values.

- ``AieCoreObject``: one looped kernel (``poot.backend.grid_to_loops``) compiled for an AIE core.
- ``LinkRecipe``: what goes on which core (each core runs a range of the launch's workgroups),
  where each buffer lives, and the toolchain invocation that links them.
- ``LinkedArtifact``: the linked binary with its ``ShapeAbi`` per launch: the argument order, each
  buffer's element type, symbolic shape and row-major strides as the plan's graph gives them, the
  scalars the looped form adds (the grid and the range of workgroups, ``GROUPS``), and the tiles
  (workgroups) at the step the plan was described for. ``check_abi`` holds an ABI against the
  plan it came from.

Each value round-trips through JSON (``to_json`` / ``from_json``; bytes as base64), so a recipe
made where the plan is can be linked where the toolchain is, and an artifact loaded where the NPU is.
"""

from __future__ import annotations

import base64
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from poot.backend import GROUPS, Buffer, Plan
from poot.errors import PootError

__all__ = [
    "AbiArg",
    "ShapeAbi",
    "AieCoreObject",
    "CorePlacement",
    "BufferPlacement",
    "LinkRecipe",
    "LinkedArtifact",
    "shape_abi",
    "check_abi",
    "to_json",
    "from_json",
]


@dataclass(frozen=True)
class AbiArg:
    name: str
    kind: str  # "buffer" | "scalar" | "groups" (the looped form's grid and range)
    dtype: str
    shape: tuple[str, ...] = ()  # symbolic dimensions ("tokens", "576"); a scalar's: ()
    strides: tuple[str, ...] = ()  # row-major, in elements, symbolic
    written: bool = False


@dataclass(frozen=True)
class ShapeAbi:
    launch: int  # its index among the plan's launches
    kernel: str  # the looped kernel's name
    args: tuple[AbiArg, ...]
    threads: int  # the original workgroup's threads, one loop in the looped form
    tiles: int  # workgroups at ``env``
    env: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AieCoreObject:
    kernel: str
    target: str
    toolchain: str
    data: bytes


@dataclass(frozen=True)
class CorePlacement:
    kernel: str
    column: int
    row: int
    groups: tuple[int, int]  # the workgroups [start, stop) it runs, at the ABI's env


@dataclass(frozen=True)
class BufferPlacement:
    name: str
    memory: str  # "host" (DDR, through the shim DMA) | "memtile" | "core"
    nbytes: int


@dataclass(frozen=True)
class LinkRecipe:
    artifact: str
    target: str
    cores: tuple[CorePlacement, ...]
    buffers: tuple[BufferPlacement, ...]
    objects: tuple[AieCoreObject, ...]
    command: tuple[str, ...]  # the link invocation, objects and output as {objects} / {output}


@dataclass(frozen=True)
class LinkedArtifact:
    recipe: LinkRecipe
    abi: tuple[ShapeAbi, ...]
    data: bytes


def _encode(v: Any) -> Any:
    if is_dataclass(v):
        return {f.name: _encode(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, bytes):
        return {"base64": base64.b64encode(v).decode()}
    if isinstance(v, tuple):
        return [_encode(x) for x in v]
    return v


def _decode(tp: Any, v: Any) -> Any:
    origin = typing.get_origin(tp)
    if is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        missing = [f.name for f in fields(tp) if f.name not in v]
        if missing:
            raise PootError(f"{tp.__name__}: the JSON lacks {missing}")
        return tp(**{f.name: _decode(hints[f.name], v[f.name]) for f in fields(tp)})
    if tp is bytes:
        return base64.b64decode(v["base64"])
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], x) for x in v)
        return tuple(_decode(a, x) for a, x in zip(args, v))
    if origin in (typing.Union, types.UnionType):
        return v
    return tp(v)


def to_json(value: Any) -> str:
    return json.dumps({"type": type(value).__name__, "value": _encode(value)})


def from_json(text: str) -> Any:
    """A stage value from ``to_json``'s text; PootError naming what is malformed."""
    try:
        doc = json.loads(text)
        tp = {c.__name__: c for c in (AieCoreObject, LinkRecipe, LinkedArtifact, ShapeAbi)}[doc["type"]]
        return _decode(tp, doc["value"])
    except (KeyError, TypeError, ValueError) as e:
        raise PootError(f"not an AIE stage in JSON: {e}") from None


def _strides(shape: tuple[str, ...]) -> tuple[str, ...]:
    out, acc = [], "1"
    for d in reversed(shape):
        out.append(acc)
        acc = d if acc == "1" else (acc if d == "1" else f"{d}*{acc}")
    return tuple(reversed(out))


def shape_abi(plan: Plan, index: int, env: Mapping[str, int]) -> ShapeAbi:
    """The shape ABI of launch ``index`` of ``plan`` in its looped form."""
    launch = plan.launches[index]
    types_ = {(n.id, v.index): v for n in plan.graph.nodes for v in n.outputs}
    args = []
    for p in launch.kernel.params:
        if isinstance(p, Buffer):
            ref = launch.buffers[p.name]
            if isinstance(ref, np.ndarray):
                shape = tuple(str(d) for d in ref.shape)
            elif ref in plan.scratch:
                shape = ("scratch",)
            else:
                shape = tuple(str(d) for d in types_[ref].shape)  # type: ignore[index]
            args.append(AbiArg(p.name, "buffer", p.dtype.name, shape, _strides(shape), not p.readonly))
        else:
            args.append(AbiArg(p.name, "scalar", p.dtype.name))
    args += [AbiArg(n, "groups", "i32") for n in GROUPS]
    grid = launch.grid(env)
    return ShapeAbi(index, f"{launch.kernel.name}_loops", tuple(args), launch.kernel.threads, int(np.prod(grid)), tuple(sorted(env.items())))


def check_abi(abi: ShapeAbi, plan: Plan) -> None:
    """PootError where ``abi`` is not that of its launch of ``plan`` (argument order, types,
    shapes, strides, tiles at its env)."""
    want = shape_abi(plan, abi.launch, dict(abi.env))
    if want != abi:
        diff = [f.name for f in fields(ShapeAbi) if getattr(want, f.name) != getattr(abi, f.name)]
        raise PootError(f"the shape ABI of launch {abi.launch} ({abi.kernel}) differs from its plan's in {diff}")
