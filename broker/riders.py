"""Transaction riders: the ``kv`` and ``timers`` arrays of ``POST /api/v1/transaction``.

The transaction route (message log) owns the bundle: it parses the body, opens ONE database
transaction, applies pushes and acks, then hands each rider its ops on the same connection. The riders
are registered explicitly by ``broker.services.build`` (``registry``) into ``Broker.services.riders``;
the transaction code never imports kv or timers.

Flow for a rider named N whose array is present in the body:
  1. ``parsed = rider.parse(ops, principal, broker)``   before any SQL; raises ``ApiError`` (400...)
  2. ``await rider.admit(parsed, principal, broker)``   limits/kill switches; raises ``ApiError``
  3. ``results = await rider.apply(conn, parsed, principal, broker, base_index)`` inside the
     transaction; returns one result dict per op (each carries ``"type"``: ``"kv"`` or ``"timer"``,
     and ``"index"`` = ``base_index + i`` in the flat result space). To roll the whole bundle back
     with a 200 answer (a lost ``required`` KV precondition) raise ``RiderAbort(body)``; the
     transaction route rolls back and answers ``body`` with HTTP 200.
Order of riders in results: kv first, then timers (docs/protocol.md §2.6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from broker.auth import Principal
from broker.store.pool import Conn

if TYPE_CHECKING:
    from broker.context import Broker


class RiderAbort(Exception):
    """Roll the bundle back and answer ``body`` with HTTP 200 (e.g. a lost required KV precondition)."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("reason", "rider_abort"))
        self.body = body


class Rider(Protocol):
    name: str

    def parse(self, ops: Any, principal: Principal, broker: Broker) -> Any: ...

    async def admit(self, parsed: Any, principal: Principal, broker: Broker) -> None: ...

    async def apply(
        self, conn: Conn, parsed: Any, principal: Principal, broker: Broker, base_index: int
    ) -> list[dict[str, Any]]: ...


ORDER = ("kv", "timers")


def registry(*riders: Rider) -> dict[str, Rider]:
    """The riders this broker serves, by name (each name must be one of ``ORDER``)."""
    out: dict[str, Rider] = {}
    for rider in riders:
        if rider.name not in ORDER:
            raise ValueError(f"unknown rider {rider.name!r}; known: {ORDER}")
        out[rider.name] = rider
    return out
