"""`promptopt serve CARD`: check where it may listen, load the card with its model, and run the app under uvicorn.

The bind check comes first: a non-loopback address without an API key is refused before the model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from promptopt.serving.app import ServeSettings, create_app
from promptopt.serving.security import check_bind, read_api_key


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8000


def check_port(listen: Listen) -> None:
    """Fail now, in one line, when the address cannot be bound (in use, not this machine's), not after the model
    has loaded."""
    import socket

    from promptopt.errors import UserError

    try:
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        with socket.create_server((listen.host.strip("[]"), listen.port), family=family):
            pass
    except OSError as exc:
        raise UserError(
            f"--host {listen.host} --port {listen.port}: cannot listen there ({exc.strerror or exc})"
        ) from None


def prepare(card: str | Path, *, listen: Listen, api_key_file: str | Path | None, settings: ServeSettings, **model):
    """(the app, the Server) for `card`, after the bind check; `model`: Server's model options (model, device,
    dtype, quantize, batch_size)."""
    from dataclasses import replace

    from promptopt.serving.runtime import Server

    key = read_api_key(api_key_file)
    check_bind(listen.host, key)
    check_port(listen)
    settings = replace(settings, api_key=key)
    server = Server(card, limits=settings.limits, **model)
    server.warm()  # the prompt's shared block cached: the first request costs what every later one does
    return create_app(server, settings), server


def uvicorn_config(app, listen: Listen, settings: ServeSettings | None = None, *, log_level: str = "info"):
    """uvicorn's configuration for `app` (its ServeSettings: `app.state.settings` unless given): no Server header,
    no access log of requests below debug, and the connection limits:

    - `header_timeout`, `body_timeout`: the read deadlines uvicorn lacks (protocol.py, on uvicorn's h11 protocol,
      which is used whether or not httptools is installed); headers at most 16 KiB (h11's bound);
    - `keep_alive`: uvicorn's `timeout_keep_alive`, how long an idle keep-alive connection stays open;
    - `shutdown_timeout`: uvicorn's `timeout_graceful_shutdown`: on SIGTERM or SIGINT it stops accepting, lets
      requests in flight finish, and after that many seconds cancels what is left (a client stalled mid-body
      included) and exits; a pass over the model already running finishes first (it cannot be interrupted);
    - `max_connections`: uvicorn's `limit_concurrency`: beyond that many connections or requests at once, 503."""
    import uvicorn

    from promptopt.serving.protocol import read_timeout_protocol

    settings = settings or app.state.settings
    return uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        log_level=log_level,
        server_header=False,
        access_log=log_level == "debug",
        http=read_timeout_protocol(settings.header_timeout, settings.body_timeout),
        h11_max_incomplete_event_size=16 * 1024,
        timeout_keep_alive=settings.keep_alive,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        limit_concurrency=settings.max_connections,
        lifespan="on",
    )


def run(app, listen: Listen, *, log_level: str = "info") -> None:
    """Serve `app` until SIGTERM or SIGINT (then within its `shutdown_timeout`), as `uvicorn_config` says."""
    import uvicorn

    uvicorn.Server(uvicorn_config(app, listen, log_level=log_level)).run()


__all__ = ["Listen", "prepare", "run", "uvicorn_config"]
