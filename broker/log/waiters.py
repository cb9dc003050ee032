"""Long polls waiting for a queue to get messages.

A waiter registers an ``asyncio.Event`` under (tenant, queue) BEFORE it tries to pop, so a push that
commits between its empty pop and its wait still wakes it. ``queen_push`` (and an ack that frees a
partition with more messages) emits NOTIFY ``queen_push`` with ``tenant\\tqueue`` at commit; the
worker's one LISTEN connection calls ``notify`` and every waiter of that queue re-tries. ``wake_all``
serves drain and a LISTEN reconnect (notifications may have been missed meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from broker.metrics import POP_WAKE

CHANNEL = "queen_push"


class Waiters:
    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], set[asyncio.Event]] = defaultdict(set)
        self._woken_at: dict[asyncio.Event, float] = {}

    def register(self, keys: list[tuple[str, str]]) -> asyncio.Event:
        ev = asyncio.Event()
        for k in keys:
            self._by_key[k].add(ev)
        return ev

    def unregister(self, keys: list[tuple[str, str]], ev: asyncio.Event) -> float | None:
        """Forget a waiter; returns when a notify woke it (perf_counter), or None."""
        for k in keys:
            s = self._by_key.get(k)
            if s is not None:
                s.discard(ev)
                if not s:
                    del self._by_key[k]
        return self._woken_at.pop(ev, None)

    def notify(self, payload: str) -> None:
        tenant, _, queue = payload.partition("\t")
        now = time.perf_counter()
        for ev in list(self._by_key.get((tenant, queue), ())):
            if not ev.is_set():
                self._woken_at[ev] = now
                ev.set()

    @staticmethod
    def observe_wake(woken_at: float | None) -> None:
        """Record notify-to-answer latency for a long poll that a notify woke and that found messages
        (``woken_at`` as returned by ``unregister`` of the event that was set)."""
        if woken_at is not None:
            POP_WAKE.observe(time.perf_counter() - woken_at)

    def wake_all(self) -> None:
        for evs in list(self._by_key.values()):
            for ev in list(evs):
                ev.set()

    def __len__(self) -> int:
        return len({ev for evs in self._by_key.values() for ev in evs})
