"""OpenAI request bodies (the fields poot reads; others are ignored) and the error shape."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints

__all__ = ["ApiError", "error_body", "StreamOptions", "CompletionRequest", "ChatRequest", "ResponseFormat"]


class ApiError(Exception):
    """An error for the client, in OpenAI's shape: ``status``, ``message``, ``type``, ``param``, ``code``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def _text(s: str | None) -> str | None:
    """``s`` as text JSON can carry to any client: lone surrogates (a request's, quoted back) escaped."""
    return s if s is None or s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(e: ApiError) -> dict[str, Any]:
    return {"error": {"message": _text(e.message), "type": e.type, "param": _text(e.param), "code": e.code}}


class _Body(BaseModel):
    # NaN and infinities are no numbers a client means; unknown fields are ignored, as OpenAI's are
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


Int = Annotated[int, Strict()]  # an integer as JSON writes it: true is no max_tokens of 1
MAX_STOPS = 64  # stop strings a request (OpenAI takes 4): each is matched against every new token
MAX_STOP_CHARS = 4096  # characters a stop string: its matcher is built on the scheduling thread
MAX_LOGIT_BIAS = 300  # tokens a request's logit_bias (as OpenAI's): each is weighed against every vocabulary entry of the step
StopString = Annotated[str, StringConstraints(max_length=MAX_STOP_CHARS)]


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str
    n: Int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: Int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: Int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    max_tokens: Int | None = Field(None, ge=1)
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[Int] | list[list[Int]]
    logprobs: Int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: Int | None = Field(None, ge=1, le=16)


class JsonSchemaFormat(_Body):
    name: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: Any = None  # OpenAI's forms before tools, refused with what to send instead
    function_call: Any = None
    parallel_tool_calls: bool | None = None
