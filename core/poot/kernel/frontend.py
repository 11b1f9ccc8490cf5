"""``@poot.kernel``: Python functions in a restricted subset, read from their source into Kernel IR.

    from poot.kernel import kernel, In, Out, Const, f32, i32, group_id, thread_id, shared, barrier

    @kernel(workgroup=("BLOCK", 1, 1))
    def scale_rows(x: In[f32], y: Out[f32], cols: i32, alpha: f32, BLOCK: Const = 128):
        row = group_id(0)
        for c in range(thread_id(0), cols, BLOCK):
            y[row * cols + c] = x[row * cols + c] * alpha

Parameters annotated ``In[T]``/``Out[T]`` are buffers (``In["WT"]``: of the type the constant ``WT``
names), a dtype (``f32``, ``i32`` ...) a run-time
scalar, ``Const`` a compile-time constant bound by ``.instantiate(NAME=value)``; ``if`` on constants
and ``static_range`` are resolved at compile time, so templates specialise cleanly. Statement
helpers: ``barrier()``, ``atomic_add(buf, i, v)``, ``a, b, c, d = vload(buf, i)`` / ``vstore(buf, i,
a, b, c, d)``, ``reduce_shared(arr, "add")`` (a barrier, then a tree reduction leaving the result in
``arr[0]``), ``reduce_argmax(values, ids)`` (the largest value and its id, ties to the lower id, left
in ``values[0]`` and ``ids[0]``), ``mma_tile(a, b, c)``, ``dot_bytes(acc, i, a, j, b, l, lanes)`` (i32
workgroup arrays: each of ``lanes`` lanes of ``acc`` from ``i`` plus the dot product of the unsigned
bytes of ``a``'s lane with the signed bytes of ``b``'s: ``vpdpbusd`` on VNNI hosts); ``dequant(QTYPE,
buf, row, k)`` reads packed weights, ``load_word(buf, i)`` four bytes of a u8 buffer as an i32, and
``fma(a, b, c)`` rounds ``a * b + c`` once on every target; ``spread_bits(arr, i, lo, hi, shift)``
puts 64 bits in the bytes of 16 i32 lanes, and ``prefetch(buf, i, nbytes)`` asks for memory soon
read (a hint: the host's cache lines, a bulk copy engine's, or nothing). Integer ``//`` and ``%`` truncate toward zero, as in C. Anything outside the subset is a ``KernelSyntaxError``
naming the file and line.

A computation several kernels share is written once as an ``@inline`` function of values, which a
kernel calls as an expression; each call is expanded in place (``translate.InlineFunction``):

    @inline
    def squash(v: f32, limit: f32) -> f32:
        return limit * tanh(v / limit)

The translation itself (syntax tree to Kernel IR) is ``poot.kernel.translate``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from ..graph.dtypes import DType
from . import ir
from .translate import DTYPES as _DTYPES
from .translate import Context, InlineFunction, KernelSyntaxError, translate
from .verify import verify_kernel

__all__ = ["kernel", "inline", "KernelTemplate", "KernelSyntaxError", "InlineFunction", "In", "Out", "Const"]


class _BufferAnn:
    def __init__(self, readonly: bool, dtype: DType | str | None = None) -> None:
        self.readonly, self.dtype = readonly, dtype

    def __getitem__(self, dtype: DType | str) -> "_BufferAnn":
        return _BufferAnn(self.readonly, dtype)


In = _BufferAnn(True)
Out = _BufferAnn(False)


class _ConstAnn:
    def __getitem__(self, _: Any) -> "_ConstAnn":
        return self


Const = _ConstAnn()


def _source(fn: Callable[..., Any], what: str) -> tuple[ast.FunctionDef, str, int]:
    """``fn``'s syntax tree, file and first line (``what`` names the decorator in errors)."""
    try:
        src = inspect.getsource(fn)
        file = inspect.getsourcefile(fn) or "<kernel>"
        _, line0 = inspect.getsourcelines(fn)
    except (OSError, TypeError) as e:
        raise KernelSyntaxError(f"cannot read the source of {fn.__qualname__}: {e}") from None
    fdef = ast.parse(textwrap.dedent(src)).body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise KernelSyntaxError(f"{file}:{line0}: {what} decorates a plain function")
    return fdef, file, line0  # node.lineno counts from the first line getsourcelines returned (line0)


class KernelTemplate:
    """A kernel as written; ``instantiate(**constants)`` gives verified Kernel IR."""

    def __init__(self, fn: Callable[..., Any], workgroup: tuple[int | str, int | str, int | str], name: str | None, loop_vectorize: bool = True) -> None:
        self.fn, self.workgroup, self.loop_vectorize = fn, workgroup, loop_vectorize
        self._instances: dict[tuple[tuple[str, str], ...], ir.Kernel] = {}
        self.name = name or fn.__name__
        sig = inspect.signature(fn)
        hints = inspect.get_annotations(fn, eval_str=True)
        self.params: list[tuple[str, Any, Any]] = []
        for p in sig.parameters.values():
            ann = hints.get(p.name)
            if ann is None:
                raise KernelSyntaxError(
                    f"{self.file}:{self.line0 + self.tree.lineno - 1}: parameter '{p.name}' needs an annotation (In[T], Out[T], a dtype, or Const)"
                )
            self.params.append((p.name, ann, p.default))

    @functools.cached_property
    def _parsed(self) -> tuple[ast.FunctionDef, str, int]:
        # read when first instantiated, not when the module defining the kernel is imported: a
        # process that loads a model from the kernel cache instantiates few of the library's kernels
        return _source(self.fn, "@kernel")

    @property
    def tree(self) -> ast.FunctionDef:
        return self._parsed[0]

    @property
    def file(self) -> str:
        return self._parsed[1]

    @property
    def line0(self) -> int:
        return self._parsed[2]

    def instantiate(self, **constants: Any) -> ir.Kernel:
        """Kernel IR for these compile-time constants (the same constants give the same, cached, kernel)."""
        key = tuple(sorted((k, repr(v)) for k, v in constants.items()))
        done = self._instances.get(key)
        if done is None:
            done = self._instances[key] = self._instantiate(**constants)
        return done

    def _instantiate(self, **constants: Any) -> ir.Kernel:
        consts: dict[str, Any] = {}
        buffers: dict[str, ir.Buffer] = {}
        scalars: dict[str, DType] = {}
        order: list[ir.Param] = []
        for name, ann, default in self.params:
            if isinstance(ann, _ConstAnn):
                if name in constants:
                    consts[name] = constants.pop(name)
                elif default is not inspect.Parameter.empty:
                    consts[name] = default
                else:
                    raise KernelSyntaxError(f"kernel {self.name}: compile-time constant '{name}' has no value")
            elif isinstance(ann, _BufferAnn):
                if ann.dtype is None:
                    raise KernelSyntaxError(f"kernel {self.name}: buffer '{name}' needs its element type, e.g. In[f32]")
                etype = ann.dtype
                if isinstance(etype, str):  # In["WT"]: the element type is the compile-time constant WT
                    named = constants.get(etype, next((d for n2, a2, d in self.params if n2 == etype and isinstance(a2, _ConstAnn)), None))
                    if named is None or str(named) not in _DTYPES:
                        raise KernelSyntaxError(f"kernel {self.name}: buffer '{name}' takes its type from '{etype}', which names no dtype ({named!r})")
                    etype = _DTYPES[str(named)]
                buffers[name] = ir.Buffer(name, etype, ann.readonly)
                order.append(buffers[name])
            elif isinstance(ann, DType):
                scalars[name] = ann
                order.append(ir.ScalarParam(name, ann))
            else:
                raise KernelSyntaxError(f"kernel {self.name}: parameter '{name}' has annotation {ann!r}; use In[T], Out[T], a dtype or Const")
        if constants:
            raise KernelSyntaxError(f"kernel {self.name}: unknown constants {sorted(constants)}")
        ctx = Context(self.file, self.line0, consts, buffers, scalars, {}, {}, names=self.fn.__globals__)
        body = translate(ctx, self.tree.body)
        wg = tuple(consts[w] if isinstance(w, str) else w for w in self.workgroup)
        defaults = {name: d for name, ann, d in self.params if isinstance(ann, _ConstAnn)}
        # numbers name every instance; a string (a dtype, an op) only where it is not the default
        suffix = "_".join(f"{k}{v}" for k, v in sorted(consts.items()) if isinstance(v, (int, bool)) or (isinstance(v, str) and v != defaults.get(k)))
        name = f"{self.name}_{suffix}" if suffix else self.name
        k = ir.Kernel(name, tuple(order), tuple(body), wg, tuple(ctx.shared.values()), loop_vectorize=self.loop_vectorize)  # type: ignore[arg-type]
        verify_kernel(k)
        return k


def kernel(fn: Callable[..., Any] | None = None, *, workgroup: tuple = (64, 1, 1), name: str | None = None, loop_vectorize: bool = True) -> Any:
    """Decorator: turn a Python function in the kernel subset into a KernelTemplate (``loop_vectorize``:
    whether LLVM's loop vectorizer runs on its instances, ``Kernel.loop_vectorize``)."""

    def wrap(f: Callable[..., Any]) -> KernelTemplate:
        return KernelTemplate(f, workgroup, name, loop_vectorize)

    return wrap(fn) if fn is not None else wrap


def inline(fn: Callable[..., Any]) -> InlineFunction:
    """Decorator: a function in the kernel subset that kernels call as an expression, expanded in
    place at each call (``InlineFunction``): ``@inline def gumbel(u: f32) -> f32: ... return -log(-log(u))``."""
    tree, file, line0 = _source(fn, "@inline")
    return InlineFunction(fn, tree, file, line0, inspect.get_annotations(fn, eval_str=True))
