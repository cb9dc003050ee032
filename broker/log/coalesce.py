"""Group commit inside a worker: concurrent small requests with the same key share ONE database call.

A one-item push costs PostgreSQL a statement's overhead and a commit; ten items over ten partitions
in one ``queen_push_edge`` call cost a fraction of that each (docs/performance.md). So while a worker
already has ``max_inflight`` calls of a kind running, new requests wait in a queue, and the moment a
call finishes everything queued for one key (up to ``max_items`` items) goes out as the next call.
Nothing waits on a timer: an idle worker sends a lone request at once (no added latency at low
rates), and under load the batches grow by themselves with the queue ("natural batching").
``max_per_key`` bounds the calls in flight for one key: a key whose calls contend with each other in
the database (a tenant's pushes lock their partitions' rows until commit) runs one call at a time and
sends bigger ones, while other keys still use the remaining slots (no tenant waits behind another's).

Contract kept: a waiter is answered only from the outcome of the call that carried its job, after
that call returned (the call is its own transaction: returned = committed). ``run(key, jobs)``
returns one outcome per job, in order: a result, or an exception for that job alone (the caller's
``run`` isolates a job when the shared call fails for a reason that may be one job's fault); if
``run`` itself raises, every waiter of the call gets that exception (a database failure: nothing of
the call committed, every waiter answers 503). A waiter cancelled before its call was sent is dropped
from it (nothing of it is written); cancelled after, its outcome is discarded and the others are
answered as usual.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from broker.errors import Unavailable
from broker.metrics import COALESCED_JOBS

log = logging.getLogger("queen.log.coalesce")

K = TypeVar("K", bound=Hashable)
J = TypeVar("J")


@dataclass
class _Waiter(Generic[J]):
    job: J
    size: int
    fut: asyncio.Future[Any]


class Coalescer(Generic[K, J]):
    def __init__(
        self,
        name: str,
        run: Callable[[K, list[J]], Awaitable[list[Any]]],
        *,
        max_inflight: int,
        max_items: int,
        max_per_key: int | None = None,
    ) -> None:
        if max_inflight < 1 or max_items < 1 or (max_per_key is not None and max_per_key < 1):
            raise ValueError("max_inflight, max_items and max_per_key must be >= 1")
        self.name = name
        self._run = run
        self.max_inflight = max_inflight
        self.max_items = max_items
        self.max_per_key = max_per_key if max_per_key is not None else max_inflight
        self._pending: dict[K, list[_Waiter[J]]] = {}  # insertion order = oldest key first
        self._inflight = 0
        self._per_key: dict[K, int] = {}  # calls in flight by key (keys with none are absent)
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # database calls made (for tests and the bench)
        self.jobs = 0  # jobs answered through them

    async def submit(self, key: K, job: J, size: int = 1) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append(_Waiter(job, max(1, size), fut))
        self._pump()
        return await fut  # a cancellation here cancels fut: _take skips it if not sent yet

    def _take(self) -> tuple[K, list[_Waiter[J]]] | None:
        for key in list(self._pending):
            if self._per_key.get(key, 0) >= self.max_per_key:
                continue  # this key waits for one of its calls to finish; the next key may go
            queue = self._pending[key]
            batch: list[_Waiter[J]] = []
            items = 0
            while queue:
                w = queue[0]
                if w.fut.done():  # cancelled while queued: never sent
                    queue.pop(0)
                    continue
                if batch and items + w.size > self.max_items:
                    break
                batch.append(queue.pop(0))
                items += w.size
            if not queue:
                del self._pending[key]
            else:  # the rest of this key waits behind the other keys (round robin between tenants)
                self._pending[key] = self._pending.pop(key)
            if batch:
                return key, batch
        return None

    def _pump(self) -> None:
        while self._inflight < self.max_inflight:
            taken = self._take()
            if taken is None:
                return
            key = taken[0]
            self._inflight += 1
            self._per_key[key] = self._per_key.get(key, 0) + 1
            task = asyncio.get_running_loop().create_task(self._call(*taken), name=f"coalesce-{self.name}")
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: K, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._inflight -= 1
        left = self._per_key[key] - 1
        if left:
            self._per_key[key] = left
        else:
            del self._per_key[key]
        self._pump()

    async def _call(self, key: K, batch: list[_Waiter[J]]) -> None:
        try:
            outcomes = await self._run(key, [w.job for w in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{self.name}: {len(outcomes)} outcomes for {len(batch)} jobs")
        except BaseException as exc:  # every waiter of this call gets the failure
            for w in batch:
                if not w.fut.done():
                    w.fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            if not isinstance(exc, Exception):
                raise
            return
        self.calls += 1
        self.jobs += len(batch)
        COALESCED_JOBS.labels(self.name).observe(len(batch))
        for w, out in zip(batch, outcomes, strict=True):
            if w.fut.done():
                continue  # the waiter went away after its job was sent: the others still get theirs
            if isinstance(out, BaseException):
                w.fut.set_exception(out)
            else:
                w.fut.set_result(out)

    async def close(self) -> None:
        """Wait for the calls in flight (their waiters are answered), then refuse what is still queued."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for queue in self._pending.values():
            for w in queue:
                if not w.fut.done():
                    w.fut.set_exception(Unavailable("draining", "this worker is shutting down; retry", code="unavailable"))
        self._pending.clear()
