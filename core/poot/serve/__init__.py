"""Serving: an OpenAI-compatible HTTP API (``poot serve``) over one scheduling loop that owns the
engine. Needs the ``serve`` extra: ``pip install 'poot[serve]'`` (FastAPI, uvicorn)."""

from typing import Any

__all__ = ["create_app", "serve"]


def create_app(*args, **kwargs):  # type: ignore[no-untyped-def]
    from .app import create_app as make

    return make(*args, **kwargs)


def serve(
    model: str,
    device: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_batch: int = 16,
    max_queue: int = 256,
    kv_memory: str | None = None,
    context: int | None = None,
    name: str | None = None,
    matmul_precision: str = "high",
    kv_dtype: str = "f16",
    max_body: str | int = "32M",
) -> None:
    """Load ``model`` and serve it until interrupted. ``max_body``: the largest request body taken
    (a size such as '32M'); larger ones get a 413."""
    try:
        import uvicorn
    except ImportError:
        from ..errors import PootError

        raise PootError("serving needs FastAPI and uvicorn: pip install 'poot[serve]'") from None
    import socket

    from ..errors import PootError
    from ..llm import load
    from ..llm.handle import parse_bytes

    limit = parse_bytes(max_body, "max_body")
    try:  # before the model loads: a port in use is known at once, not after "serving"
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise PootError(f"cannot serve on {host}:{port}: {e.strerror or e}; pick another --port or --host") from None

    opts = {"max_seqs": max_batch, "max_step_tokens": 256, "progress": True, "matmul_precision": matmul_precision, "kv_dtype": kv_dtype}
    if kv_memory is not None:
        opts["kv_memory"] = kv_memory
    if context is not None:
        opts["max_context"] = context
    handle = load(model, device, **opts)
    app = create_app(handle, name or model, api_key, max_queue, limit)
    print(
        f"poot: serving {name or model} on http://{host}:{port}/v1 ({handle.device.name}, matmul precision {handle.matmul_precision}, KV cache {handle.kv_dtype})",
        flush=True,
    )
    sched = app.state.api.sched

    class Draining(uvicorn.Server):  # type: ignore[misc]
        """On SIGTERM or Ctrl-C the requests in flight are ended with a 503 (an error event in a
        stream, then its end) and their connections close; uvicorn's grace period is only for
        what is left after that."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            sched.drain()
            super().handle_exit(sig, frame)

    Draining(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)).run()
