"""Long polls waiting for a queue to get messages.

A waiter registers an ``asyncio.Event`` under (tenant, queue) BEFORE it tries to pop, so a push that
commits between its empty pop and its wait still wakes it. ``queen_push`` (and an ack that frees a
partition with more messages) emits NOTIFY ``queen_push`` with ``tenant\\tqueue`` at commit; the
worker's one LISTEN connection calls ``notify``. ``wake_all`` serves drain and a LISTEN reconnect
(notifications may have been missed meanwhile).

Who a notify wakes: every waiter of the queue by default (the ephemeral queues), or with ``one=True``
(the message log) ONE waiter of each class, the longest parked one whose event is not set yet. A class
is what a pop can take: its consumer group and named partition (a waiter of group g2, or of partition
p2 only, cannot take what a waiter of g1 or p1 takes, so each class gets its own). A burst of
single-message pushes then costs one pop per notify and class instead of one per parked poll. A waiter
set already (woken, or registered and still popping) will pop again after the commit anyway. What one
pop cannot cover is handed on with ``pass_on`` (the baton, within the class): the log's pop calls it
when a waiter a notify reached leaves with an answer that may not have taken everything (messages in
more partitions than it could claim), or leaves without popping after the notify (cancelled, drained,
failed), so no message sits while a poller sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable

from broker.metrics import POP_WAKE

CHANNEL = "queen_push"


class Waiters:
    def __init__(self, *, one: bool = False) -> None:
        self.one = one
        # per key, the waiters in registration order with their class (the oldest is woken first)
        self._by_key: dict[tuple[str, str], dict[asyncio.Event, Hashable]] = {}
        self._woken_at: dict[asyncio.Event, float] = {}

    def register(self, keys: list[tuple[str, str]], cls: Hashable = None) -> asyncio.Event:
        ev = asyncio.Event()
        for k in keys:
            self._by_key.setdefault(k, {})[ev] = cls
        return ev

    def unregister(self, keys: list[tuple[str, str]], ev: asyncio.Event) -> float | None:
        """Forget a waiter; returns when a notify woke it (perf_counter), or None."""
        for k in keys:
            s = self._by_key.get(k)
            if s is not None:
                s.pop(ev, None)
                if not s:
                    del self._by_key[k]
        return self._woken_at.pop(ev, None)

    def notify(self, payload: str) -> None:
        tenant, _, queue = payload.partition("\t")
        self._wake((tenant, queue), one=self.one)

    def pass_on(self, keys: list[tuple[str, str]], cls: Hashable = None) -> None:
        """The baton: wake one more waiter of class ``cls`` of each of these queues (see the module's
        docstring)."""
        for k in keys:
            self._wake(k, one=True, only=(cls,))

    def _wake(self, key: tuple[str, str], *, one: bool, only: tuple[Hashable] | None = None) -> None:
        evs = self._by_key.get(key)
        if not evs:
            return
        now = time.perf_counter()
        woken: set[Hashable] = set()  # the classes that got their one waiter
        for ev, cls in list(evs.items()):
            if ev.is_set() or (one and cls in woken) or (only is not None and cls not in only):
                continue
            self._woken_at[ev] = now
            ev.set()
            woken.add(cls)

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
