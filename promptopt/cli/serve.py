"""`serve`: a prompt card over HTTP (promptopt/serving); docs/serving.md describes the API, limits and security."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from promptopt.cli.app import SHIP, app, quiet_libraries
from promptopt.cli.options import BatchOpt, CardQuantizeOpt, DeviceOpt
from promptopt.errors import UserError


@app.command("serve", rich_help_panel=SHIP)
def serve_command(
    card: Path = typer.Argument(..., help="a card written by `promptopt export` (version 2)"),
    model: str | None = typer.Option(
        None, "--model", help="model spec to answer with (any the CLI takes; default: the card's model.spec)"
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="address to listen on; any non-loopback address needs an API key"
    ),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    api_key_file: Path | None = typer.Option(
        None,
        "--api-key-file",
        help="file whose first line is the API key (at least 16 characters; else $PROMPTOPT_API_KEY); "
        "never give the key itself on the command line",
    ),
    max_batch: int = typer.Option(32, "--max-batch", min=1, help="inputs answered in one pass over the model"),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", min=0.0, help="how long a batch's first request waits for others (milliseconds)"
    ),
    max_inputs: int = typer.Option(32, "--max-inputs", min=1, help="inputs per request (at most --max-batch)"),
    max_chars: int = typer.Option(8000, "--max-chars", min=1, help="characters per question"),
    max_body_bytes: int = typer.Option(1_000_000, "--max-body-bytes", min=1, help="bytes per request body"),
    rate_limit: float = typer.Option(
        20.0, "--rate-limit", min=0.001, help="inputs (see --rate-unit) per second per client address"
    ),
    burst: int = typer.Option(40, "--burst", min=1, help="inputs a client may send at once before --rate-limit"),
    rate_unit: str = typer.Option(
        "inputs",
        "--rate-unit",
        help="what --rate-limit and --burst count: inputs (a batch request spends one per input) or requests",
    ),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="requests waiting to be answered; beyond, 503"),
    auth_failures: int = typer.Option(
        10, "--auth-failures", min=1, help="wrong API keys per minute per client address; beyond, 429 for a while"
    ),
    header_timeout: float = typer.Option(
        10.0,
        "--header-timeout",
        min=0.001,
        help="seconds for a request's headers to arrive; then the connection closes",
    ),
    body_timeout: float = typer.Option(
        30.0, "--body-timeout", min=0.001, help="seconds for a request's body to arrive after its headers; then closed"
    ),
    keep_alive: float = typer.Option(5.0, "--keep-alive", min=0.001, help="seconds an idle connection stays open"),
    shutdown_timeout: float = typer.Option(
        10.0, "--shutdown-timeout", min=0.001, help="seconds SIGTERM waits for requests in flight before cutting them"
    ),
    max_connections: int = typer.Option(
        1000, "--max-connections", min=1, help="connections (and requests) at once; beyond, 503"
    ),
    batch_size: str = BatchOpt,
    device: str = DeviceOpt,
    dtype: str | None = typer.Option(None, "--dtype", help="float32, bfloat16, float16 (default: the card's)"),
    quantize: str | None = CardQuantizeOpt,
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's: critical, error, warning, info, debug"),
) -> None:
    """Serve a card over HTTP: POST /v1/answer (one input or a batch) returns the answer, label log-probs, δ_TCB and
    the fragility flag; GET /healthz. Listens on 127.0.0.1 unless --host says otherwise (then it needs an API key)."""
    from promptopt.serving.app import ServeSettings
    from promptopt.serving.inputs import Limits
    from promptopt.serving.launch import Listen, prepare, run

    quiet_libraries()
    if max_inputs > max_batch:
        raise UserError(f"--max-inputs {max_inputs} exceeds --max-batch {max_batch}: a request must fit one batch")
    if rate_unit not in ("inputs", "requests"):
        raise UserError(f"--rate-unit {rate_unit[:40]!r}: expected inputs or requests")
    if rate_unit == "inputs" and max_inputs > burst:
        raise UserError(f"--max-inputs {max_inputs} exceeds --burst {burst}: a request's inputs must fit a burst")
    try:
        settings = ServeSettings(
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_queue=max_queue,
            max_body_bytes=max_body_bytes,
            rate=rate_limit,
            burst=burst,
            rate_unit=rate_unit,
            limits=Limits(max_inputs=max_inputs, max_chars=max_chars),
            auth_failures=auth_failures,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            keep_alive=keep_alive,
            shutdown_timeout=shutdown_timeout,
            max_connections=max_connections,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    listen = Listen(host=host, port=port)
    the_app, server = prepare(
        card,
        listen=listen,
        api_key_file=api_key_file,
        settings=settings,
        model=model,
        device=device,
        dtype=dtype,
        quantize=quantize,
        batch_size=batch_size,
    )
    identity = server.identity
    flag = identity["flag"]
    print(
        f"serving {card} ({identity['task']}, {identity['decision']}, model {identity['model']}; "
        + (f"flag: {flag['signal']} threshold {flag['threshold']:.4g}" if flag else "no fragility threshold")
        + f") on http://{host}:{port}",
        file=sys.stderr,
    )
    run(the_app, listen, log_level=log_level)
