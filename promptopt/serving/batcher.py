"""Batching concurrent requests: an asyncio queue feeding one worker thread that answers a batch of requests in
one call (`Server.answer_groups`: one pass over the model, each request decided on its own).

The loop takes the first waiting request, then keeps taking requests until the batch holds `max_batch` inputs or
`max_wait` seconds have passed since the first one was taken, whichever comes first; a request that would overflow
the batch waits for the next one. While the worker is busy, requests queue up, so under load a batch fills without
waiting; an idle server adds at most `max_wait` to a request. At most `max_queue` requests wait: beyond that a
request is refused at once (503) instead of waiting without bound.

A pass that raises (a bug, or an input that breaks the model in a way the runtime could not pin on it) is answered
request by request, each in a pass of its own, so only the request(s) that fail alone get the 500, never the others
batched with them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

log = logging.getLogger("promptopt.serve")


class Busy(Exception):
    """The queue is full (or the server is stopping): answered 503."""


@dataclass
class _Pending:
    inputs: list
    future: asyncio.Future


@dataclass
class BatchStats:
    """What the worker did: calls made, how many requests and inputs each call answered, and the seconds it spent
    in them (`busy_seconds`: against the wall time, how much of it went to the model and the runtime)."""

    calls: int = 0
    busy_seconds: float = 0.0
    requests: Counter = field(default_factory=Counter)  # requests per call -> how many calls
    inputs: Counter = field(default_factory=Counter)  # inputs per call -> how many calls

    def as_dict(self) -> dict:
        return {
            "calls": self.calls,
            "busy_seconds": round(self.busy_seconds, 6),
            "requests_per_call": {str(k): v for k, v in sorted(self.requests.items())},
            "inputs_per_call": {str(k): v for k, v in sorted(self.inputs.items())},
        }


class Batcher:
    def __init__(self, answer_groups, *, max_batch: int = 32, max_wait: float = 0.005, max_queue: int = 256) -> None:
        if max_batch < 1 or max_queue < 1 or max_wait < 0:
            raise ValueError("max_batch and max_queue must be >= 1 and max_wait >= 0")
        self.answer_groups = answer_groups
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait, max_queue
        self.stats = BatchStats()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._carry: _Pending | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promptopt-serve")
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        pending = [self._carry] if self._carry else []
        while self._queue is not None and not self._queue.empty():
            pending.append(self._queue.get_nowait())
        for p in pending:
            if not p.future.done():
                p.future.set_exception(Busy("the server is stopping"))

    async def submit(self, inputs: list) -> list:
        """The answers to one request's inputs, in order (or the InputError the runtime raised for them)."""
        if self._queue is None or self._task is None or self._task.done():
            raise Busy("the server is not running")
        future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(inputs, future))
        except asyncio.QueueFull:
            raise Busy(f"{self.max_queue} requests are already waiting") from None
        return await future

    async def _next(self, timeout: float | None) -> _Pending | None:
        if self._carry is not None:
            pending, self._carry = self._carry, None
            return pending
        if timeout is None:
            return await self._queue.get()
        if timeout <= 0:
            return self._queue.get_nowait() if not self._queue.empty() else None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def _pass(self, batch: list[_Pending]) -> list:
        """One call of `answer_groups` on the worker thread, counted in the stats."""
        loop = asyncio.get_running_loop()
        self.stats.calls += 1
        self.stats.requests[len(batch)] += 1
        self.stats.inputs[sum(len(p.inputs) for p in batch)] += 1
        started = loop.time()
        try:
            return await loop.run_in_executor(self._executor, self.answer_groups, [p.inputs for p in batch])
        finally:
            self.stats.busy_seconds += loop.time() - started

    async def _alone(self, pending: _Pending):
        """One request's result from a pass of its own: only a request whose own inputs break it fails (a 500)."""
        if pending.future.done():
            return None
        try:
            return (await self._pass([pending]))[0]
        except Exception as exc:
            log.exception("answering a request failed")
            return exc

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next(None)
            batch, size = [first], len(first.inputs)
            deadline = loop.time() + self.max_wait
            while size < self.max_batch:
                pending = await self._next(deadline - loop.time())
                if pending is None:
                    break
                if size + len(pending.inputs) > self.max_batch:
                    self._carry = pending  # first in the next batch
                    break
                batch.append(pending)
                size += len(pending.inputs)
            batch = [p for p in batch if not p.future.done()]  # a client that went away is not answered
            if not batch:
                continue
            try:
                results = await self._pass(batch)
            except Exception as exc:  # a bug, or an input that breaks the pass: answer each request alone
                if len(batch) == 1:
                    log.exception("answering a request failed")
                    results = [exc]
                else:
                    log.warning("a pass of %d requests failed (%r): answering each alone", len(batch), exc)
                    results = [await self._alone(p) for p in batch]
            for pending, result in zip(batch, results):
                if pending.future.done():
                    continue
                if isinstance(result, Exception):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)


__all__ = ["BatchStats", "Batcher", "Busy"]
