"""Tool calls: telling the model about tools, constraining its output when a call is required, and
parsing calls out of its text.

A chat template that renders ``tools`` gets them as they are; for one that does not, the tools and
the call format (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the Hermes / Qwen
convention) go into a system message. ``tool_choice`` "required" or a named function constrains the
output with guided decoding to a JSON call, so the call always parses.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .protocol import ApiError

__all__ = ["check_tools", "tool_system_prompt", "forced_call_schema", "parse_tool_calls"]

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # what OpenAI takes as a function's name
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def check_tools(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Function name -> its parameters schema; a malformed tool is a 400 naming it."""
    out: dict[str, Mapping[str, Any]] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}", param=f"tools[{i}]")
        name = fn["name"]
        if not _NAME.fullmatch(name):
            raise ApiError(400, f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-', got {name[:80]!r}", param=f"tools[{i}].function.name")
        if name in out:
            raise ApiError(400, f"tools[{i}]: a second function named {name!r}", param=f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping) or params.get("type", "object") != "object":
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema of an object", param=f"tools[{i}].function.parameters")
        out[name] = params
    return out


def tool_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "You can call these functions. To call one, answer with exactly",
        '<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>',
        "Functions:",
    ]
    for t in tools:
        fn = t["function"]
        lines.append(json.dumps({"name": fn["name"], "description": fn.get("description", ""), "parameters": fn.get("parameters", {})}))
    return "\n".join(lines)


def forced_call_schema(functions: Mapping[str, Mapping[str, Any]], name: str | None) -> dict[str, Any]:
    """The JSON a required call must be: {"name": ..., "arguments": {...}} for one of ``functions``
    (or for ``name`` only). Each tool's parameters go whole under ``$defs`` (by its name, which
    needs no escaping in a JSON pointer), their local references ("#", "#/$defs/...",
    "#/definitions/...") re-rooted there, so they resolve as in the tool's own schema."""
    names = [name] if name is not None else list(functions)
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": n}, "arguments": {"$ref": f"#/$defs/{n}"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for n in names
    ]
    root = options[0] if len(options) == 1 else {"anyOf": options}
    return {**root, "$defs": {n: _rerooted(functions[n], f"#/$defs/{n}") for n in names}}


# keywords whose values are instances (data), not schemas: a "$ref" inside them is a value to keep
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# keywords whose values map names (of properties, definitions) to schemas: the names are no keywords
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


def _rerooted(node: Any, base: str) -> Any:
    """Schema ``node`` with every local JSON-pointer ``$ref`` ("#", "#/...") of its schemas, at any
    depth, made relative to ``base``; a plain-name anchor ("#name") is kept (it resolves wherever
    the schema sits), and values under ``const``, ``enum``, ``default`` and ``examples`` are data,
    kept as sent (a property that is named so is still a schema)."""
    if isinstance(node, list):
        return [_rerooted(v, base) for v in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):  # (a "#name" anchor names itself anywhere)
            out[k] = base + v[1:]
        elif k in _DATA_KEYWORDS:
            out[k] = v
        elif k in _NAMED_SCHEMAS and isinstance(v, Mapping):
            out[k] = {name: _rerooted(sub, base) for name, sub in v.items()}
        else:
            out[k] = _rerooted(v, base)
    return out


def _call(obj: Any, functions: Mapping[str, Any]) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in functions:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": args if isinstance(args, str) and _is_json(args) else json.dumps(args)},
    }


def _is_json(text: str) -> bool:
    """Whether ``text`` is JSON text (a call's arguments are sent as JSON-encoded text)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def parse_tool_calls(text: str, functions: Mapping[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content left over or None, tool calls) from a model's answer."""
    calls = []
    for m in _CALL.finditer(text):
        try:
            c = _call(json.loads(m.group(1)), functions)
        except (ValueError, RecursionError):  # (JSON nested past the parser's depth is no call either)
            c = None
        if c is not None:
            calls.append(c)
    if calls:
        rest = _CALL.sub("", text).strip()
        return (rest or None), calls
    try:  # a bare JSON call (what a required call produces)
        c = _call(json.loads(text), functions)
    except (ValueError, RecursionError):
        c = None
    return (None, [c]) if c is not None else (text, [])


def tool_calls_as_text(calls: Sequence[Mapping[str, Any]], where: str = "messages") -> str:
    """An assistant message's ``tool_calls`` written back in the call format the model was asked
    for, for a chat template that does not render ``tool_calls`` itself; arguments that are not
    JSON (or nest past the parser) as the client sent them. ``where``: the field, for errors."""
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping):
            continue
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except (ValueError, RecursionError):  # as the client sent it
            pass
        try:
            out.append(f"<tool_call>{json.dumps({'name': fn.get('name'), 'arguments': args}, ensure_ascii=False)}</tool_call>")
        except RecursionError:  # (arguments sent as an object nested past the encoder)
            raise ApiError(400, f"{where}: a call's arguments are nested too deeply", param=where) from None
    return "\n".join(out)
