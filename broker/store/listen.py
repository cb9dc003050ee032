"""One LISTEN connection per worker, shared by every subscriber.

``Notifier.subscribe(channel, callback)`` registers a plain (non-async) callback called with the
notification payload. The connection is held by a supervised loop: when it drops, the loop notices
(the connection's termination listener), reconnects, re-LISTENs every channel and calls the
``on_reconnect`` callbacks, so subscribers can re-check state they might have missed meanwhile. Like
every broker connection it asks for a writable server (``pool.session_attrs``): NOTIFY is sent on the
primary, and a standby refuses LISTEN.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable

import asyncpg

from broker.store.pool import session_attrs

log = logging.getLogger("queen.listen")

Callback = Callable[[str], None]


class Notifier:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._subs: dict[str, list[Callback]] = defaultdict(list)
        self._reconnect_cbs: list[Callable[[], None]] = []
        self._conn: asyncpg.Connection | None = None
        self._listening: set[asyncio.Task[None]] = set()  # LISTENs of new channels in flight (kept referenced)
        self.connected = asyncio.Event()

    def subscribe(self, channel: str, callback: Callback) -> None:
        first = channel not in self._subs
        self._subs[channel].append(callback)
        if first and self._conn is not None and not self._conn.is_closed():
            task = asyncio.get_running_loop().create_task(self._conn.add_listener(channel, self._dispatch))
            self._listening.add(task)
            task.add_done_callback(self._listening.discard)

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        self._reconnect_cbs.append(callback)

    def _dispatch(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        for cb in list(self._subs.get(channel, ())):
            try:
                cb(str(payload))
            except Exception:
                log.exception("notify callback for %s failed", channel)

    async def run(self) -> None:
        """The supervised loop body: connect, listen, wait until the connection dies, raise."""
        lost = asyncio.Event()
        conn = await asyncpg.connect(self._dsn, server_settings={"application_name": "queen-listen"}, **session_attrs(self._dsn))
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            for channel in list(self._subs):
                await conn.add_listener(channel, self._dispatch)
            self._conn = conn
            self.connected.set()
            for cb in self._reconnect_cbs:
                cb()
            while not lost.is_set():
                try:
                    await asyncio.wait_for(lost.wait(), timeout=5)
                except TimeoutError:
                    # A half-open TCP connection never fires the termination listener; probe it.
                    await asyncio.wait_for(conn.fetchval("SELECT 1"), timeout=5)
            raise ConnectionError("LISTEN connection lost")
        finally:
            self.connected.clear()
            self._conn = None
            if not conn.is_closed():
                conn.terminate()
