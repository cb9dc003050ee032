"""Supervised background loops.

``Loops.start(name, factory)`` runs ``await factory()`` in a task. If it raises, the crash is logged
with its traceback, counted in ``queen_loop_restarts_total{loop=name}`` and the loop is started again
after a backoff (doubling up to 5 s, reset after a minute of healthy running). ``stop()`` cancels
every loop and waits for them. Every coroutine that runs for a worker's life runs under this. A short
task (a coalesced call, a NOTIFY to the other sweepers, a LISTEN of a new channel) is owned by the object
that creates it, which keeps a reference until it ends: the event loop holds only a weak one, so an
unreferenced task can be garbage-collected mid-flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from broker.metrics import LOOP_RESTARTS

log = logging.getLogger("queen.loops")


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

    def start(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        if name in self._tasks and not self._tasks[name].done():
            raise RuntimeError(f"loop {name!r} is already running")
        self.restarts.setdefault(name, 0)
        self._tasks[name] = asyncio.get_running_loop().create_task(self._run(name, factory), name=f"loop:{name}")

    async def _run(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        backoff = self._min
        while True:
            started = time.monotonic()
            try:
                await factory()
                log.warning("loop %s returned; starting it again", name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("loop %s crashed; restarting in %.1fs", name, backoff)
            self.restarts[name] += 1
            LOOP_RESTARTS.labels(name).inc()
            if time.monotonic() - started > 60:
                backoff = self._min
            await asyncio.sleep(backoff)
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
