"""Plain ASGI middlewares in front of the API: the API key, and a bound on a request's body.

Both leave the receive channel to the handlers once they have passed a request on, so a handler
still sees its client's disconnect."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi.responses import JSONResponse

from .protocol import ApiError, error_body

__all__ = ["Auth", "BodyLimit"]


async def _refuse(e: ApiError, scope: Any, receive: Any, send: Any) -> None:
    await JSONResponse(error_body(e), status_code=e.status)(scope, receive, send)


class Auth:
    """``Authorization: Bearer <key>`` on /v1 routes."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.expected = app, key.encode()

    def _allowed(self, header: bytes | None) -> bool:
        """``Bearer <key>``, the scheme in any case (RFC 7235), the key compared in constant time."""
        scheme, _, given = (header or b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and not self._allowed(dict(scope["headers"]).get(b"authorization")):
            await _refuse(
                ApiError(401, "invalid API key: send 'Authorization: Bearer <key>'", type="authentication_error", code="invalid_api_key"), scope, receive, send
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Bodies past ``limit`` bytes get a 413 before they are parsed: one whose ``Content-Length``
    says so at once, unread; a chunked one once its chunks pass the limit (it is read here, up
    to the limit, and handed on whole). Without it, a client could make the server hold any
    amount of JSON in memory, and parse it on the loop every other client waits on."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than the server's limit of {self.limit} bytes (poot serve --max-body)", code="request_too_large")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.strip().isdigit() and int(length) > self.limit:
                await _refuse(self._too_large(), scope, receive, send)
                return
            await self.app(scope, receive, send)  # (the server holds a body to the length it declared)
            return
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left before its body ended
                return
            size += len(msg.get("body", b""))
            if size > self.limit:
                await _refuse(self._too_large(), scope, receive, send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Any:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)
