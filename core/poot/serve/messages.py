"""A chat request's messages checked and made what a chat template renders: roles OpenAI's API
defines, content as text (a string, text parts, an assistant's refusal parts), tool calls and tool
answers in their shapes; each fault a 400 naming the message and field. What older clients and
newer roles send is rendered as the template knows it: an assistant's legacy ``function_call`` as
its one tool call, a ``function`` message as a tool's answer, a ``developer`` message as a system
one where the template has no developer role."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .protocol import ApiError
from .tools import tool_calls_as_text

__all__ = ["ROLES", "chat_messages", "is_tool_call"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # the roles OpenAI's chat API defines


def is_tool_call(c: Any) -> bool:
    """Whether ``c`` is a tool call as a client sends it back: a function with a string name and
    its arguments as JSON text (as OpenAI returns them; an object is taken too, or none)."""
    fn = c.get("function") if isinstance(c, Mapping) else None
    return isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments", ""), (str, Mapping))


def _text(i: int, msg: Mapping[str, Any]) -> str:
    """A message's content as text: a string, or the text of its text parts joined; None (an
    assistant turn that only called tools or refused, a function's answer) as nothing, or as an
    assistant's ``refusal`` (as OpenAI returns a refused turn)."""
    role, content = msg.get("role"), msg.get("content")
    refusal = msg.get("refusal")
    if refusal is not None and (role != "assistant" or not isinstance(refusal, str)):
        why = "must be a string" if role == "assistant" else "only an assistant message may have one"
        raise ApiError(400, f"messages[{i}].refusal: {why}", param=f"messages[{i}].refusal")
    if content is None and role in ("assistant", "function"):  # (OpenAI's schema lets both be null)
        return refusal or ""
    if isinstance(content, str):
        return content
    if content is None or (content == [] and role != "assistant"):
        raise ApiError(400, f"messages[{i}]: a {role} message needs its content", param=f"messages[{i}].content")
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content")
    texts = []
    kinds = ("text", "refusal") if role == "assistant" else ("text",)  # (an assistant's refusal is its text too)
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        where = f"messages[{i}].content[{j}]"
        if kind not in kinds:
            allowed = "text and refusal content parts" if role == "assistant" else "text content parts"
            raise ApiError(400, f"{where}: only {allowed} are supported in {_a(role)} message", param=where)
        if not isinstance(part.get(kind), str):
            raise ApiError(400, f"{where}: a {kind} part's {kind} must be a string", param=where)
        texts.append(part[kind])
    return "".join(texts)


def _unicode(text: str, where: str) -> None:
    """A 400 naming ``where`` if ``text`` holds a lone surrogate (JSON's \\ud800), which the
    tokenizer would refuse naming only the prompt."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{where} is not valid Unicode: {e.reason} at character {e.start}", param=where) from None


def _a(role: str) -> str:
    return f"an {role}" if role == "assistant" else f"a {role}"  # (the roles' articles)


def _legacy_call(i: int, msg: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """An assistant's ``function_call`` (OpenAI's API before tools) as its one tool call; None where
    the message has none."""
    fc = msg.get("function_call")
    if fc is None:
        return None
    misplaced = msg.get("role") != "assistant" or msg.get("tool_calls") is not None
    if misplaced or not isinstance(fc, Mapping) or "arguments" not in fc or not is_tool_call({"function": fc}):
        why = "only an assistant message without tool_calls may have one" if misplaced else "it must be {name, arguments}"
        raise ApiError(400, f"messages[{i}].function_call: {why}", param=f"messages[{i}].function_call")
    return [{"id": f"function_call_{i}", "type": "function", "function": dict(fc)}]


def chat_messages(messages: Sequence[Mapping[str, Any]], template: str) -> list[dict[str, Any]]:
    """``messages`` checked, each a copy with its content as text; an assistant turn's tool calls
    also written into its content where the chat ``template`` (its source) does not render
    ``tool_calls`` itself."""
    out = []
    developer = re.search(r"""["']developer["']""", template) is not None  # a role it names; else the system prompt it replaced
    called = None  # the id given to the last legacy function call, which a function message answers
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", param=f"messages[{i}].role")
        if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
            raise ApiError(400, f"messages[{i}]: a tool message needs the tool_call_id (a string) it answers", param=f"messages[{i}].tool_call_id")
        if role == "function":  # (OpenAI's schema: the function's name, required)
            if not isinstance(msg.get("name"), str):
                raise ApiError(400, f"messages[{i}]: a function message needs the name (a string) of the function it answers", param=f"messages[{i}].name")
            if msg.get("tool_call_id") is not None and not isinstance(msg["tool_call_id"], str):
                raise ApiError(400, f"messages[{i}].tool_call_id must be a string", param=f"messages[{i}].tool_call_id")
        legacy = _legacy_call(i, msg)
        calls = legacy if legacy is not None else msg.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list) or not all(is_tool_call(c) for c in calls)):
            why = "only an assistant message has tool_calls" if role != "assistant" else "tool_calls must be a list of {function: {name, arguments}}"
            raise ApiError(400, f"messages[{i}]: {why}", param=f"messages[{i}].tool_calls")
        content = _text(i, msg)
        _unicode(content, f"messages[{i}].content")
        field = f"messages[{i}].{'function_call' if legacy is not None else 'tool_calls'}"
        for c in calls or ():
            for v in (c["function"].get("name"), c["function"].get("arguments")):
                if isinstance(v, str):
                    _unicode(v, field)
        if calls and "tool_calls" not in template:
            content = "\n".join(t for t in (content, tool_calls_as_text(calls, field)) if t)
        made = {k: v for k, v in msg.items() if k not in ("function_call", "refusal")}
        made["content"] = content
        if role == "assistant":  # a function message answers the legacy call just before it, if any
            called = legacy[0]["id"] if legacy is not None else None
        if legacy is not None:
            made["tool_calls"] = legacy
        if role == "function":  # a legacy function's answer is a tool's answer
            made["role"] = "tool"
            if called is not None and made.get("tool_call_id") is None:
                made["tool_call_id"] = called
        elif role == "developer" and not developer:
            made["role"] = "system"
        out.append(made)
    return out
