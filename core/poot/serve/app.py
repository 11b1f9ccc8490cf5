"""The OpenAI-compatible HTTP API over one scheduling loop (FastAPI on uvicorn).

Handlers turn a request into token ids and sampling parameters, queue its sequences with the
scheduler, and relay events: as server-sent events when streaming, as one JSON body otherwise.
Every error leaves in OpenAI's shape with a 4xx status; a client that disconnects mid-stream has its
sequences cancelled (their KV blocks freed) at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import PootError
from ..llm.engine import Event
from ..llm.handle import ModelHandle
from ..llm.params import ParameterError, SamplingParams
from ..text.chat import ChatTemplateError
from ..text.guided import ConstraintError
from ..text.tokenizer import TokenizerError
from .messages import chat_messages
from .middleware import Auth, BodyLimit
from .protocol import ApiError, ChatRequest, CompletionRequest, error_body
from .scheduler import QueueFull, Scheduler, ShuttingDown
from .tools import check_tools, forced_call_schema, parse_tool_calls, tool_system_prompt

__all__ = ["create_app"]


def _params(req: Any, max_tokens: int, logprobs: int | None, **constraint: Any) -> SamplingParams:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    bias = {}
    for k, v in (req.logit_bias or {}).items():
        if not (k.isascii() and k.isdigit()):  # (int() would also take ' 5 ', '1_0' and other scripts' digits)
            raise ApiError(400, f"logit_bias keys are token ids, got {k!r}", param="logit_bias")
        bias[int(k)] = float(v)
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=req.top_p or 1.0,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=bias,
            seed=req.seed,
            max_tokens=max_tokens,
            stop=stop,
            logprobs=logprobs,
            **constraint,
        )
    except ParameterError as e:
        raise ApiError(400, str(e), param=e.name) from None


class _Api:
    def __init__(self, handle: ModelHandle, model_id: str, scheduler: Scheduler, api_key: str | None) -> None:
        self.m, self.model_id, self.sched, self.api_key = handle, model_id, scheduler, api_key
        self.context = handle.max_context
        self.created = int(time.time())
        # the most bytes one token stands for: a text of more characters than the context's tokens
        # could cover is refused before the tokenizer reads it
        self.token_span = max((len(b) for b in handle.tokenizer.token_bytes), default=1) or 1

    # -- common -------------------------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name != self.model_id:
            shown = name if len(name) <= 200 else name[:200] + "..."
            raise ApiError(404, f"the model '{shown}' does not exist; this server serves '{self.model_id}'", param="model", code="model_not_found")

    @staticmethod
    def check_stream(req: Any) -> None:
        """``stream_options`` only with ``stream`` (as OpenAI answers: a client asking for usage in a
        stream it did not ask for has a bug worth seeing)."""
        if req.stream_options is not None and not req.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")

    def budget(self, prompt_len: int, asked: int | None, field: str = "messages") -> int:
        """Tokens the answer may take: what was asked, or the room the context leaves. A prompt that
        fills the context blames ``field`` (the request's prompt field)."""
        room = self.context - prompt_len
        if room < 1:
            raise ApiError(400, f"this model's context is {self.context} tokens; the prompt has {prompt_len}", param=field, code="context_length_exceeded")
        if asked is not None and asked > room:
            raise ApiError(
                400,
                f"this model's context is {self.context} tokens; the prompt has {prompt_len} and {asked} more were asked for ({prompt_len + asked} in all)",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return asked if asked is not None else room

    def fits(self, chars: int, field: str) -> None:
        """Refuse a text of ``chars`` characters that cannot fit the context (each character is a byte
        or more, each token covers ``token_span`` bytes at most) before tokenizing it."""
        if chars > self.context * self.token_span:
            raise ApiError(
                400,
                f"this model's context is {self.context} tokens; the {field} has {chars} characters, more than it can hold",
                param=field,
                code="context_length_exceeded",
            )

    def encode(self, text: str, field: str, special: bool = True) -> list[int]:
        """``text``'s token ids; a text too long for the context, or no Unicode text, is a 400 naming ``field``."""
        self.fits(len(text), field)
        try:
            return self.m.tokenizer.encode(text, add_special_tokens=special)
        except TokenizerError as e:
            raise ApiError(400, f"{field}: {e}", param=field) from None

    def token_text(self, tid: int) -> str:
        return self.m.tokenizer.token_bytes[tid].decode("utf-8", errors="replace") if 0 <= tid < len(self.m.tokenizer.token_bytes) else ""

    async def run(self, prompts: list[list[int]], params: list[SamplingParams], blame: str | None = None) -> tuple[list[int], asyncio.Queue]:
        """Queue the sequences; their ids and the queue their events arrive on. A constraint that does
        not compile is a 400 naming ``blame`` (the request's field that set it)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        compiled = None
        if any(p.constrained for p in params):  # compiled here, once a request, off the loop that steps every request
            try:
                compiled = await asyncio.to_thread(self.m.engine.constraints, params)
            except ParameterError as e:
                raise ApiError(400, str(e), param=e.name) from None
            except ConstraintError as e:
                raise ApiError(400, str(e), param=blame) from None
        try:
            fut = self.sched.submit(prompts, params, lambda ev: loop.call_soon_threadsafe(q.put_nowait, ev), compiled)
            ids = await asyncio.wrap_future(fut)
        except QueueFull as e:
            raise ApiError(429, str(e), type="rate_limit_exceeded", code="queue_full") from None
        except ParameterError as e:
            raise ApiError(400, str(e), param=e.name) from None
        except ConstraintError as e:
            raise ApiError(400, str(e), param=blame) from None
        except ShuttingDown as e:
            raise ApiError(503, str(e), type="server_error", code="server_shutting_down") from None
        except PootError as e:
            raise ApiError(400, str(e)) from None
        return ids, q

    def watch(self, request: Request, ids: list[int]) -> asyncio.Task:
        """For a non-streaming request: cancel its sequences if the client goes away while waiting."""

        async def poll() -> None:
            while True:
                await asyncio.sleep(0.25)
                if await request.is_disconnected():
                    self.sched.cancel(ids)
                    return

        return asyncio.create_task(poll())

    @staticmethod
    def failure(ev: Event, blame: str | None = None) -> ApiError:
        """An error the engine reported for a sequence, as the client's error: the request's (400,
        naming ``blame``, the field that set the output's constraint) where the engine blames one of
        its parameters, else the server's (500)."""
        msg = ev.error or "generation failed"
        if ev.finished == "shutdown":
            return ApiError(503, f"{msg}: the answer was cut short; send the request again", type="server_error", code="server_shutting_down")
        if ev.error_param is not None:
            return ApiError(400, msg, param=blame or ev.error_param, code="generation_failed")
        return ApiError(500, msg, type="server_error", code="generation_failed")

    @staticmethod
    def blame(req: ChatRequest) -> str:
        """The chat request's field that set its output's constraint."""
        return "response_format" if req.response_format is not None and req.response_format.type != "text" else "tool_choice"

    @staticmethod
    async def events(ids: list[int], q: asyncio.Queue) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) until every sequence finished."""
        index = {s: i for i, s in enumerate(ids)}
        left = set(ids)
        while left:
            ev: Event = await q.get()
            if ev.seq_id in index:
                if ev.finished is not None:
                    left.discard(ev.seq_id)
                yield index[ev.seq_id], ev

    # -- chat -----------------------------------------------------------------------------------------
    def chat_prompt(self, req: ChatRequest) -> tuple[list[int], dict[str, Any], Mapping[str, Any] | None]:
        tpl = self.m.template
        if tpl is None:
            why = f"its chat template does not compile ({self.m.template_error})" if self.m.template_error else "has no chat template"
            raise ApiError(400, f"'{self.model_id}' {why}: use /v1/completions", param="messages")
        if len(req.messages) > self.context:  # (each message takes a token of the prompt at least; refused before the template renders them)
            raise ApiError(
                400,
                f"this model's context is {self.context} tokens; {len(req.messages)} messages cannot fit it",
                param="messages",
                code="context_length_exceeded",
            )
        legacy = (
            ("functions", "tools", 'tools: [{"type": "function", "function": ...}]'),
            ("function_call", "tool_choice", 'tool_choice: "auto", "none" or {"type": "function", "function": {"name": ...}}'),
        )
        for old, now, send in legacy:  # (if ignored, a client's functions would go unseen without a word)
            if getattr(req, old) not in (None, [], "none", "auto"):  # (what would change nothing is taken)
                raise ApiError(400, f"{old} is OpenAI's deprecated form of {now}: send {send}, and read tool_calls in the answer", param=old)
        messages = chat_messages(req.messages, tpl.source)
        self.fits(sum(len(m["content"]) for m in messages), "messages")
        constraint: dict[str, Any] = {}
        functions = None
        if req.tools:  # (checked even where tool_choice "none" leaves them unused)
            check_tools(req.tools)
        if isinstance(req.tool_choice, str) and req.tool_choice not in ("none", "auto", "required"):  # (with tools or without)
            raise ApiError(400, f"tool_choice must be 'none', 'auto', 'required' or a named function, got {req.tool_choice!r}", param="tool_choice")
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        if not tools and (req.tool_choice == "required" or isinstance(req.tool_choice, Mapping)):
            raise ApiError(400, "tool_choice asks for a tool call, but the request has no tools", param="tool_choice")
        if tools:
            functions = check_tools(tools)
            choice = req.tool_choice or "auto"
            forced: str | None = None
            if isinstance(choice, Mapping):
                fn = choice.get("function")
                forced = fn.get("name") if isinstance(fn, Mapping) else None
                if not isinstance(forced, str):
                    raise ApiError(400, "tool_choice must be {'type': 'function', 'function': {'name': ...}}", param="tool_choice")
                if forced not in functions:
                    raise ApiError(400, f"tool_choice names '{forced}', which is not among the tools", param="tool_choice")
            elif choice not in ("auto", "required"):
                raise ApiError(400, f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}", param="tool_choice")
            if forced is not None or choice == "required":
                constraint["json_schema"] = forced_call_schema(functions, forced)
            if "tools" not in tpl.source:
                sys_msg = tool_system_prompt(tools)
                if messages and messages[0].get("role") == "system":
                    messages[0] = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{sys_msg}"}
                else:
                    messages.insert(0, {"role": "system", "content": sys_msg})
        rf = req.response_format
        if rf is not None and rf.type != "text":
            if constraint:
                raise ApiError(400, "response_format cannot be combined with a required tool call", param="response_format")
            if rf.type == "json_object":
                constraint["json_schema"] = {"type": "object"}
            else:
                if rf.json_schema is None or rf.json_schema.schema_ is None:
                    raise ApiError(400, "response_format json_schema needs json_schema.schema", param="response_format.json_schema")
                constraint["json_schema"] = rf.json_schema.schema_
        try:
            text = tpl.render(messages, add_generation_prompt=True, tools=tools if "tools" in tpl.source else None)
        except ChatTemplateError as e:
            raise ApiError(400, f"the chat template refused these messages: {e}", param="messages") from None
        return self.encode(text, "messages", special=False), constraint, functions

    def chat_logprobs(self, ev: Event) -> dict[str, Any] | None:
        if ev.token is None or ev.logprob is None:
            return None

        def entry(tid: int, lp: float) -> dict[str, Any]:
            t = self.token_text(tid)
            return {"token": t, "logprob": lp, "bytes": list(self.m.tokenizer.token_bytes[tid]) if 0 <= tid < len(self.m.tokenizer.token_bytes) else []}

        return {**entry(ev.token, ev.logprob), "top_logprobs": [entry(t, lp) for t, lp in (ev.top_logprobs or [])]}

    async def chat(self, req: ChatRequest, request: Request) -> Any:
        self.check_model(req.model)
        self.check_stream(req)
        if req.top_logprobs and not req.logprobs:  # (OpenAI refuses it too, rather than answer without them)
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        prompt, constraint, functions = await asyncio.to_thread(self.chat_prompt, req)  # (off the event loop: a long prompt takes a while)
        max_tokens = self.budget(len(prompt), req.max_completion_tokens or req.max_tokens)
        lp = (req.top_logprobs or 0) if req.logprobs else None
        base = _params(req, max_tokens, lp, **constraint)
        params = [base if base.seed is None or i == 0 else SamplingParams(**{**base.__dict__, "seed": base.seed + i}) for i in range(req.n)]
        ids, q = await self.run([prompt] * req.n, params, self.blame(req) if constraint else None)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_id, "system_fingerprint": "poot"}
        if req.stream:
            return StreamingResponse(self.chat_stream(req, ids, q, head, len(prompt), functions, constraint), media_type="text/event-stream")
        texts, reasons, lps, ntok = [""] * req.n, [""] * req.n, [[] for _ in range(req.n)], 0
        failed: ApiError | None = None
        watcher = self.watch(request, ids)
        try:
            async for i, ev in self.events(ids, q):
                texts[i] += ev.text
                ntok += ev.token is not None
                if lp is not None and (e := self.chat_logprobs(ev)) is not None:
                    lps[i].append(e)
                if ev.finished is not None:
                    reasons[i] = ev.finished
                if ev.finished in ("error", "shutdown") and failed is None:
                    failed = self.failure(ev, self.blame(req))
        finally:
            watcher.cancel()
            self.sched.cancel(ids)
        if failed is not None:  # (an answer cut short is not passed off as a whole one)
            raise failed
        choices = []
        for i in range(req.n):
            msg: dict[str, Any] = {"role": "assistant", "content": texts[i]}
            reason = "length" if reasons[i] == "length" else "stop"
            if functions:
                content, calls = parse_tool_calls(texts[i], functions)
                if calls:
                    msg = {"role": "assistant", "content": content, "tool_calls": calls}
                    reason = "tool_calls"
            choices.append({"index": i, "message": msg, "logprobs": {"content": lps[i]} if lp is not None else None, "finish_reason": reason})
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": self.model_id,
            "system_fingerprint": "poot",
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": ntok, "total_tokens": len(prompt) + ntok},
        }

    async def chat_stream(
        self,
        req: ChatRequest,
        ids: list[int],
        q: asyncio.Queue,
        head: dict[str, Any],
        prompt_len: int,
        functions: Mapping[str, Any] | None,
        constraint: dict[str, Any],
    ) -> AsyncIterator[str]:
        def sse(obj: Any) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        hold = bool(functions)  # tool calls are parsed from the whole answer: content is sent at the end
        texts = [""] * req.n
        held: list[list[dict[str, Any]]] = [[] for _ in range(req.n)]  # (and its log-probabilities with it)
        ntok = 0
        try:
            for i in range(req.n):
                yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
            async for i, ev in self.events(ids, q):
                ntok += ev.token is not None
                texts[i] += ev.text
                lp = self.chat_logprobs(ev) if req.logprobs else None
                if hold and lp:
                    held[i].append(lp)
                if not hold and (ev.text or lp):
                    yield sse(
                        {**head, "choices": [{"index": i, "delta": {"content": ev.text}, "logprobs": {"content": [lp]} if lp else None, "finish_reason": None}]}
                    )
                if ev.finished in ("error", "shutdown"):  # the error in OpenAI's shape, in place of the choice's end
                    yield sse(error_body(self.failure(ev, self.blame(req))))
                elif ev.finished is not None:
                    reason = "length" if ev.finished == "length" else "stop"
                    delta: dict[str, Any] = {}
                    if hold:
                        content, calls = parse_tool_calls(texts[i], functions or {})
                        if calls:
                            delta = {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]}
                            reason = "tool_calls"
                        else:
                            delta = {"content": content}
                    lps = {"content": held[i]} if held[i] else None
                    yield sse({**head, "choices": [{"index": i, "delta": delta, "logprobs": lps, "finish_reason": reason}]})
            if req.stream_options is not None and req.stream_options.include_usage:
                yield sse({**head, "choices": [], "usage": {"prompt_tokens": prompt_len, "completion_tokens": ntok, "total_tokens": prompt_len + ntok}})
            yield "data: [DONE]\n\n"
        finally:  # finished, or the client went away: nothing of this request stays in the engine
            self.sched.cancel(ids)

    # -- completions ----------------------------------------------------------------------------------
    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            return [self.encode(p, "prompt")]
        if not p:
            raise ApiError(400, "prompt is empty", param="prompt")
        if all(isinstance(x, str) for x in p):
            return [self.encode(x, "prompt") for x in p]  # type: ignore[arg-type]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return [list(x) for x in p]  # type: ignore[arg-type]

    async def completions(self, req: CompletionRequest, request: Request) -> Any:
        self.check_model(req.model)
        self.check_stream(req)
        if req.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of < req.n:
            raise ApiError(400, f"best_of ({req.best_of}) must be at least n ({req.n})", param="best_of")
        if req.best_of is not None and req.best_of > req.n:  # (best_of == n returns every candidate: n's answer)
            raise ApiError(
                400,
                "best_of above n (candidates ranked by log probability on the server) is not supported: ask n completions with logprobs and rank them",
                param="best_of",
            )
        if req.echo:  # refused, not ignored: a client asking for it would read the completion as the prompt's
            raise ApiError(400, "echo is not supported: the prompt is not returned with the completion", param="echo")
        given = req.prompt
        count = 1 if isinstance(given, str) or (given and all(isinstance(x, int) for x in given)) else len(given or ())
        most = max(self.sched.max_queue, 16)  # a request holds one place in the queue: at most that many sequences
        if count * req.n > most:  # (before any prompt is tokenized)
            raise ApiError(400, f"{count * req.n} sequences asked for (prompts x n); this server takes at most {most} a request (--max-queue)", param="prompt")
        prompts = await asyncio.to_thread(self.completion_prompts, req)
        prompts = [p for p in prompts for _ in range(req.n)]
        for p in prompts:
            if not p:
                raise ApiError(400, "a prompt is empty", param="prompt")
        budgets = [self.budget(len(p), req.max_tokens if req.max_tokens is not None else 16, "prompt") for p in prompts]
        base = [_params(req, b, req.logprobs) for b in budgets]
        params = [b if b.seed is None else SamplingParams(**{**b.__dict__, "seed": b.seed + (i % req.n)}) for i, b in enumerate(base)]
        ids, q = await self.run(prompts, params)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model_id, "system_fingerprint": "poot"}
        plen = sum(len(p) for p in prompts[:: req.n])

        def logprobs(ev: Event, offset: int) -> dict[str, Any] | None:
            if req.logprobs is None or ev.token is None or ev.logprob is None:
                return None
            return {
                "tokens": [self.token_text(ev.token)],
                "token_logprobs": [ev.logprob],
                "top_logprobs": [{self.token_text(t): v for t, v in (ev.top_logprobs or [])}],
                "text_offset": [offset],
            }

        if req.stream:

            async def gen() -> AsyncIterator[str]:
                ntok, offsets = 0, [0] * len(ids)
                try:
                    async for i, ev in self.events(ids, q):
                        ntok += ev.token is not None
                        lp = logprobs(ev, offsets[i])
                        offsets[i] += len(ev.text)
                        if ev.finished in ("error", "shutdown"):
                            if ev.text or lp:
                                yield f"data: {json.dumps({**head, 'choices': [{'index': i, 'text': ev.text, 'logprobs': lp, 'finish_reason': None}]})}\n\n"
                            yield f"data: {json.dumps(error_body(self.failure(ev)))}\n\n"
                        elif ev.text or lp or ev.finished is not None:
                            reason = None if ev.finished is None else ("length" if ev.finished == "length" else "stop")
                            yield f"data: {json.dumps({**head, 'choices': [{'index': i, 'text': ev.text, 'logprobs': lp, 'finish_reason': reason}]})}\n\n"
                    if req.stream_options is not None and req.stream_options.include_usage:
                        usage = {"prompt_tokens": plen, "completion_tokens": ntok, "total_tokens": plen + ntok}
                        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    self.sched.cancel(ids)

            return StreamingResponse(gen(), media_type="text/event-stream")
        texts, reasons, ntok = [""] * len(ids), [""] * len(ids), 0
        lps: list[dict[str, list[Any]]] = [{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []} for _ in ids]
        failed: ApiError | None = None
        watcher = self.watch(request, ids)
        try:
            async for i, ev in self.events(ids, q):
                lp = logprobs(ev, len(texts[i]))
                if lp:
                    for k in lps[i]:
                        lps[i][k] += lp[k]
                texts[i] += ev.text
                ntok += ev.token is not None
                if ev.finished is not None:
                    reasons[i] = "length" if ev.finished == "length" else "stop"
                if ev.finished in ("error", "shutdown") and failed is None:
                    failed = self.failure(ev)
        finally:
            watcher.cancel()
            self.sched.cancel(ids)
        if failed is not None:
            raise failed
        choices = [
            {"index": i, "text": texts[i], "logprobs": lps[i] if req.logprobs is not None else None, "finish_reason": reasons[i]} for i in range(len(ids))
        ]
        return {**head, "choices": choices, "usage": {"prompt_tokens": plen, "completion_tokens": ntok, "total_tokens": plen + ntok}}

    def metrics(self) -> str:
        s = self.sched.stats()
        lines = [
            "# HELP poot_queue_depth Requests waiting to be admitted.",
            "# TYPE poot_queue_depth gauge",
            f"poot_queue_depth {s.queue_depth}",
            "# HELP poot_running_sequences Sequences in the running batch.",
            "# TYPE poot_running_sequences gauge",
            f"poot_running_sequences {s.running}",
            "# HELP poot_kv_blocks_used KV cache blocks held by sequences.",
            "# TYPE poot_kv_blocks_used gauge",
            f"poot_kv_blocks_used {s.kv_blocks_used}",
            "# HELP poot_kv_blocks_total KV cache blocks in the pool.",
            "# TYPE poot_kv_blocks_total gauge",
            f"poot_kv_blocks_total {s.kv_blocks_total}",
            "# HELP poot_tokens_per_second Tokens sampled per second over the last 10 s.",
            "# TYPE poot_tokens_per_second gauge",
            f"poot_tokens_per_second {s.tokens_per_second:.3f}",
            "# HELP poot_time_to_first_token_seconds Time from admission request to first token.",
            "# TYPE poot_time_to_first_token_seconds summary",
            *[f'poot_time_to_first_token_seconds{{quantile="{q}"}} {v:.6f}' for q, v in s.ttft_quantiles.items()],
            f"poot_time_to_first_token_seconds_sum {s.ttft_sum:.6f}",
            f"poot_time_to_first_token_seconds_count {s.ttft_count}",
            "# HELP poot_requests_total Requests accepted.",
            "# TYPE poot_requests_total counter",
            f"poot_requests_total {s.requests_total}",
            "# HELP poot_generated_tokens_total Tokens generated.",
            "# TYPE poot_generated_tokens_total counter",
            f"poot_generated_tokens_total {s.tokens_total}",
        ]
        return "\n".join(lines) + "\n"


MAX_BODY = 32 << 20  # bytes of a request's body, by default: far past any prompt a context holds


def create_app(handle: ModelHandle, model_id: str, api_key: str | None = None, max_queue: int = 256, max_body: int = MAX_BODY) -> FastAPI:
    scheduler = Scheduler(handle.engine, max_queue)
    api = _Api(handle, model_id, scheduler, api_key)
    app = FastAPI(title="poot", version="0.1.0")
    app.state.api = api

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(error_body(e), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":  # (its location is a byte offset, not a parameter)
            return JSONResponse(error_body(ApiError(400, f"the body is not valid JSON: {first.get('msg', '')}")), status_code=400)
        where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first.get("loc", ()) if x != "body").lstrip(".")  # messages[0].role
        if first.get("type") == "missing" and where:
            return JSONResponse(error_body(ApiError(400, f"{where} is required", param=where)), status_code=400)
        if where.startswith("prompt"):  # (pydantic names the first member of the union it tried)
            why = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids"
            return JSONResponse(error_body(ApiError(400, why, param="prompt")), status_code=400)
        if not where:  # the body as a whole: not an object, or not sent as JSON at all
            kind = request.headers.get("content-type")  # (without one, the body is read as JSON)
            said = f"Content-Type: application/json, not {kind[:100]!r}" if kind and "json" not in kind.lower() else "one JSON object"
            return JSONResponse(error_body(ApiError(400, f"the body must be a JSON object of the request's parameters, sent as {said}")), status_code=400)
        return JSONResponse(error_body(ApiError(400, f"{where}: {first.get('msg', 'invalid')}", param=where)), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:  # (a body that is not UTF-8, an unknown path ...)
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        return JSONResponse(
            error_body(ApiError(e.status_code, str(e.detail), type=kind)), status_code=e.status_code, headers=getattr(e, "headers", None)
        )  # (405's Allow)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:  # a bug: still the OpenAI shape, and the loop goes on
        return JSONResponse(error_body(ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")), status_code=500)

    app.add_middleware(BodyLimit, limit=max_body)
    if api_key is not None:  # (added last: it runs first, so a client without the key has no body read)
        app.add_middleware(Auth, key=api_key)

    @app.api_route("/health", methods=["GET", "HEAD"])  # (HEAD: load balancers' probes)
    async def health() -> dict[str, str]:
        return {"status": "ok" if scheduler.error is None else f"degraded: {scheduler.error}"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(api.metrics(), media_type="text/plain; version=0.0.4")

    def model_card() -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": api.created, "owned_by": "poot"}

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.api_route("/v1/models/{name:path}", methods=["GET", "HEAD"])
    async def model(name: str) -> dict[str, Any]:  # (the openai client's models.retrieve)
        api.check_model(name)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        return await api.chat(req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await api.completions(req, request)

    @app.on_event("shutdown")
    async def _shutdown() -> None:
        scheduler.close()

    return app
