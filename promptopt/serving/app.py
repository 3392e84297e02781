"""The HTTP face of a `Server`: a FastAPI app with `POST /v1/answer` and `GET /healthz`.

Every response is one line of JSON. An answer carries the card's identity (`card`); an error is
`{"error": {"status": S, "message": "..."}}` with one message naming what was wrong (and the card's identity,
except on 401 and 429) — never a stack trace: a bug is logged on the server and answered 500 with one line.
Requests are batched (`batcher.py`), checked against the API key (`security.py`) and the limits in
`ServeSettings`: body bytes, inputs per request, characters per question, inputs (or requests) per second per
client, wrong keys per minute per client, a JSON content type, strict JSON (`inputs.parse_json_body`). The
connection limits (read deadlines, keep-alive, the shutdown deadline, connections at once) are uvicorn's, set from
the same `ServeSettings` by `launch.uvicorn_config`; requests cut at the shutdown deadline are answered by
`AnswerCut`.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from promptopt.serving.batcher import Batcher, Busy
from promptopt.serving.inputs import InputError, Limits, parse_json_body, parse_request
from promptopt.serving.security import KeyCheck, RateLimit

log = logging.getLogger("promptopt.serve")


RATE_UNITS = ("inputs", "requests")


@dataclass(frozen=True)
class ServeSettings:
    """How the app batches and what it accepts (defaults: the CLI's)."""

    max_batch: int = 32  # inputs answered in one pass over the model
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others
    max_queue: int = 256  # requests waiting; beyond, 503
    max_body_bytes: int = 1_000_000
    rate: float = 20.0  # inputs (or requests, see rate_unit) per second per client address
    burst: int = 40
    rate_unit: str = "inputs"  # "inputs": a request spends one token per input; "requests": one per request
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = field(default=None, repr=False)
    auth_failures: int = 10  # wrong or missing keys per minute per client address; beyond, 429 for every request
    # connections (uvicorn's, see launch.uvicorn_config; read deadlines: protocol.py)
    header_timeout: float = 10.0  # seconds for a request's headers to arrive
    body_timeout: float = 30.0  # seconds for its body to arrive, after the headers
    keep_alive: float = 5.0  # seconds an idle keep-alive connection stays open
    shutdown_timeout: float = 10.0  # seconds SIGTERM waits for requests in flight; then they are cut
    max_connections: int = 1000  # connections (and requests) at once; beyond, 503
    max_drain_bytes: int = 16_000_000  # body bytes read and thrown away to deliver an early answer (DrainBody)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 1 or self.max_body_bytes < 1 or self.max_wait_ms < 0:
            raise ValueError("max_batch, max_queue, max_body_bytes must be >= 1 and max_wait_ms >= 0")
        if self.auth_failures < 1 or self.max_connections < 1 or self.max_drain_bytes < 0:
            raise ValueError("auth_failures and max_connections must be >= 1 and max_drain_bytes >= 0")
        for name in ("header_timeout", "body_timeout", "keep_alive", "shutdown_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.rate_unit not in RATE_UNITS:
            raise ValueError(f"rate_unit: expected one of {', '.join(RATE_UNITS)}, got {self.rate_unit!r}")
        if self.rate_unit == "inputs" and self.limits.max_inputs > self.burst:
            raise ValueError(
                f"limits.max_inputs ({self.limits.max_inputs}) exceeds burst ({self.burst}): with the rate counted "
                "in inputs a request's inputs must fit a burst"
            )
        if self.limits.max_inputs > self.max_batch:
            raise ValueError(
                f"limits.max_inputs ({self.limits.max_inputs}) exceeds max_batch ({self.max_batch}): "
                "a request must fit one batch"
            )


def _too_many(message: str, wait: float):
    """429 with the seconds to wait (at least 1) in Retry-After."""
    return _error(429, message, headers={"Retry-After": str(max(1, round(wait)))})


def _error(status: int, message: str, identity: dict | None = None, headers: dict | None = None):
    body = {"error": {"status": status, "message": message}}
    if identity is not None:
        body["card"] = identity
    return JSONResponse(body, status_code=status, headers=headers)


class DrainBody:
    """Pure ASGI middleware: before an answer starts, what the app left of the request body is read and thrown
    away, up to `limit` bytes, so that the client sees the answer.

    Why: a server that answers before reading the whole body (a 413 on the Content-Length, a 401, a 415) and then
    closes leaves unread bytes in its socket, and the kernel answers them with a reset. A client that sends its
    whole body before reading (Python's urllib, requests) then sees "connection reset by peer", not the answer.
    uvicorn throws away a body that arrives after the answer on a keep-alive connection, but closes at once when the
    client said `Connection: close`, as urllib does. Reading first costs at most `limit` bytes, and the body read
    deadline (protocol.py) bounds the time; a body declared longer than `limit` is not read, and its answer closes
    the connection (a client that reads while it sends, like curl, still sees it)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        declared = int(length) if length.isdigit() else None
        done = (declared is None or declared == 0) and b"transfer-encoding" not in headers  # no body to read
        too_long = declared is not None and declared > self.limit

        async def receive_tracked():
            nonlocal done
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                done = True
            return message

        async def send_after_drain(message) -> None:
            nonlocal done
            if message["type"] == "http.response.start" and not done:
                drained = 0
                while not done and not too_long and drained <= self.limit:
                    drained += len((await receive_tracked()).get("body", b""))
                if not done:  # not read to its end: the connection cannot carry another request
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive_tracked, send_after_drain)


class AnswerCut:
    """Pure ASGI middleware, outermost: a request still running when uvicorn cancels it (SIGTERM, past the
    shutdown deadline) is answered 503 in the one JSON line every error has, and the cancellation ends here.

    Why: uvicorn cancels the request's task and, for any exception that reaches it, logs "Exception in ASGI
    application" with the traceback and answers a plain-text 500: a shutdown with 32 requests in flight logged 62
    tracebacks. A cut request is no bug: one warning line names it."""

    def __init__(self, app, identity: dict) -> None:
        self.app, self.identity = app, identity

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # handled: later awaits (the answer's send) run
            log.warning("cut at the shutdown deadline: %s %s", scope.get("method"), scope.get("path"))
            if not started:  # (once started, uvicorn closes the connection: the client sees it cut)
                message = "the server is shutting down: this request was cut at its shutdown deadline; retry"
                response = _error(503, message, self.identity, headers={"Connection": "close", "Retry-After": "1"})
                await response(scope, receive, send)


def _client(request) -> str:
    return request.client.host if request.client else "unknown"


def _is_json(content_type: str | None) -> bool:
    """application/json, with or without parameters (charset=utf-8)."""
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/json"


async def _read_body(request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise InputError(f"request body: {int(length):,} bytes, over this server's limit of {limit:,} bytes", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise InputError(f"request body: over this server's limit of {limit:,} bytes", 413)
    return bytes(body)


def create_app(server, settings: ServeSettings | None = None):
    """The FastAPI app serving `server` (a `promptopt.serving.Server`, or anything with its `answer_groups`,
    `identity`, `limits` and `needs_choices`)."""
    settings = settings or ServeSettings()
    limits = settings.limits
    server.limits = limits
    batcher = Batcher(
        server.answer_groups,
        max_batch=settings.max_batch,
        max_wait=settings.max_wait_ms / 1000,
        max_queue=settings.max_queue,
    )
    key_check = KeyCheck(settings.api_key) if settings.api_key is not None else None
    rate = RateLimit(settings.rate, settings.burst)
    failures = RateLimit(settings.auth_failures / 60, settings.auth_failures)  # wrong keys, per client
    identity = server.identity
    rate_message = (
        f"rate limit: {settings.rate:g} {settings.rate_unit} per second per client (bursts of {settings.burst})"
    )

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="promptopt serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.batcher = batcher
    app.state.settings = settings

    @app.middleware("http")
    async def guard(request: Request, call_next):
        """Every request takes a token of its client's rate limit, then (on a server with a key) is checked; a
        wrong or missing key takes a token of the client's wrong-key limit, and a client out of those is answered
        429 before its key is looked at, so keys cannot be guessed at the request rate."""
        client = _client(request)
        wait = rate.allow(client)
        if wait > 0:
            return _too_many(rate_message, wait)
        if key_check is not None:
            wait = failures.waiting(client)
            if wait > 0:
                return _too_many(f"too many wrong API keys: {settings.auth_failures} per minute per client", wait)
            if not key_check(request.headers):
                failures.allow(client)
                return _error(401, "missing or wrong API key (Authorization: Bearer KEY, or X-API-Key: KEY)")
        try:
            return await call_next(request)
        except Exception:  # a bug below the routes: one line, logged here
            log.exception("request %s %s failed", request.method, request.url.path)
            return _error(500, "internal error (logged on the server)", identity)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        message = {404: "not found: the API is POST /v1/answer and GET /healthz", 405: "method not allowed"}.get(
            exc.status_code, str(exc.detail)
        )
        return _error(exc.status_code, message, identity)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):  # no route declares a model, but keep the one-line shape
        return _error(400, "request: malformed", identity)

    @app.get("/healthz")
    async def healthz():
        return JSONResponse({"status": "ok", "card": identity, "batching": batcher.stats.as_dict()})

    @app.post("/v1/answer")
    async def answer(request: Request):
        is_batch = False
        try:
            if not _is_json(request.headers.get("content-type")):
                given = request.headers.get("content-type")
                raise InputError(
                    f"request: Content-Type must be application/json, got {given[:80] if given else 'none'}", 415
                )
            body = parse_json_body(await _read_body(request, settings.max_body_bytes))
            inputs, is_batch = parse_request(body, limits, needs_choices=server.needs_choices)
            if settings.rate_unit == "inputs" and len(inputs) > 1:  # the guard took one token; the rest here
                wait = rate.spend(_client(request), len(inputs) - 1)
                if wait > 0:
                    return _too_many(f"{rate_message}; this request has {len(inputs)} inputs", wait)
            answers = await batcher.submit(inputs)
        except InputError as exc:
            message = str(exc)
            if not is_batch and message.startswith("inputs[0]"):  # the runtime numbers inputs; this was one
                message = "request" + message[len("inputs[0]") :]
            return _error(exc.status, message, identity)
        except ClientDisconnect:  # the client went away (or was cut by the body deadline): nobody to answer
            return _error(400, "request: the client disconnected", identity)
        except Busy as exc:
            return _error(503, f"busy: {exc}; retry later", identity, headers={"Retry-After": "1"})
        except Exception:
            log.exception("answering a request failed")
            return _error(500, "internal error (logged on the server)", identity)
        if is_batch:
            return JSONResponse({"card": identity, "answers": answers})
        return JSONResponse({"card": identity, **answers[0]})

    app.add_middleware(DrainBody, limit=settings.max_drain_bytes)  # outside the guard
    app.add_middleware(AnswerCut, identity=identity)  # added last: outside everything
    return app


__all__ = ["RATE_UNITS", "AnswerCut", "DrainBody", "ServeSettings", "create_app"]
