"""Supervised background loops.

``Loops.start(name, factory)`` runs ``await factory()`` in a task. If it raises, the crash is counted
in ``queen_loop_restarts_total{loop=name}`` and the loop is started again after a backoff (doubling up
to 5 s, at most ``DB_MAX_BACKOFF_S`` while the database is away, reset after a minute of healthy
running). A crash of the code is logged with its traceback each time. A crash because the database is
unavailable (``failures.DB_FAILURE``: down, failing over, a standby answering) is an outage of the
worker's database, not a bug: one WARNING line when the first loop meets it, nothing while the loops keep
retrying, and one INFO line when every loop that met it has run again for ``RECOVERED_AFTER_S`` without a
failure (with how long the outage lasted and how many restarts it took). ``stop()`` cancels every loop
and waits for them. Every coroutine that runs for a worker's life runs under this. A short task (a
coalesced call, a NOTIFY to the other sweepers, a LISTEN of a new channel) is owned by the object that
creates it, which keeps a reference until it ends: the event loop holds only a weak one, so an
unreferenced task can be garbage-collected mid-flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from broker.metrics import LOOP_RESTARTS
from broker.store.failures import DB_FAILURE, describe

log = logging.getLogger("queen.loops")

DB_MAX_BACKOFF_S = 1.0  # the longest wait between two restarts while the database is away
RECOVERED_AFTER_S = 2.0  # a loop restarted after an outage that runs this long without failing is back


async def in_batches(step: Callable[[], Awaitable[int]], batch: int, interval_s: float) -> None:
    """The body of a housekeeping loop: run ``step`` (which handles at most ``batch`` items and returns
    how many it handled) again at once while it comes back full, otherwise after ``interval_s``."""
    while True:
        if await step() < batch:
            await asyncio.sleep(interval_s)


class Loops:
    def __init__(self, *, min_backoff_s: float = 0.1, max_backoff_s: float = 5.0) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.restarts: dict[str, int] = {}
        self._min = min_backoff_s
        self._max = max_backoff_s
        self.outage_since: float | None = None  # monotonic instant the current database outage began
        self._last_db_failure = 0.0
        self._outage_restarts = 0
        self._failed_in_outage: set[str] = set()  # loops that met the outage and have not run since

    def start(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        if name in self._tasks and not self._tasks[name].done():
            raise RuntimeError(f"loop {name!r} is already running")
        self.restarts.setdefault(name, 0)
        LOOP_RESTARTS.labels(name)  # the series exists at 0 from the loop's start
        self._tasks[name] = asyncio.get_running_loop().create_task(self._run(name, factory), name=f"loop:{name}")

    def _db_failed(self, name: str, exc: BaseException) -> None:
        now = time.monotonic()
        self._last_db_failure = now
        self._outage_restarts += 1
        self._failed_in_outage.add(name)
        if self.outage_since is None:
            self.outage_since = now
            log.warning("database unavailable (loop %s: %s); the loops retry quietly until it answers", name, describe(exc))

    def _ran(self, name: str) -> None:
        """Loop ``name`` has run RECOVERED_AFTER_S without failing: the outage is over once every loop
        that met it has, and no loop failed meanwhile."""
        self._failed_in_outage.discard(name)
        now = time.monotonic()
        if self.outage_since is not None and not self._failed_in_outage and now - self._last_db_failure >= RECOVERED_AFTER_S:
            log.info("database back: the loops run again, %.1f s after the outage began (%d restarts)",
                     max(0.0, now - self.outage_since - RECOVERED_AFTER_S), self._outage_restarts)
            self.outage_since = None
            self._outage_restarts = 0

    async def _run(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        backoff = self._min
        while True:
            started = time.monotonic()
            task = asyncio.ensure_future(factory())
            try:
                # While an outage is open, this loop (running again) watches for its end.
                while self.outage_since is not None and not task.done():
                    await asyncio.wait({task}, timeout=RECOVERED_AFTER_S)
                    if not task.done():
                        self._ran(name)
                await task
                log.warning("loop %s returned; starting it again", name)
            except asyncio.CancelledError:
                task.cancel()
                raise
            except DB_FAILURE as exc:
                self._db_failed(name, exc)
            except Exception:
                log.exception("loop %s crashed; restarting in %.1fs", name, backoff)
            self.restarts[name] += 1
            LOOP_RESTARTS.labels(name).inc()
            if time.monotonic() - started > 60:
                backoff = self._min
            # Through an outage a loop retries at least every DB_MAX_BACKOFF_S: the sweeper then fires
            # the timers that fell due during a failover within about a second of the new primary.
            await asyncio.sleep(min(backoff, DB_MAX_BACKOFF_S) if self.outage_since is not None else backoff)
            backoff = min(self._max, backoff * 2)

    def running(self) -> dict[str, bool]:
        return {name: not t.done() for name, t in self._tasks.items()}

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
