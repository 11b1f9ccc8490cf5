"""Chat templates: jinja2 in an immutable sandbox, with the globals and filters HF templates use.

A template inside a downloaded model is untrusted code: it runs in ``ImmutableSandboxedEnvironment``,
sees only plain JSON-like data, cannot set underscore attributes on namespaces, and any error it
raises (including its own ``raise_exception``) is a ``ChatTemplateError`` naming the template line.
Rendering options follow Hugging Face's (trim_blocks, lstrip_blocks, loop controls, a
``{% generation %}`` block, ``tojson`` without HTML escaping) so templates render identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import PootError

__all__ = ["ChatTemplate", "ChatTemplateError"]


class ChatTemplateError(PootError):
    """A chat template failed to compile or to render."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text in HF templates; it renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing underscore names (no reaching CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for k in attrs:
            _Namespace._check(k)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"templates cannot set underscore attributes ({name!r}) on a namespace")


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _plain(value: Any, where: str = "input") -> Any:
    """Only JSON-like data reaches a template: objects with methods never do."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise ChatTemplateError(f"{where}: a {type(value).__name__} cannot be passed to a chat template (use JSON types)")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    return env


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: Mapping[str, str | None] | None = None, name: str = "chat template") -> None:
        self.source, self.name = source, name
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{name} line {e.lineno}: {e.message}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages`` (dicts with 'role' and 'content', maybe 'tool_calls')."""
        try:
            msgs = _plain(list(messages), "messages")
        except RecursionError:
            raise ChatTemplateError("messages are nested too deeply for a chat template") from None
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or "role" not in m:
                raise ChatTemplateError(f"messages[{i}] must be an object with a 'role'")
        context = dict(self.special_tokens)
        try:
            context.update(_plain(extra, "template variables"))
            context.update(messages=msgs, tools=_plain(tools, "tools"), documents=_plain(documents, "documents"), add_generation_prompt=add_generation_prompt)
        except RecursionError:
            raise ChatTemplateError("tools or documents are nested too deeply for a chat template") from None
        try:
            return self._template.render(**context)
        except jinja2.exceptions.TemplateError as e:  # includes the template's own raise_exception
            raise ChatTemplateError(f"{self.name}: {e.message or type(e).__name__}") from None
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ArithmeticError,
            RecursionError,
        ) as e:  # (ArithmeticError: division by zero, an overflow, a range past the sandbox's limit)
            raise ChatTemplateError(f"{self.name} failed while rendering: {type(e).__name__}: {e}") from None
