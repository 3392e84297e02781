"""The HTTP face of a `Server`: a FastAPI app with `POST /v1/answer` and `GET /healthz`.

Every response is one line of JSON. An answer carries the card's identity (`card`); an error is
`{"error": {"status": S, "message": "..."}}` with one message naming what was wrong (and the card's identity,
except on 401 and 429) — never a stack trace: a bug is logged on the server and answered 500 with one line.
Requests are batched (`batcher.py`), checked against the API key (`security.py`) and the limits in
`ServeSettings`: body bytes, inputs per request, characters per question, requests per second per client.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from promptopt.serving.batcher import Batcher, Busy
from promptopt.serving.inputs import InputError, Limits, parse_request
from promptopt.serving.security import KeyCheck, RateLimit

log = logging.getLogger("promptopt.serve")


@dataclass(frozen=True)
class ServeSettings:
    """How the app batches and what it accepts (defaults: the CLI's)."""

    max_batch: int = 32  # inputs answered in one pass over the model
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others
    max_queue: int = 256  # requests waiting; beyond, 503
    max_body_bytes: int = 1_000_000
    rate: float = 20.0  # requests per second per client address
    burst: int = 40
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 1 or self.max_body_bytes < 1 or self.max_wait_ms < 0:
            raise ValueError("max_batch, max_queue, max_body_bytes must be >= 1 and max_wait_ms >= 0")
        if self.limits.max_inputs > self.max_batch:
            raise ValueError(
                f"limits.max_inputs ({self.limits.max_inputs}) exceeds max_batch ({self.max_batch}): "
                "a request must fit one batch"
            )


def _error(status: int, message: str, identity: dict | None = None, headers: dict | None = None):
    body = {"error": {"status": status, "message": message}}
    if identity is not None:
        body["card"] = identity
    return JSONResponse(body, status_code=status, headers=headers)


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


def _parse_json(body: bytes):
    if not body.strip():
        raise InputError("request body: empty; expected a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise InputError("request body: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"request body: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InputError("request body: JSON nested too deeply") from None


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
    identity = server.identity

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="promptopt serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.batcher = batcher

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if key_check is not None and not key_check(request.headers):
            return _error(401, "missing or wrong API key (Authorization: Bearer KEY, or X-API-Key: KEY)")
        client = request.client.host if request.client else "unknown"
        wait = rate.allow(client)
        if wait > 0:
            return _error(
                429,
                f"rate limit: {settings.rate:g} requests per second per client (bursts of {settings.burst})",
                headers={"Retry-After": str(max(1, round(wait)))},
            )
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
            body = _parse_json(await _read_body(request, settings.max_body_bytes))
            inputs, is_batch = parse_request(body, limits, needs_choices=server.needs_choices)
            answers = await batcher.submit(inputs)
        except InputError as exc:
            message = str(exc)
            if not is_batch and message.startswith("inputs[0]"):  # the runtime numbers inputs; this was one
                message = "request" + message[len("inputs[0]") :]
            return _error(exc.status, message, identity)
        except Busy as exc:
            return _error(503, f"busy: {exc}; retry later", identity, headers={"Retry-After": "1"})
        except Exception:
            log.exception("answering a request failed")
            return _error(500, "internal error (logged on the server)", identity)
        if is_batch:
            return JSONResponse({"card": identity, "answers": answers})
        return JSONResponse({"card": identity, **answers[0]})

    return app


__all__ = ["ServeSettings", "create_app"]
