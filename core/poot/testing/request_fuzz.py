"""Fuzzing the OpenAI server: hypothesis strategies for request bodies, and what every answer must be.

Three kinds of request (``batches`` mixes them, two valid to three of each other kind):

- **valid**: chat and completion bodies as clients send them, every sampling field in range, short
  prompts and ``max_tokens`` of 1 to 4 (so a run of thousands stays quick), streaming or not;
- **near-valid**: a valid body with one field replaced by a value of the wrong type or out of range
  (null, empty, negative, 2^64, 1e308, booleans for numbers, nested containers, a 3,000-word prompt),
  a required field removed, or unknown fields added;
- **garbage**: bytes that are not UTF-8, truncated JSON, JSON that is not an object, NaN literals,
  arrays nested thousands deep.

``check_answer`` states the property for one answer: no 5xx; every 4xx in OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``); a 200 has its choices, or, streamed, events
that parse and end with ``[DONE]``. The suite sends a thousand of these to a real server, eight at a
time, and ``bench/fuzz_serve.py`` ten thousand; afterwards the server must answer a plain greedy
request exactly as before, hold no KV block and have nothing queued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

__all__ = ["FuzzRequest", "requests", "batches", "check_answer"]

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@dataclass(frozen=True)
class FuzzRequest:
    """A request to send: its path, its body's bytes, whether it asks to stream, and its kind."""

    path: str
    body: bytes
    stream: bool
    kind: str  # "valid", "near-valid" or "garbage"

    def __repr__(self) -> str:
        return f"<{self.kind} POST {self.path} {self.body[:300]!r}{'...' if len(self.body) > 300 else ''}>"


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
_words = st.text("abcdefghij klmnop,.!?", min_size=1, max_size=80)


def _sampling(model: str) -> st.SearchStrategy[dict[str, Any]]:
    """The fields chat and completions share, each present or not, every value in range."""
    optional = {
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "top_k": st.integers(0, 100),
        "min_p": st.floats(0, 1),
        "repetition_penalty": st.floats(0.5, 2),
        "seed": st.integers(-(2**70), 2**70),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "stop": st.one_of(_words, st.lists(_words, max_size=3)),
        "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
        "n": st.integers(1, 2),
        "user": _text,
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    }
    return st.fixed_dictionaries(
        {"model": st.just(model), "max_tokens": st.integers(1, 4), "stream": st.booleans()},
        optional=optional,  # type: ignore[arg-type]
    ).map(lambda b: b if b["stream"] else {k: v for k, v in b.items() if k != "stream_options"})  # (stream_options only with stream)


def _chat(model: str) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _words})
    extra = st.fixed_dictionaries(
        {},
        optional={
            "logprobs": st.booleans(),
            "top_logprobs": st.integers(0, 5),
            "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
        },
    )
    body = (
        st.tuples(_sampling(model), st.lists(message, min_size=1, max_size=3), extra)
        .map(lambda t: {**t[0], "messages": t[1] + [{"role": "user", "content": "Hi"}], **t[2]})
        .map(lambda b: b if b.get("logprobs") or not b.get("top_logprobs") else {k: v for k, v in b.items() if k != "top_logprobs"})
    )  # (top_logprobs needs logprobs)
    return body.map(lambda b: (CHAT, b))


def _completion(model: str) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    prompt = st.one_of(_words, st.lists(_words, min_size=1, max_size=2), st.lists(st.integers(0, 49151), min_size=1, max_size=12))
    extra = st.fixed_dictionaries({}, optional={"logprobs": st.integers(0, 5)})
    body = st.tuples(_sampling(model), prompt, extra).map(lambda t: {**t[0], "prompt": t[1], **t[2]})
    return body.map(lambda b: (COMPLETIONS, b))


_WRONG = st.one_of(
    st.none(),
    st.just(""),
    st.just(-1),
    st.just(0),
    st.just(2**64),
    st.just(1e308),
    st.just(-1e308),
    st.booleans(),
    st.just([]),
    st.just({}),
    st.just([[[]]]),
    st.just({"a": {"b": [1, None]}}),
    st.just("word " * 3000),
    _text,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)


_BAD_MAX_TOKENS = st.sampled_from([0, -1, True, "4", 1.5, 2**64, 10**9, [], {}, [4]])


@st.composite
def _near_valid(draw: Any, model: str) -> tuple[str, dict[str, Any]]:
    path, body = draw(st.one_of(_chat(model), _completion(model)))
    how = draw(st.sampled_from(["replace", "replace", "replace", "remove", "add", "nested"]))
    keys = sorted(set(body) - {"max_tokens"})  # a request left without its small max_tokens could run to the context's end
    if how == "replace":
        key = draw(st.sampled_from(keys + ["max_tokens", "messages", "prompt", "n", "logprobs", "tools", "tool_choice", "response_format"]))
        body[key] = draw(_BAD_MAX_TOKENS if key == "max_tokens" else _WRONG)
    elif how == "remove":
        del body[draw(st.sampled_from(keys))]
    elif how == "add":
        body[draw(_text)] = draw(_WRONG)
    else:  # inside a message or a list
        if path == CHAT:
            msg = body["messages"][0]
            msg[draw(st.sampled_from(["role", "content", "name", "tool_calls", "tool_call_id"]))] = draw(_WRONG)
        else:
            body["prompt"] = [draw(_WRONG), draw(_WRONG)]
    return path, body


_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.binary(min_size=1, max_size=60).map(lambda b: b'{"model": "x", "messages": [{"role": "user", "content": "' + b + b'"}]}'),
    st.sampled_from(
        [
            b"",
            b"{",
            b"[]",
            b"null",
            b"42",
            b'"text"',
            b'{"model": NaN}',
            b'{"model": "m", "max_tokens": Infinity}',
            b'{"max_tokens": 1e999999}',
            b"[" * 5000 + b"]" * 5000,
            b'{"a":' * 3000 + b"1" + b"}" * 3000,
            b"\xff\xfe\x00\x00",
            b'{"model": "m", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        ]
    ),
)


def requests(model: str, kind: str) -> st.SearchStrategy[FuzzRequest]:
    """Requests of one ``kind`` ("valid", "near-valid" or "garbage") for ``model``'s server."""
    if kind == "valid":
        return st.one_of(_chat(model), _completion(model)).map(lambda pb: FuzzRequest(pb[0], json.dumps(pb[1]).encode(), bool(pb[1].get("stream")), kind))
    if kind == "near-valid":
        return _near_valid(model).map(lambda pb: FuzzRequest(pb[0], json.dumps(pb[1]).encode(), pb[1].get("stream") is True, kind))
    if kind == "garbage":
        return st.tuples(st.sampled_from([CHAT, COMPLETIONS]), _GARBAGE).map(lambda pb: FuzzRequest(pb[0], pb[1], False, kind))
    raise ValueError(f"unknown kind of request {kind!r}")


def batches(model: str, valid: int = 2, near_valid: int = 3, garbage: int = 3) -> st.SearchStrategy[list[FuzzRequest]]:
    """Requests to send at once: so many of each kind, shuffled. Valid requests generate tokens and
    take the time; the others are answered at once, so a batch holds more of them."""
    parts = st.tuples(*(st.lists(requests(model, k), min_size=n, max_size=n) for k, n in (("valid", valid), ("near-valid", near_valid), ("garbage", garbage))))
    return parts.flatmap(lambda t: st.permutations([r for part in t for r in part]))


def _error_shaped(payload: Any) -> bool:
    err = payload.get("error") if isinstance(payload, dict) else None
    return (
        isinstance(err, dict)
        and isinstance(err.get("message"), str)
        and bool(err["message"])
        and isinstance(err.get("type"), str)
        and {"param", "code"} <= set(err)
    )


def check_answer(req: FuzzRequest, status: int, body: bytes) -> str | None:
    """What is wrong with the answer ``status``/``body`` to ``req`` (None: nothing)."""
    if status >= 500:
        return f"{status} for {req!r}: {body[:500]!r}"
    text = body.decode("utf-8", errors="replace")
    if status >= 400:
        try:
            payload = json.loads(text)
        except ValueError:
            return f"{status} whose body is not JSON for {req!r}: {text[:300]!r}"
        return None if _error_shaped(payload) else f"{status} not in OpenAI's error shape for {req!r}: {text[:300]!r}"
    if status != 200:
        return f"unexpected status {status} for {req!r}"
    if text.startswith("data:"):  # a stream: every event parses, errors are error-shaped, [DONE] ends it
        events = [line[len("data:") :].strip() for line in text.splitlines() if line.startswith("data:")]
        if not events or events[-1] != "[DONE]":
            return f"a stream that does not end with [DONE] for {req!r}: {text[-300:]!r}"
        for e in events[:-1]:
            try:
                payload = json.loads(e)
            except ValueError:
                return f"a stream event that is not JSON for {req!r}: {e[:300]!r}"
            if "error" in payload and not _error_shaped(payload):
                return f"a stream error not in OpenAI's shape for {req!r}: {e[:300]!r}"
        return None
    try:
        payload = json.loads(text)
    except ValueError:
        return f"a 200 whose body is not JSON for {req!r}: {text[:300]!r}"
    if not isinstance(payload.get("choices"), list) or not payload["choices"]:
        return f"a 200 without choices for {req!r}: {text[:300]!r}"
    return None
