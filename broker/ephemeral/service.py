"""The ephemeral queues' domain operations: each call is one named query (one function call, one round
trip); a waiting pop repeats its query when a NOTIFY ``queen_ephemeral`` for its queue arrives (from a
push or a nack on any worker of any broker), until it has messages, its timeout passes or the worker
drains. A queue's ``windowBuffer`` lets a waiting pop that has some messages wait up to ``ms`` more
for ``count`` (or ``batch``) of them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from broker import limits, metering
from broker.auth import Principal
from broker.ephemeral import parse
from broker.ephemeral.calls import EphAck, EphConfigure, EphPop
from broker.errors import BadRequest, TooManyRequests
from broker.log.waiters import Waiters
from broker.metrics import EPHEMERAL_MESSAGES
from broker.store.queries import Q

if TYPE_CHECKING:
    from broker.context import Broker


QUEUE_FULL = "QE001"  # raised by queen_eph_push: bounds reached, policy reject
EXCEEDS_BOUNDS = "QE002"  # raised by queen_eph_push: the batch alone is larger than the bounds


@dataclass(frozen=True)
class EphemeralPop:
    """One pop as the route parsed it (``group`` already defaulted to the queue mode)."""

    queue: str
    partition: str | None
    group: str
    batch: int
    wait: bool
    timeout_ms: int
    auto_ack: bool  # commit at delivery: no lease


class EphemeralService:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.waiters = Waiters()

    async def configure(self, principal: Principal, queue: str, opts: parse.Options) -> dict[str, Any]:
        call = EphConfigure(tenant=principal.tenant, queue=queue, options=opts)
        out: dict[str, Any] = await self.b.require_pool().fetchval(Q.eph_configure, *call.args())
        return out

    async def push(self, principal: Principal, queue: str, partition: str, payloads: list[str]) -> dict[str, Any]:
        """All or nothing: every message is in the ring, or none (a refusal raises)."""
        if not payloads:
            return {"pushed": 0}
        pool = self.b.require_pool()
        await limits.admit(self.b, principal, "push", len(payloads))
        try:
            row = await pool.fetchrow(Q.eph_push, principal.tenant, queue, partition, payloads,
                                      metering.period_seconds())
        except asyncpg.PostgresError as exc:
            state = getattr(exc, "sqlstate", None)
            if state == QUEUE_FULL:
                raise TooManyRequests(
                    "queue_full", f"ephemeral queue {queue!r} is at its maxLength/maxBytes and its policy is "
                    "reject; nothing was pushed", code="queue_full", retry_after_s=1) from None
            if state == EXCEEDS_BOUNDS:
                raise BadRequest(
                    "exceeds_bounds", f"this push alone is larger than ephemeral queue {queue!r}'s "
                    "maxLength/maxBytes; nothing was pushed") from None
            raise
        assert row is not None
        EPHEMERAL_MESSAGES.labels("pushed").inc(row["pushed"])
        if row["dropped"]:
            EPHEMERAL_MESSAGES.labels("dropped").inc(row["dropped"])
        return {"pushed": row["pushed"], "dropped": row["dropped"]}

    async def pop(self, principal: Principal, req: EphemeralPop) -> dict[str, Any]:
        pool = self.b.require_pool()
        key = [(principal.tenant, req.queue)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout_ms / 1000
        held: list[dict[str, Any]] = []
        window_until = deadline  # set by the first messages: their queue's windowBuffer
        want = req.batch
        while True:
            ev = self.waiters.register(key) if req.wait else None
            try:
                call = EphPop(tenant=principal.tenant, queue=req.queue, partition=req.partition, group=req.group,
                              batch=req.batch - len(held), auto_ack=req.auto_ack)
                got = await pool.fetch(Q.eph_pop, *call.args())
                rows = [r for r in got if r["seq"] is not None]
                due = [r["due_ms"] for r in got if r["seq"] is None and r["due_ms"] is not None]
                if rows and not held:
                    window_until = loop.time() + rows[0]["window_ms"] / 1000
                    want = min(req.batch, rows[0]["window_count"] or req.batch)
                held.extend(_message(r) for r in rows)
                if ev is None or self.b.draining or len(held) >= want:
                    break
                until = min(deadline, window_until) if held else deadline
                if due:  # a lease runs out then: its redelivery sends no NOTIFY, look again at that moment
                    until = min(until, loop.time() + max(due[0], 5) / 1000)
                remaining = until - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(ev.wait(), remaining)
                except TimeoutError:
                    pass
            finally:
                if ev is not None:
                    self.waiters.unregister(key, ev)
        if held:
            EPHEMERAL_MESSAGES.labels("popped").inc(len(held))
        return {"queue": req.queue, "messages": held}

    async def ack(self, principal: Principal, queue: str, group: str, acks: list[parse.Ack]) -> dict[str, Any]:
        outcomes = ["unknown"] * len(acks)
        mine = [(i, a) for i, a in enumerate(acks) if a.seq is not None]
        if mine:
            call = EphAck(tenant=principal.tenant, queue=queue, group=group, tags=[a.tag for _, a in mine],
                          seqs=[a.seq for _, a in mine], attempts=[a.attempt for _, a in mine],
                          statuses=[a.status for _, a in mine], errors=[a.error for _, a in mine])
            rows = await self.b.require_pool().fetch(Q.eph_ack, *call.args())
            for r in rows:
                outcomes[mine[r["idx"]][0]] = r["outcome"]
        for o in set(outcomes):
            EPHEMERAL_MESSAGES.labels(o).inc(outcomes.count(o))
        return {"results": [{"id": a.id, "outcome": o} for a, o in zip(acks, outcomes, strict=True)]}

    async def reset(self, principal: Principal, queue: str) -> dict[str, Any]:
        dropped = await self.b.require_pool().fetchval(Q.eph_reset, principal.tenant, queue)
        return {"queue": queue, "dropped": dropped}

    async def delete(self, principal: Principal, queue: str) -> dict[str, Any]:
        deleted = await self.b.require_pool().fetchval(Q.eph_delete, principal.tenant, queue)
        return {"queue": queue, "deleted": bool(deleted)}

    async def queues(self, principal: Principal) -> dict[str, Any]:
        out: dict[str, Any] = await self.b.require_pool().fetchval(Q.eph_list, principal.tenant)
        return out

    async def depth(self, principal: Principal, queue: str) -> dict[str, Any] | None:
        out: dict[str, Any] | None = await self.b.require_pool().fetchval(Q.eph_depth, principal.tenant, queue)
        return out


def _message(r: Any) -> dict[str, Any]:
    msg = {"id": parse.message_id(r["tag"], r["seq"], r["attempts"]), "partition": r["partition"],
           "payload": r["payload"], "attempts": r["attempts"]}
    if r["last_error"] is not None:
        msg["lastError"] = r["last_error"]
    return msg
