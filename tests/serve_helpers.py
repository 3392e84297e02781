"""An ASGI app under a real uvicorn server on a free loopback port, in a thread, for tests that use a real HTTP
client (httpx)."""

from __future__ import annotations

import contextlib
import threading
import time


@contextlib.contextmanager
def running(app, *, timeout: float = 30.0):
    """Serve `app` on 127.0.0.1 (a port the OS picks) for the `with` block, configured as `promptopt serve`
    configures uvicorn (`launch.uvicorn_config`: read deadlines, keep-alive, connection limit); yields its base
    URL."""
    import uvicorn

    from promptopt.serving.launch import Listen, uvicorn_config

    server = uvicorn.Server(uvicorn_config(app, Listen("127.0.0.1", 0), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


class EchoRuntime:
    """A stand-in for `Server` (no model): each input's answer is its question, after `delay` seconds a pass and
    `per_input` seconds an input; `started`: a file written when a pass starts (a test in another process waits)."""

    def __init__(self, delay: float = 0.0, started=None, per_input: float = 0.0) -> None:
        from promptopt.serving.inputs import Limits

        self.delay, self.started, self.per_input = delay, started, per_input
        self.identity, self.limits, self.needs_choices = {"card_sha256": "e" * 64}, Limits(max_inputs=4), False

    def answer_groups(self, groups):
        if self.started is not None:
            open(self.started, "w").close()
        time.sleep(self.delay + self.per_input * sum(len(inputs) for inputs in groups))
        return [[{"answer": i.question} for i in inputs] for inputs in groups]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
