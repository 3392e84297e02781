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
    return create_app(server, settings), server


def run(app, listen: Listen, *, log_level: str = "info") -> None:
    """Serve `app` until interrupted (uvicorn; no Server header, no access log of request bodies)."""
    import uvicorn

    uvicorn.run(
        app,
        host=listen.host,
        port=listen.port,
        log_level=log_level,
        server_header=False,
        access_log=log_level == "debug",
    )


__all__ = ["Listen", "prepare", "run"]
