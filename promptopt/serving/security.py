"""Who may ask: the bind address and its API key, the key checked in constant time, and a per-client rate limit.

- The server listens on 127.0.0.1 unless told otherwise. Bound to any address that is not loopback it refuses to
  start without an API key, read from a file (`--api-key-file`) or the environment (`PROMPTOPT_API_KEY`), never
  from a command-line value (which every user of the machine sees in `ps`). A key is at least 16 characters.
- A request carries the key as `Authorization: Bearer KEY` or `X-API-Key: KEY`; both sides are hashed (SHA-256)
  and compared with `hmac.compare_digest`, so neither the key's characters nor its length show in the timing.
- Rate: a token bucket per client address, `rate` inputs (or requests) per second with bursts of `burst`; wrong
  keys have a bucket of their own per client (the app's `auth_failures` per minute), checked before the key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from promptopt.errors import UserError

API_KEY_ENV = "PROMPTOPT_API_KEY"
MIN_KEY_CHARS = 16
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`; anything else (0.0.0.0, ::, a LAN address, a host name) is not."""
    if host.strip().lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def read_api_key(path: str | Path | None, environ=None) -> str | None:
    """The API key from `path` (its first line, surrounding whitespace dropped), else from $PROMPTOPT_API_KEY, else
    None. A key file that cannot be read, an empty key or a short one is one UserError."""
    environ = os.environ if environ is None else environ
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--api-key-file {path}: cannot read it ({exc.__class__.__name__})") from None
        key, where = (text.splitlines() or [""])[0].strip(), f"--api-key-file {path}"
    elif environ.get(API_KEY_ENV) is not None:
        key, where = environ[API_KEY_ENV].strip(), f"${API_KEY_ENV}"
    else:
        return None
    if not key:
        raise UserError(f"{where}: the API key is empty")
    if len(key) < MIN_KEY_CHARS:
        raise UserError(f"{where}: the API key has {len(key)} characters; use at least {MIN_KEY_CHARS}")
    return key


def check_bind(host: str, key: str | None) -> None:
    """Refuse to listen on a non-loopback address without an API key (one UserError saying how to give one)."""
    if not is_loopback(host) and key is None:
        raise UserError(
            f"--host {host}: not a loopback address, and no API key was given: anyone who can reach it could use "
            f"the model. Give a key with --api-key-file FILE or ${API_KEY_ENV} (never on the command line), or "
            "listen on 127.0.0.1"
        )


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class KeyCheck:
    """A request's key against the server's, in constant time."""

    def __init__(self, key: str) -> None:
        self._digest = _digest(key)

    def __repr__(self) -> str:
        return "KeyCheck(<hidden>)"

    def __call__(self, headers) -> bool:
        given = headers.get("x-api-key")
        if given is None:
            scheme, _, value = (headers.get("authorization") or "").partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
        return hmac.compare_digest(_digest(given or ""), self._digest) and bool(given)


class RateLimit:
    """A token bucket per client: `rate` tokens per second, at most `burst` at once (thread-safe). A request
    spends one token, or (the app's default) one per input, so a client sending batches cannot take more of the
    model than one sending single inputs."""

    def __init__(self, rate: float, burst: int, *, clients: int = 10_000, clock=time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst, self.clients, self.clock = rate, burst, clients, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)
        self._lock = threading.Lock()

    def waiting(self, client: str) -> float:
        """0.0 when `client` has a token, else the seconds until it has one; takes nothing."""
        now = self.clock()
        with self._lock:
            tokens, when = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def allow(self, client: str) -> float:
        """0.0 when the request may go ahead (a token is taken), else the seconds until one is free."""
        now = self.clock()
        with self._lock:
            tokens, when = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
            self._buckets[client] = (tokens - 1 if wait == 0 else tokens, now)
            self._forget()
            return wait

    def spend(self, client: str, cost: float) -> float:
        """Take `cost` more tokens from a client `allow` let in: 0.0, or (nothing taken) the seconds until a request
        of that cost would pass again, `allow`'s token included.

        The balance may go below zero, down to -burst: the client then waits until it refills. Charging a request
        in full once it is in (its inputs are known only after its body is read), rather than refusing a batch the
        bucket cannot cover at once, keeps a client that sends batches at `rate` inputs a second: refused, its
        retries would spend the bucket one token at a time and never see enough. The floor bounds what clients
        let in at the same moment, before any body was read, may charge."""
        now = self.clock()
        with self._lock:
            tokens, when = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            short = tokens - cost < -self.burst
            self._buckets[client] = (tokens if short else tokens - cost, now)
            self._forget()
            return (max(1.0, cost + 1 - self.burst) - tokens) / self.rate if short else 0.0

    def _forget(self) -> None:
        while len(self._buckets) > self.clients:  # the least recently seen client is forgotten first
            self._buckets.popitem(last=False)


__all__ = [
    "API_KEY_ENV",
    "MIN_KEY_CHARS",
    "KeyCheck",
    "RateLimit",
    "check_bind",
    "is_loopback",
    "read_api_key",
]
