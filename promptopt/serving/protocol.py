"""uvicorn's h11 protocol with the two read deadlines uvicorn lacks: a request's headers, and then its body, must
arrive within a fixed time, or the connection is closed.

uvicorn (0.55) times out only an idle keep-alive connection (`timeout_keep_alive`, armed after a response). A client
that connects and sends nothing, or half a request line, or headers and then part of a body, is held open for ever,
and each such connection holds a slot of `limit_concurrency`: a thousand of them shut out every real client. h11
already bounds the header's size (`h11_max_incomplete_event_size`); this bounds its time.

The smallest correct thing: one timer per connection, following h11's view of the client's side
(`their_state`), re-checked after every read and every answer:

- waiting for a request's headers (`IDLE`) on a new connection, or with part of the next request buffered: the
  *header* deadline, counted from the connection's start or that request's first byte;
- headers received, body still arriving (`SEND_BODY`): the *body* deadline, counted from the end of the headers;
- the request complete: no deadline (the time the model takes is not the client's), and an idle keep-alive
  connection is uvicorn's own `timeout_keep_alive`.

A deadline is counted from the start of its phase, never reset by a byte arriving, so a client that trickles one
byte a second (slowloris) is cut like one that sends nothing. When it passes the connection is closed (no response:
there is no complete request to answer); an app waiting for the body receives `http.disconnect`. The app reads
every body at once (and `app.DrainBody` what is left before an early answer), so a body is never waiting on the
server when its deadline passes.
"""

from __future__ import annotations

import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("promptopt.serve")


class H11ReadTimeouts(H11Protocol):
    """H11Protocol whose connections must deliver a request's headers within `header_timeout` seconds and its
    body within `body_timeout` seconds (subclass with `read_timeout_protocol`)."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._read_timer = None
        self._read_phase: str | None = None
        super().connection_made(transport)
        self._arm("headers")  # a new connection owes its first request's headers

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Arm, keep or drop the deadline for what the client owes now."""
        if self.transport is None or self.transport.is_closing():
            return self._disarm()
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            phase = "body"
        elif state is h11.IDLE and (self.conn.trailing_data[0] or self._read_phase == "headers"):
            phase = "headers"  # part of a request's head is buffered (or none yet on a new connection)
        else:
            phase = None
        if phase != self._read_phase:
            self._disarm()
            if phase is not None:
                self._arm(phase)

    def _arm(self, phase: str) -> None:
        timeout = self.header_timeout if phase == "headers" else self.body_timeout
        self._read_phase = phase
        self._read_timer = self.loop.call_later(timeout, self._expired, phase, timeout)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer, self._read_phase = None, None

    def _expired(self, phase: str, timeout: float) -> None:
        self._read_timer, self._read_phase = None, None
        if self.transport.is_closing():
            return
        who = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.warning("closed the connection from %s: request %s not received within %g s", who, phase, timeout)
        self.transport.close()


def read_timeout_protocol(header_timeout: float, body_timeout: float) -> type[H11ReadTimeouts]:
    """The protocol class for `uvicorn.Config(http=...)` with these deadlines (seconds)."""
    if header_timeout <= 0 or body_timeout <= 0:
        raise ValueError("header_timeout and body_timeout must be > 0")
    return type("H11ReadTimeouts", (H11ReadTimeouts,), {"header_timeout": header_timeout, "body_timeout": body_timeout})


__all__ = ["H11ReadTimeouts", "read_timeout_protocol"]
