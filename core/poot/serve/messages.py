"""A chat request's messages checked and made what a chat template renders: roles OpenAI's API
defines, content as text (a string or text parts), tool calls and tool answers in their shapes;
each fault a 400 naming the message and field."""

from __future__ import annotations

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


def _text(i: int, role: str, content: Any) -> str:
    """A message's content as text: a string, or the text of its text parts joined; None (an
    assistant turn that only called tools, a function's answer) as nothing."""
    if content is None and role in ("assistant", "function"):  # (OpenAI's schema lets both be null)
        return ""
    if isinstance(content, str):
        return content
    if content is None or (content == [] and role != "assistant"):
        raise ApiError(400, f"messages[{i}]: a {role} message needs its content", param=f"messages[{i}].content")
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise ApiError(400, f"messages[{i}]: only text content parts are supported", param=f"messages[{i}].content")
        if not isinstance(part.get("text"), str):
            raise ApiError(400, f"messages[{i}]: a text part's text must be a string", param=f"messages[{i}].content")
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(messages: Sequence[Mapping[str, Any]], template: str) -> list[dict[str, Any]]:
    """``messages`` checked, each a copy with its content as text; an assistant turn's tool calls
    also written into its content where the chat ``template`` (its source) does not render
    ``tool_calls`` itself."""
    out = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", param=f"messages[{i}].role")
        if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
            raise ApiError(400, f"messages[{i}]: a tool message needs the tool_call_id (a string) it answers", param=f"messages[{i}].tool_call_id")
        calls = msg.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list) or not all(is_tool_call(c) for c in calls)):
            why = "only an assistant message has tool_calls" if role != "assistant" else "tool_calls must be a list of {function: {name, arguments}}"
            raise ApiError(400, f"messages[{i}]: {why}", param=f"messages[{i}].tool_calls")
        content = _text(i, role, msg.get("content"))
        if calls and "tool_calls" not in template:
            content = "\n".join(t for t in (content, tool_calls_as_text(calls)) if t)
        out.append({**msg, "content": content})
    return out
