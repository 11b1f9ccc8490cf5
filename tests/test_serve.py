"""`poot serve` as a real process on loopback, driven by the official openai client: chat and
completions, streaming and not, n, stop, seeds, logprobs, JSON schema, tool calls; 32 concurrent
streams with disconnects; errors with the right status and body while the server keeps serving."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from poot.serve.tools import forced_call_schema  # noqa: E402 - after the skips
from poot.testing.server import ServerFailed, metrics, start_server, stop_server, wait_idle  # noqa: E402

KEY = "test-key-123"


def _start(*flags: str):  # type: ignore[no-untyped-def]
    try:
        return start_server("SmolLM2", *flags)
    except ServerFailed as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def server(smollm2_path):
    proc, base = _start("--api-key", KEY, "--max-batch", "16", "--max-queue", "64")
    yield base
    stop_server(proc)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["SmolLM2"]
    assert client.models.retrieve("SmolLM2").id == "SmolLM2"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("x" * 10_000)
    assert e.value.body["code"] == "model_not_found" and len(e.value.body["message"]) < 400  # (the name is not echoed whole)


def test_sequence_and_message_counts_are_refused_before_the_work(server):
    """Too many prompts are refused before any is tokenized, and more messages than the context has
    tokens before the template renders them (a 25 MB body of either had kept the server busy for
    seconds before its 400)."""
    many = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": ["word " * 2000] * 2500, "max_tokens": 1})
    assert many.status_code == 400 and "2500 sequences" in many.json()["error"]["message"], many.text[:300]
    empty = _post(server, "/v1/chat/completions", {"model": "SmolLM2", "messages": [{"role": "user", "content": ""}] * 200_000, "max_tokens": 1})
    assert empty.status_code == 400 and "200000 messages cannot fit" in empty.json()["error"]["message"], empty.text[:300]


def test_chat_streaming_equals_non_streaming(client):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    full = client.chat.completions.create(model="SmolLM2", messages=msgs, temperature=0, max_tokens=12)
    assert "Paris" in full.choices[0].message.content
    assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 10
    chunks = list(
        client.chat.completions.create(model="SmolLM2", messages=msgs, temperature=0, max_tokens=12, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [full.choices[0].finish_reason]


def test_completions_streaming_and_not(client):
    a = client.completions.create(model="SmolLM2", prompt="The three primary colors are", temperature=0, max_tokens=10)
    b = "".join(
        c.choices[0].text for c in client.completions.create(model="SmolLM2", prompt="The three primary colors are", temperature=0, max_tokens=10, stream=True)
    )
    assert a.choices[0].text == b and a.usage.completion_tokens == 10


def test_n_seeds_and_stop(client):
    kw = dict(model="SmolLM2", messages=[{"role": "user", "content": "Write a short poem."}], temperature=0.9, seed=7, max_tokens=16, n=2)
    r1 = client.chat.completions.create(**kw)
    r2 = client.chat.completions.create(**kw)
    assert len(r1.choices) == 2 and [c.message.content for c in r1.choices] == [c.message.content for c in r2.choices]
    r = client.completions.create(model="SmolLM2", prompt="1, 2, 3, 4, 5,", temperature=0, max_tokens=30, stop=[" 8"])
    assert r.choices[0].finish_reason == "stop" and " 8" not in r.choices[0].text and "7" in r.choices[0].text


def test_logprobs_in_the_clients_types(client):
    r = client.chat.completions.create(
        model="SmolLM2", messages=[{"role": "user", "content": "Say hi."}], temperature=0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob - 1e-4
    c = client.completions.create(model="SmolLM2", prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    assert len(c.choices[0].logprobs.token_logprobs) == 4 and all(len(d) == 2 for d in c.choices[0].logprobs.top_logprobs)


def test_json_schema_response(client):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="SmolLM2",
        messages=[{"role": "user", "content": "Invent a person."}],
        max_tokens=60,
        temperature=0.7,
        seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_tool_calls_are_parsed(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        },
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
    ]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = client.chat.completions.create(model="SmolLM2", messages=msgs, tools=tools, tool_choice=choice, max_tokens=40, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name in ("get_weather", "get_time")
        args = json.loads(calls[0].function.arguments)
        if calls[0].function.name == "get_weather":
            assert isinstance(args["city"], str)
    # the tool loop: the assistant message sent back exactly as returned (content null, its calls),
    # then the tool's answer; the model answers in text
    said = r.choices[0].message.model_dump(exclude_none=False)
    assert said["content"] is None and said["tool_calls"]
    result = {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": '{"temperature": 21, "sky": "clear"}'}
    after = client.chat.completions.create(model="SmolLM2", messages=[*msgs, said, result], tools=tools, max_tokens=30, temperature=0)
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert after.choices[0].message.content or after.choices[0].message.tool_calls


def test_a_required_call_follows_tool_schemas_with_their_own_definitions(client):
    """Parameters that name their parts in ``$defs`` or ``definitions`` (what pydantic writes)
    constrain a required or named call as they do the tool's own schema (their pointers had resolved
    against the call's wrapper: a 400); a reference to the schema itself ("#") is re-rooted too."""
    city = {"type": "string", "enum": ["Paris", "Rome"]}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_w",
                "parameters": {
                    "type": "object",
                    "$defs": {"City": city},
                    "properties": {"city": {"$ref": "#/$defs/City"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_t",
                "parameters": {
                    "type": "object",
                    "definitions": {"City": city},
                    "properties": {"city": {"$ref": "#/definitions/City"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        },
    ]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_t"}}):
        r = client.chat.completions.create(model="SmolLM2", messages=msgs, tools=tools, tool_choice=choice, max_tokens=60, temperature=0)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        call = r.choices[0].message.tool_calls[0].function
        assert json.loads(call.arguments)["city"] in ("Paris", "Rome") and (call.name == "get_t" or choice == "required"), call
    tree = {"type": "object", "properties": {"leaf": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}}}
    schema = forced_call_schema({"tree": tree}, None)
    assert schema["properties"]["arguments"] == {"$ref": "#/$defs/tree"} and schema["$defs"]["tree"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/tree"}
    # values under const, enum, default and examples are data: a "$ref" there is kept as sent
    literal = {"$ref": "#/a"}
    data = {"type": "object", "properties": {"p": {"const": literal, "default": literal, "examples": [literal]}, "q": {"enum": [literal, 1]}}}
    props = forced_call_schema({"data": data}, None)["$defs"]["data"]["properties"]
    assert props["p"] == {"const": literal, "default": literal, "examples": [literal]} and props["q"]["enum"] == [literal, 1], props
    # but a property named like one of those keywords is a schema: its references are re-rooted
    named = {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"default": {"$ref": "#/$defs/n"}, "enum": {"$ref": "#/$defs/n"}}}
    named["dependencies"] = {"const": {"$ref": "#/$defs/n"}}  # (draft 7: property names to schemas)
    got = forced_call_schema({"named": named}, None)["$defs"]["named"]
    moved = {"$ref": "#/$defs/named/$defs/n"}
    assert got["properties"] == {"default": moved, "enum": moved} and got["dependencies"] == {"const": moved}, got
    anchored = {"type": "object", "$defs": {"n": {"$anchor": "num", "type": "integer"}}, "properties": {"x": {"$ref": "#num"}}}
    got = forced_call_schema({"anchored": anchored}, None)["$defs"]["anchored"]["properties"]["x"]
    assert got == {"$ref": "#num"}, got  # a plain-name anchor resolves wherever the schema sits


def test_thirty_two_streams_with_disconnects(client, server):
    def one(i: int) -> tuple[int, str, str | None]:
        stream = client.chat.completions.create(
            model="SmolLM2", messages=[{"role": "user", "content": f"Tell me about number {i}."}], temperature=0.8, seed=i, max_tokens=20, stream=True
        )
        text, reason = "", None
        for k, chunk in enumerate(stream):
            if i % 3 == 0 and k == 3:  # a third of the clients go away mid-stream
                stream.close()
                return i, text, "gone"
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
        return i, text, reason

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    for i, text, reason in results:
        if i % 3:
            assert reason in ("stop", "length") and text, (i, text, reason)
    for i in (1, 2, 4):  # a finished stream's text is what the same request gives on its own
        alone = client.chat.completions.create(
            model="SmolLM2", messages=[{"role": "user", "content": f"Tell me about number {i}."}], temperature=0.8, seed=i, max_tokens=20
        )
        assert alone.choices[0].message.content == results[i][1]
    m = wait_idle(server)  # no KV block held, nothing running or queued, within 30 s
    assert m["poot_time_to_first_token_seconds_count"] >= 21


def _post(server, path, body, key=KEY, raw=None):
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return httpx.post(f"{server}{path}", headers=headers, content=raw if raw is not None else json.dumps(body), timeout=120)


def test_bodies_past_the_limit_get_413_and_the_server_goes_on(server, client):
    """A body past --max-body (32 MiB by default) is refused before it is parsed, whether its
    length is declared or it comes in chunks; a chunked body within the limit is served."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    ok = {"model": "SmolLM2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    big = b'{"model": "SmolLM2", "messages": [{"role": "user", "content": "' + b"a" * (33 << 20) + b'"}]}'

    def chunks(data: bytes):  # (an iterator: httpx sends it chunked, with no Content-Length)
        for i in range(0, len(data), 1 << 20):
            yield data[i : i + (1 << 20)]

    for content in (big, chunks(big)):
        r = httpx.post(f"{server}/v1/chat/completions", headers=headers, content=content, timeout=120)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large" and "--max-body" in r.json()["error"]["message"], r.text[:300]
    stranger = httpx.post(f"{server}/v1/chat/completions", headers={**headers, "Authorization": "Bearer wrong"}, content=chunks(big), timeout=120)
    assert stranger.status_code == 401, stranger.text[:300]  # the key is checked first: no body is read for a client without it
    r = httpx.post(f"{server}/v1/chat/completions", headers=headers, content=chunks(json.dumps(ok).encode()), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == client.chat.completions.create(**ok).choices[0].message.content


def test_errors_have_the_right_status_and_body(server, client):
    ok = {"model": "SmolLM2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        (dict(raw=b'{"model": "SmolLM2", "messages": [}'), 400, "JSON"),
        (dict(body={**ok, "temperature": "hot"}), 400, "temperature"),
        (dict(body={**ok, "max_tokens": -5}), 400, "max_tokens"),
        (dict(body={**ok, "messages": "hello"}), 400, "messages"),
        (dict(body={**ok, "messages": [{"role": "user", "content": "word " * 3000}]}), 400, "1024"),
        (dict(body=ok, key="wrong"), 401, "API key"),
        (dict(body={**ok, "model": "gpt-9"}), 404, "gpt-9"),
        (dict(body={**ok, "logit_bias": {"x": 1}}), 400, "logit_bias"),
        # sizes whose work is the whole batch's: a bias weighed against every vocabulary entry, a
        # stop string's matcher built on the scheduling thread (they had slowed other requests 30x)
        (dict(body={**ok, "logit_bias": {str(i): 0.5 for i in range(301)}}), 400, "logit_bias"),
        (dict(body={**ok, "stop": "x" * 4097}), 400, "stop"),
        (dict(body={**ok, "stop": [".", "y" * 4097]}), 400, "stop"),
        (dict(body={**ok, "messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0].role must be one of"),
        (dict(body={**ok, "max_tokens": True}), 400, "max_tokens"),
        (dict(raw=b'{"model": "SmolLM2", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'), 400, "finite"),
        (dict(raw=b'{"model": "SmolLM2", "messages": [{"role": "user", "content": "\xff\xfe"}]}'), 400, ""),
        # messages OpenAI refuses, which had been rendered as empty turns or had their calls dropped
        (dict(body={**ok, "messages": [{"role": "user"}]}), 400, "a user message needs its content"),
        (dict(body={**ok, "messages": [{"role": "user", "content": []}]}), 400, "a user message needs its content"),
        (
            dict(body={**ok, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": "x"}]}),
            400,
            "tool_calls must be",
        ),
        (
            dict(body={**ok, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [{"function": None}]}]}),
            400,
            "tool_calls must be",
        ),
        (dict(body={**ok, "messages": [{"role": "user", "content": "Hi", "tool_calls": []}]}), 400, "only an assistant message has tool_calls"),
        (dict(body={**ok, "messages": [{"role": "tool", "content": "21 C"}]}), 400, "tool_call_id"),
        (dict(body={**ok, "tools": [{"type": "function"}], "tool_choice": "none"}), 400, "tools"),
        # OpenAI's request fields before tools: refused with what to send (ignored, they went unseen)
        (dict(body={**ok, "functions": [{"name": "w", "parameters": {"type": "object"}}]}), 400, "deprecated form of tools"),
        (dict(body={**ok, "function_call": {"name": "w"}}), 400, "deprecated form of tool_choice"),
        (dict(body={**ok, "messages": ["hi"]}), 400, "messages[0]"),
    ]
    for kw, status, words in cases:
        r = _post(server, "/v1/chat/completions", kw.get("body"), key=kw.get("key", KEY), raw=kw.get("raw"))
        assert r.status_code == status, (kw, r.status_code, r.text)
        err = r.json()["error"]
        assert words in err["message"] and err["type"], (kw, err)
    noop = _post(server, "/v1/chat/completions", {**ok, "functions": [], "function_call": "none", "max_tokens": 1})  # (changes nothing: taken)
    assert noop.status_code == 200, noop.text
    assert _post(server, "/v1/chat/completions", None, raw=b'{"model": "SmolLM2", "messages": [}').json()["error"]["param"] is None  # not a byte offset
    # a body not sent as JSON, or JSON but not an object: said so, not pydantic's words about dictionaries
    plain = httpx.post(f"{server}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"}, content=json.dumps(ok))
    assert plain.status_code == 400 and "Content-Type: application/json, not 'text/plain'" in plain.json()["error"]["message"], plain.text
    listed = _post(server, "/v1/chat/completions", [ok])
    assert listed.status_code == 400 and "must be a JSON object" in listed.json()["error"]["message"], listed.text
    # what OpenAI's schema lets be null is taken: an assistant turn that only called a tool, a function's answer
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "function", "name": "w", "content": None},
    ]
    took = _post(server, "/v1/chat/completions", {**ok, "messages": history})
    assert took.status_code == 200, took.text
    missing = _post(server, "/v1/completions", {"model": "SmolLM2", "max_tokens": 2})
    assert missing.status_code == 400 and missing.json()["error"]["message"] == "prompt is required" and missing.json()["error"]["param"] == "prompt"
    for prompt in ([1.0, 2.0], [True, 2], None, {"a": 1}):  # (pydantic had named the union's first member: "prompt.str: ...")
        bad = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": prompt, "max_tokens": 2})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt" and "list of token ids" in bad.json()["error"]["message"], bad.text
    echo = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": "hi", "max_tokens": 2, "echo": True})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo", echo.text
    # best_of: refused by name above n (it had been ignored) and below it; equal to n, n's answer
    for best_of, n, words in ((3, 1, "not supported"), (1, 2, "at least n (2)")):
        bo = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": "hi", "max_tokens": 2, "n": n, "best_of": best_of})
        assert bo.status_code == 400 and bo.json()["error"]["param"] == "best_of" and words in bo.json()["error"]["message"], bo.text
    same = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": "hi", "max_tokens": 2, "n": 2, "best_of": 2})
    assert same.status_code == 200 and len(same.json()["choices"]) == 2, same.text
    # a tool_choice that names nothing known is refused with tools or without (it had been taken without)
    bogus = _post(server, "/v1/chat/completions", {**ok, "tool_choice": "always"})
    assert bogus.status_code == 400 and bogus.json()["error"]["param"] == "tool_choice" and "'always'" in bogus.json()["error"]["message"], bogus.text
    assert httpx.head(f"{server}/health").status_code == 200  # (a load balancer's probe had got 405)
    long = _post(server, "/v1/chat/completions", {**ok, "messages": [{"role": "user", "content": "word " * 3000}]}).json()["error"]["message"]
    assert re.search(r"1024.*\d{4}", long), long  # the context and the prompt's length
    huge = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": "hello world " * 90_000, "max_tokens": 2})  # a 1 MB prompt
    assert huge.status_code == 400 and len(huge.text) < 400, huge.text[:1000]  # said in full, without the prompt
    # refused by its length before the tokenizer reads it: more characters than 1,024 tokens can cover
    assert huge.json()["error"]["param"] == "prompt" and re.search(
        r"context is 1024 tokens; the prompt has 1080000 characters", huge.json()["error"]["message"]
    )
    assert client.chat.completions.create(**ok).choices[0].message.content is not None  # still serving
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_requests_that_had_failed_steps_or_answered_500(server, client):
    """Each of these had ended a request in flight beside it (a top_k past int32 failed the step),
    passed off an engine error as a finished answer, or answered 500 or an error no client could
    read (lone surrogates quoted back); each now gets its own 4xx in OpenAI's shape while the
    request beside it keeps every token."""
    greedy = {"model": "SmolLM2", "messages": [{"role": "user", "content": "Count from one to thirty in words."}], "max_tokens": 60, "temperature": 0}
    alone = client.chat.completions.create(**greedy)
    ok = {"model": "SmolLM2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    recursive = {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}}, "$ref": "#/$defs/a"}
    named_object = {"type": "object", "properties": {"name": {"type": "object"}}, "required": ["name"]}
    cases = [  # (path, body or raw bytes, status, param)
        ("/v1/chat/completions", {**ok, "tool_choice": {"type": "function", "function": "f"}, "tools": tools}, 400, "tool_choice"),
        ("/v1/chat/completions", {**ok, "tools": tools + tools}, 400, "tools[1].function.name"),  # two functions of one name
        ("/v1/chat/completions", {**ok, "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("/v1/completions", {"model": "SmolLM2", "prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("/v1/chat/completions", {**ok, "top_logprobs": 3}, 400, "top_logprobs"),
        ("/v1/chat/completions", {**ok, "tools": [{"type": "function", "function": {"name": ""}}]}, 400, "tools[0].function.name"),
        (
            "/v1/chat/completions",
            {**ok, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            400,
            "tools[0].function.parameters",
        ),
        ("/v1/chat/completions", {**ok, "tool_choice": {"type": "function", "function": {"name": ["f"]}}, "tools": tools}, 400, "tool_choice"),
        ("/v1/chat/completions", {**ok, "tool_choice": "required", "tools": []}, 400, "tool_choice"),
        ("/v1/chat/completions", {**ok, "messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
        ("/v1/chat/completions", {**ok, "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, 400, "messages[0].content"),
        (
            "/v1/chat/completions",
            {**ok, "messages": [{"role": "assistant", "content": 3, "tool_calls": [{"function": {"name": "f"}}]}]},
            400,
            "messages[0].content",
        ),
        ("/v1/chat/completions", b'{"model": "SmolLM2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi \\ud800"}]}', 400, "messages"),
        ("/v1/chat/completions", b'{"model": "\\ud800", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
        ("/v1/completions", b'{"model": "SmolLM2", "max_tokens": 2, "prompt": "\\udfff"}', 400, "prompt"),
        (
            "/v1/chat/completions",
            {**ok, "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"schema": recursive}}},
            400,
            "response_format",
        ),
        # nested past the parsers' depth, too many stop strings or sequences, lax ids
        (
            "/v1/chat/completions",
            {**ok, "messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[" * 100_000 + "]" * 100_000}}]}]},
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "SmolLM2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi", "x": ' + b"[" * 900 + b"]" * 900 + b"}]}",
            400,
            "messages",
        ),
        ("/v1/chat/completions", {**ok, "stop": [f"s{i}" for i in range(65)]}, 400, "stop"),
        ("/v1/completions", {"model": "SmolLM2", "prompt": ["a", "b", "c", "d", "e"], "n": 16, "max_tokens": 1}, 400, "prompt"),
        ("/v1/completions", {"model": "SmolLM2", "prompt": [True, False], "max_tokens": 1}, 400, "prompt"),
        ("/v1/chat/completions", {**ok, "logit_bias": {" 5 ": 1}}, 400, "logit_bias"),
    ]
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(client.chat.completions.create, **greedy)
        overflow = pool.submit(client.completions.create, model="SmolLM2", prompt="Hi", max_tokens=2, temperature=0.8, extra_body={"top_k": 2**31})
        assert overflow.result().usage.completion_tokens == 2  # past the vocabulary: every token kept
        for path, body, status, param in cases:
            r = _post(server, path, None, raw=body) if isinstance(body, bytes) else _post(server, path, body)
            assert r.status_code == status and (r.json()["error"]["param"] or "").startswith(param), (body, r.status_code, r.text[:500])
        beside = beside.result()
    assert beside.choices[0].message.content == alone.choices[0].message.content
    # the constraint's failure in a stream: an error event, then the stream's end
    body = {**ok, "max_tokens": 4, "stream": True, "response_format": {"type": "json_schema", "json_schema": {"schema": recursive}}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as r:
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and any(json.loads(e).get("error", {}).get("param") == "response_format" for e in events[:-1]), events
    # a JSON answer whose "name" is no string, where tools are offered: content, not a 500
    r = _post(
        server,
        "/v1/chat/completions",
        {**ok, "max_tokens": 12, "tools": tools, "response_format": {"type": "json_schema", "json_schema": {"schema": named_object}}},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("{"), r.text
    # a stream with tools holds its content to the end (calls are parsed from all of it): its
    # log-probabilities come with it, one a token
    body = {**ok, "max_tokens": 5, "stream": True, "tools": tools, "logprobs": True, "temperature": 0, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as r:
        chunks = [json.loads(line[len("data: ") :]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    last = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]["choices"][0]
    assert len(last["logprobs"]["content"]) == chunks[-1]["usage"]["completion_tokens"] > 0, (last, chunks[-1])
    # a temperature so small that logits / temperature overflow f32 samples greedily
    tiny = client.completions.create(model="SmolLM2", prompt="The capital of France is", max_tokens=3, temperature=1e-39)
    assert tiny.choices[0].text == client.completions.create(model="SmolLM2", prompt="The capital of France is", max_tokens=3, temperature=0).choices[0].text
    # the scheme of Authorization in any case
    assert httpx.get(f"{server}/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    # HEAD, and a 405 that says which methods the path takes
    assert httpx.head(f"{server}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    put = httpx.put(f"{server}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert put.status_code == 405 and "GET" in put.headers.get("allow", ""), put.headers
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_a_prompt_longer_than_the_context_can_hold_is_refused_unread(server):
    """An 8 MB prompt is refused by its length at once (it had been tokenized first, on the event
    loop: seconds in which /health and every stream waited)."""
    t = time.perf_counter()
    r = _post(server, "/v1/completions", {"model": "SmolLM2", "prompt": "hello world " * 700_000, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:500]
    assert time.perf_counter() - t < 3
    assert httpx.get(f"{server}/health", timeout=30).json()["status"] == "ok"


def test_a_seed_outside_int32_touches_no_other_request(server, client):
    """Any integer seed is accepted (``n: 2`` adds one to it for the second choice), and a request
    running beside it keeps every token: such a seed had failed the step, ended every request in
    flight and left /health degraded."""
    greedy = {"model": "SmolLM2", "messages": [{"role": "user", "content": "Count from one to fifty in words."}], "max_tokens": 80, "temperature": 0}
    seeded = {"model": "SmolLM2", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 12, "seed": 3_000_000_000, "n": 2}
    alone = client.chat.completions.create(**greedy)
    with ThreadPoolExecutor(3) as pool:
        beside = pool.submit(client.chat.completions.create, **greedy)
        big = [pool.submit(client.chat.completions.create, **{**seeded, "seed": s}) for s in (3_000_000_000, 2**31 - 1)]
        answers = [f.result() for f in big]
        beside = beside.result()
    assert all(len(a.choices) == 2 and all(c.message.content for c in a.choices) for a in answers)
    assert beside.choices[0].message.content == alone.choices[0].message.content
    assert beside.choices[0].finish_reason == alone.choices[0].finish_reason
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_a_full_queue_answers_429_and_recovers(smollm2_path):
    proc, base = _start("--max-batch", "1", "--max-queue", "1", "--matmul-precision", "medium")
    try:
        body = {"model": "SmolLM2", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 40, "temperature": 0}
        # an idle server takes one request of several choices or prompts: the queue counts requests
        two = httpx.post(f"{base}/v1/chat/completions", json={**body, "n": 2, "max_tokens": 4}, timeout=300)
        assert two.status_code == 200 and len(two.json()["choices"]) == 2, two.text
        both = httpx.post(f"{base}/v1/completions", json={"model": "SmolLM2", "prompt": ["One", "Two"], "max_tokens": 4}, timeout=300)
        assert both.status_code == 200 and len(both.json()["choices"]) == 2, both.text
        with ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300), range(6)))
        statuses = sorted(r.status_code for r in codes)
        assert 429 in statuses and 200 in statuses, statuses
        err = next(r for r in codes if r.status_code == 429).json()["error"]
        assert err["type"] == "rate_limit_exceeded" and re.search(r"^[1-9]\d* requests are already waiting to run \(at most 1 may\)", err["message"]), err
        assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).status_code == 200
    finally:
        stop_server(proc)
    assert "matmul precision medium" in (proc.stdout.read() if proc.stdout else "")  # the flag reached the model's plans


def test_the_queue_counts_only_what_the_next_step_cannot_admit(smollm2_path):
    """With 4 rows and 8 places in the queue, 12 requests at once are all taken: the 4 the next
    step admits had counted as waiting, so 429s came with fewer than 8 in the queue."""
    proc, base = _start("--max-batch", "4", "--max-queue", "8")
    try:
        body = {"model": "SmolLM2", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 6, "temperature": 0}
        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(lambda _: httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).status_code, range(12)))
        assert codes == [200] * 12, codes
    finally:
        stop_server(proc)


def test_a_non_streaming_client_that_leaves_frees_its_blocks(server):
    body = {
        "model": "SmolLM2",
        "messages": [{"role": "user", "content": "Write a very long essay."}],
        "max_tokens": 900,
        "temperature": 0.8,
        "seed": 3,
        "logit_bias": {"0": -100, "1": -100, "2": -100},
    }  # no end token: it would run for far longer than the client waits
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, json=body, timeout=1.5)
    left = time.time()
    while metrics(server)["poot_kv_blocks_used"] > 0:
        assert time.time() - left < 6, "the sequence kept its blocks after its client left"  # 900 tokens would take far longer
        time.sleep(0.2)


def test_a_server_whose_client_left_stops_on_the_first_sigterm(smollm2_path):
    """A non-streaming request whose client left ends with its cancellation: its handler no longer
    waits for events that never come, which had held uvicorn's graceful shutdown forever."""
    proc, base = _start("--max-batch", "1")
    try:
        body = {
            "model": "SmolLM2",
            "messages": [{"role": "user", "content": "Write a very long essay."}],
            "max_tokens": 900,
            "seed": 3,
            "logit_bias": {"0": -100, "1": -100, "2": -100},
        }
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{base}/v1/chat/completions", json=body, timeout=1.5)
        time.sleep(1.0)  # the watcher sees the disconnect and cancels
        proc.terminate()
        proc.wait(timeout=15)
        assert proc.returncode is not None
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_answers_the_requests_in_flight_and_stops(smollm2_path):
    """A server told to stop ends what it is generating with a 503 in OpenAI's shape (a stream: an
    error event, then [DONE]) and exits; before, a waiting client got a plain-text 500 when the
    grace period ran out and a stream was cut off without its end."""
    proc, base = _start("--max-batch", "4")
    try:
        body = {"model": "SmolLM2", "messages": [{"role": "user", "content": "Write a very long essay."}], "max_tokens": 900, "seed": 3}
        body["logit_bias"] = {"2": -100}  # (no end token: each runs until it is stopped)
        with ThreadPoolExecutor(2) as pool:
            plain = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=body, timeout=60)

            def stream() -> list[str]:
                with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
                    return [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]

            streamed = pool.submit(stream)
            deadline = time.time() + 60
            while metrics(base).get("poot_running_sequences", 0) < 2 and time.time() < deadline:
                time.sleep(0.2)
            t = time.perf_counter()
            proc.terminate()
            r, events = plain.result(), streamed.result()
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "server_shutting_down", events[-3:]
        assert len(events) > 3  # (it had streamed tokens before)
        proc.wait(timeout=15)
        assert time.perf_counter() - t < 5, "stopped within the grace period's first seconds"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_model_answer_nested_past_the_json_parser_is_content_not_a_500():
    """Tool calls are parsed out of the model's answer; an answer of brackets nested past the JSON
    parser's depth (a RecursionError, which had escaped as a 500 or cut a stream off) is content."""
    from poot.serve.tools import parse_tool_calls

    functions = {"f": {"type": "object"}}
    deep = "[" * 100_000
    assert parse_tool_calls(deep, functions) == (deep, [])
    assert parse_tool_calls(f"<tool_call>{deep}</tool_call>", functions) == (f"<tool_call>{deep}</tool_call>", [])
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', functions)[1][0]["function"]["name"] == "f"


def test_legacy_function_calls_refusals_and_developer_messages_are_rendered():
    """What older clients send (an assistant's ``function_call``, a ``function`` message) and newer
    ones (``refusal`` parts, the ``developer`` role) reaches the template as what it knows: the call
    as the assistant's one tool call and the function's answer as the tool's answer to it, the
    refusal as the assistant's text, a developer message as the system prompt where the template
    has no developer role; misplaced or malformed ones are 400s naming the field."""
    from poot.serve.messages import chat_messages
    from poot.serve.protocol import ApiError
    from poot.text.chat import ChatTemplate

    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments }}]{% endfor %}"
        "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
    )
    history = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        {"role": "function", "name": "weather", "content": "-3 C"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is -3 C. "}, {"type": "refusal", "refusal": "No forecasts."}]},
    ]
    made = chat_messages(history, chatml)
    assert [m["role"] for m in made] == ["system", "user", "assistant", "tool", "assistant"]
    assert all("function_call" not in m for m in made) and made[4]["content"] == "It is -3 C. No forecasts."
    text = ChatTemplate(chatml).render(made, add_generation_prompt=False)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text and '[weather {"city": "Oslo"}]' in text
    assert "<|im_start|>tool\n-3 C(function_call_2)<|im_end|>" in text, text
    # a template without tool_calls gets the call written into the assistant's text (not as ASCII
    # escapes; arguments that are not JSON, or nest past the parser, as sent); one that knows the
    # developer role keeps it
    plain = chat_messages(history, "{% if m.role == 'developer' %}{% endif %}")
    assert plain[0]["role"] == "developer" and '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>' == plain[2]["content"]
    assert chat_messages(history, "{# no developer role here #}")[0]["role"] == "system"
    deep = "[" * 5000
    odd = [{"role": "assistant", "content": None, "function_call": {"name": "météo", "arguments": deep}}]
    assert chat_messages(odd, "")[0]["content"] == f'<tool_call>{{"name": "météo", "arguments": "{deep}"}}</tool_call>'
    # the refusal OpenAI returns as the message's field is its text; a function's answer after a
    # turn of tool_calls answers no legacy call
    refused = chat_messages([{"role": "assistant", "content": None, "refusal": "I cannot."}], chatml)
    assert refused[0]["content"] == "I cannot." and "refusal" not in refused[0]
    later = [
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "abc", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "function", "name": "g", "content": "x"},
    ]
    assert "tool_call_id" not in chat_messages(later, chatml)[2]
    nulled = chat_messages([*history[2:3], {"role": "function", "name": "weather", "content": "x", "tool_call_id": None}], chatml)
    assert nulled[1]["tool_call_id"] == "function_call_0"
    bad = [
        ([{"role": "user", "content": "Hi", "function_call": {"name": "f", "arguments": "{}"}}], "messages[0].function_call", "only an assistant"),
        ([{"role": "assistant", "content": None, "function_call": {"name": 3}}], "messages[0].function_call", "{name, arguments}"),
        (
            [{"role": "assistant", "content": None, "function_call": {"name": "f"}, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}],
            "messages[0].function_call",
            "without tool_calls",
        ),
        ([{"role": "assistant", "content": None, "function_call": {"name": "f"}}], "messages[0].function_call", "{name, arguments}"),
        ([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}], "messages[0].content[0]", "only text content parts are supported in a user"),
        ([{"role": "assistant", "content": ["x", {"type": "refusal", "refusal": 5}]}], "messages[0].content[0]", "an assistant message"),
        ([{"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]}], "messages[0].content[0]", "a refusal part's refusal"),
        ([{"role": "assistant", "content": None, "refusal": 3}], "messages[0].refusal", "a string"),
        ([{"role": "user", "content": "hi", "refusal": "no"}], "messages[0].refusal", "only an assistant"),
        (
            [{"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": '{"a": "\ud800"}'}}],
            "messages[0].function_call",
            "not valid Unicode",
        ),
        ([{"role": "function", "content": "x"}], "messages[0].name", "needs the name"),
        ([{"role": "function", "name": "f", "content": "x", "tool_call_id": 5}], "messages[0].tool_call_id", "must be a string"),
        ([{"role": "user", "content": "hi"}, {"role": "developer", "content": "ok \ud800"}], "messages[1].content", "not valid Unicode"),
    ]
    for msgs, param, words in bad:
        with pytest.raises(ApiError) as e:
            chat_messages(msgs, chatml)
        assert e.value.status == 400 and e.value.param == param and words in str(e.value), (msgs, e.value)


def test_a_request_whose_handler_was_cancelled_leaves_the_loop_running():
    """A handler cancelled while its request waits in the scheduler's inbox cancels the future the
    loop would answer; setting a cancelled future's result had raised in the loop's thread and
    ended it (every later request would have waited forever)."""
    import threading

    from poot.serve.scheduler import Scheduler

    gate = threading.Event()

    class Engine:  # what the loop asks of an engine, the first add held at the gate
        running: list = []
        waiting: list = []
        max_seqs = 1

        def __init__(self) -> None:
            self.next = 0

        def add(self, prompt, params, constraint=None):  # type: ignore[no-untyped-def]
            gate.wait(10)
            self.next += 1
            return self.next

        def cancel(self, seq_id):  # type: ignore[no-untyped-def]
            return False

        def has_work(self) -> bool:
            return False

    sched = Scheduler(Engine())  # type: ignore[arg-type]
    try:
        first = sched.submit([[1]], [None], lambda ev: None)  # type: ignore[list-item]
        second = sched.submit([[1]], [None], lambda ev: None)  # type: ignore[list-item]
        assert second.cancel()  # still in the inbox: the first holds the loop at the gate
        gate.set()
        assert first.result(timeout=10) == [1]
        third = sched.submit([[1]], [None], lambda ev: None)  # type: ignore[list-item]
        assert third.result(timeout=10) == [2]  # the loop is alive, and the cancelled one was never added
    finally:
        sched.close()


def test_a_constraint_is_compiled_once_a_request_and_its_copies_agree(smollm2_path):
    """``Engine.constraints`` compiles each distinct constraint of a request once and copies it for
    the request's other sequences (the server does this off the loop that steps every request):
    the copies start fresh and allow what the original allows, token by token."""
    import poot
    from poot.llm import SamplingParams

    m = poot.load("SmolLM2", "cpu", max_seqs=2, max_context=256, progress=False)
    try:
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        params = [SamplingParams(json_schema=schema, max_tokens=48, seed=1), SamplingParams(json_schema=schema, max_tokens=48, seed=2), SamplingParams()]
        first, second, none = m.engine.constraints(params)
        assert none is None and first is not None and second is not first
        assert (first.bitmask() == second.bitmask()).all()
        token = int(np.flatnonzero(first.mask())[0])
        first.advance(token)
        assert not (first.bitmask() == second.bitmask()).all()  # the copy keeps its own state
        second.advance(token)
        assert (first.bitmask() == second.bitmask()).all()
        out = m.complete(["Give me a JSON object."] * 2, params[:2], raw=True)
        assert all(json.loads(c.text)["a"] is not None for c in out), [c.text for c in out]
    finally:
        m.close()
