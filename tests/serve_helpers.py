"""An ASGI app under a real uvicorn server on a free loopback port, in a thread, for tests that use a real HTTP
client (httpx)."""

from __future__ import annotations

import contextlib
import threading
import time


@contextlib.contextmanager
def running(app, *, timeout: float = 30.0):
    """Serve `app` on 127.0.0.1 (a port the OS picks) for the `with` block; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
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
