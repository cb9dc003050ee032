"""The streams domain over the named queries: one statement per route (``broker/sql/queries/streams.sql``).

Answers (docs/protocol.md §11, read from the official client's streams runtime):
  - register: ``{"success": true, "query_id", "name", "config_hash", "fresh", "reset"}``; a different
    operator chain under a registered name without ``reset`` is 409 ``config_hash_mismatch`` (the client
    turns a 409 into its "pass reset=True" hint).
  - cycle: ``{"success": true, "query_id", "partition_id", "duplicate", "state_ops_applied",
    "push_results", "ack_result"}`` once committed; an ack the log refuses (lease not held, unknown
    message, count beyond the lease) is 200 ``{"success": false, "error": <prose>, "reason":
    "lease_invalid" | "ack_refused", ...}`` with nothing applied (the client raises on
    ``success: false``); so is a sink push that would pass its queue's ``maxSize`` (reason
    ``queue_full``, as the transaction route answers it). A replay of a committed cycle (its ack's message is already done) applies
    nothing again and answers ``success: true, duplicate: true``.
  - state get: ``{"success": true, "rows": [{"key", "value", "updated_at"}]}``.
An unknown ``query_id`` (or another tenant's) is 404 ``stream_query_not_found``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from broker import limits, metering
from broker.auth import Principal
from broker.errors import Conflict, NotFound, Unavailable
from broker.ids import uuid7
from broker.log import render
from broker.log.calls import Push
from broker.log.service import ENCRYPTION_RACE, QUEUE_FULL, LogService, queue_full_error, queues_full
from broker.metrics import MESSAGES_ACKED, MESSAGES_PUSHED
from broker.store.queries import Q
from broker.streams.calls import StreamsCycle, StreamsRegister, StreamsStateGet
from broker.streams.parse import Cycle, Registration, StateQuery

if TYPE_CHECKING:
    from broker.context import Broker

QUERY_NOT_FOUND = "QS404"
ACK_DISAGREED = "QS409"
PUSH_ATTEMPTS = 3


def _not_found(query_id: object) -> NotFound:
    return NotFound("stream_query_not_found", f"no stream query {query_id} for this tenant",
                    code="stream_query_not_found")


async def register(b: Broker, principal: Principal, reg: Registration) -> dict[str, Any]:
    principal.require("consume")
    if reg.sink_queue is not None:
        principal.require("produce")
    call = StreamsRegister(tenant=principal.tenant, name=reg.name, source=reg.source_queue, sink=reg.sink_queue,
                           config_hash=reg.config_hash, reset=reg.reset)
    row = await b.require_pool().fetchrow(Q.streams_register, *call.args())
    assert row is not None
    if row["outcome"] == "mismatch":
        raise Conflict(
            "config_hash_mismatch",
            f"stream query {reg.name!r} is registered with another operator chain (config_hash differs); "
            "register with reset=true to drop its state, or use another name",
            code="config_hash_mismatch", extra={"query_id": str(row["query_id"]), "name": reg.name},
        )
    return {"success": True, "query_id": str(row["query_id"]), "name": reg.name, "config_hash": reg.config_hash,
            "fresh": row["fresh"], "reset": row["did_reset"]}


async def state_get(b: Broker, principal: Principal, sq: StateQuery) -> dict[str, Any]:
    principal.require("consume")
    try:
        call = StreamsStateGet(tenant=principal.tenant, query_id=sq.query_id, partition_id=sq.partition_id,
                               keys=sq.keys, prefix=sq.prefix, ripe_ms=sq.ripe_at_or_before)
        rows = await b.require_pool().fetch(Q.streams_state_get, *call.args())
    except asyncpg.PostgresError as exc:
        if getattr(exc, "sqlstate", None) == QUERY_NOT_FOUND:
            raise _not_found(sq.query_id) from None
        raise
    return {"success": True, "rows": [{"key": r["key"], "value": r["value"], "updated_at": render.ts(r["updated_at"])}
                                      for r in rows]}


def _refusal(c: Cycle, reason: str, error: str) -> dict[str, Any]:
    return {"success": False, "error": error, "reason": reason, "query_id": str(c.query_id),
            "partition_id": str(c.partition_id), "state_ops_applied": 0, "push_results": [], "ack_result": None}


async def cycle(b: Broker, svc: LogService, principal: Principal, c: Cycle) -> dict[str, Any]:
    principal.require("consume")
    if c.pushes:
        principal.require("produce")
    if c.ack is not None and c.ack.lease is None:  # absent or not a UUID: what the log's ack answers
        return _refusal(c, "lease_invalid", "Invalid or expired lease")
    if c.pushes:
        await limits.admit(b, principal, "push", len(c.pushes))
    if c.op_keys:
        await limits.admit(b, principal, "kv_write", len(c.op_keys))
    tenant = principal.tenant
    queues = {it.queue for it in c.pushes}
    ids = [uuid7() for _ in c.pushes]
    txns = [it.txn or str(mid) for it, mid in zip(c.pushes, ids, strict=True)]
    ack = c.ack
    for attempt in range(PUSH_ATTEMPTS):
        async with b.require_pool().acquire() as conn:
            encrypting = await svc._encrypting(conn, tenant, queues, fresh=attempt > 0) if queues else set()
            sealed = svc._seal(tenant, c.pushes, encrypting)
            try:
                push = Push(
                    tenant=tenant, plain=sorted(queues - encrypting), queues=[it.queue for it in c.pushes],
                    partitions=[it.partition for it in c.pushes], ids=ids, txns=txns,
                    traces=[it.trace for it in c.pushes], payloads=[s.payload for s in sealed],
                    codecs=[s.codec for s in sealed], key_ids=[s.key_id for s in sealed],
                    subs=[principal.sub] * len(c.pushes), deadline_ms=[it.deadline_ms for it in c.pushes],
                    meter_period_s=metering.period_seconds(),
                )
                call = StreamsCycle(
                    query_id=c.query_id, partition_id=c.partition_id, group=c.group, op_keys=c.op_keys,
                    op_values=c.op_values, ack_txn=ack.txn if ack else None, ack_lease=ack.lease if ack else None,
                    ack_count=ack.count if ack else None, release=c.release_lease, push=push,
                )
                rows = await conn.fetch(Q.streams_cycle, *call.args())
            except asyncpg.PostgresError as exc:
                state = getattr(exc, "sqlstate", None)
                if state == QUERY_NOT_FOUND:
                    raise _not_found(c.query_id) from None
                if state == ACK_DISAGREED:
                    return _refusal(c, "ack_refused", str(exc))
                if state == QUEUE_FULL:  # a sink's maxSize: nothing of the cycle was applied
                    return _refusal(c, "queue_full", queue_full_error(next(iter(queues_full(exc).values()))))
                if state == ENCRYPTION_RACE:
                    for q in queues:
                        svc.forget(tenant, q)
                    continue
                raise
        return _answer(c, rows, txns)
    raise Unavailable("queue_reconfigured", "a sink queue's encryption setting kept changing during the cycle; retry")


def _answer(c: Cycle, rows: list[asyncpg.Record], txns: list[str]) -> dict[str, Any]:
    by_kind: dict[str, list[asyncpg.Record]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r)
    if "refused" in by_kind:
        r = by_kind["refused"][0]
        return _refusal(c, r["status"], r["detail"])
    head = {"success": True, "query_id": str(c.query_id), "partition_id": str(c.partition_id)}
    if "duplicate" in by_kind:
        return {**head, "duplicate": True, "state_ops_applied": 0, "push_results": [],
                "ack_result": {"success": True, "duplicate": True, "acked": 0}}
    pushed = sorted(by_kind.get("push", []), key=lambda r: r["idx"])
    queued = sum(1 for r in pushed if r["status"] == "queued")
    if queued:
        MESSAGES_PUSHED.labels("stream").inc(queued)
    ack_rows = by_kind.get("ack", [])
    if ack_rows:
        MESSAGES_ACKED.labels("completed").inc(ack_rows[0]["idx"])
    state = by_kind.get("state", [])
    return {
        **head,
        "duplicate": False,
        "state_ops_applied": state[0]["idx"] if state else 0,
        "push_results": [render.push_result(i, it.queue, t, r)
                         for i, (it, t, r) in enumerate(zip(c.pushes, txns, pushed, strict=True))],
        "ack_result": ({"success": True, "duplicate": False, "acked": ack_rows[0]["idx"],
                        "transactionId": c.ack.txn if c.ack else None} if ack_rows else None),
    }
