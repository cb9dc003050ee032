"""Traces: what a consumer records about a message while it works on it (``msg.trace({...})`` in the
official client) and the admin reads (``get_traces_for_message``, ``get_traces_by_name``,
``get_trace_names``). A trace is recorded only for a message of the caller's tenant that exists."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.errors import NotFound
from broker.ids import uuid7
from broker.log import render
from broker.store.queries import Q


@dataclass(frozen=True)
class TraceEvent:
    partition_id: uuid.UUID
    txn: str
    group: str
    event_type: str
    names: list[str]
    data: Any


def _row(r: Any) -> dict[str, Any]:
    return {
        "id": str(r["id"]),
        "partitionId": str(r["partition_id"]),
        "transactionId": r["txn"],
        "consumerGroup": r["consumer_group"],
        "eventType": r["event_type"],
        "traceNames": list(r["trace_names"]),
        "data": r["data"],
        "sub": r["sub"],
        "createdAt": render.ts(r["created_at"]),
    }


async def record(b: Any, tenant: str, sub: str, ev: TraceEvent) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        r = await conn.fetchrow(Q.trace_record, tenant, uuid7(), ev.partition_id, ev.txn, ev.group, ev.event_type,
                                ev.names, ev.data, sub)
    if r is None:
        raise NotFound("message_not_found", "no message with this partition id and transaction id to trace",
                       code="message_not_found",
                       extra={"partitionId": str(ev.partition_id), "transactionId": ev.txn})
    return {"recorded": True, "id": str(r["id"]), "createdAt": render.ts(r["created_at"])}


async def for_message(b: Any, tenant: str, pid: uuid.UUID, txn: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.trace_for_message, tenant, pid, txn)
    return {"partitionId": str(pid), "transactionId": txn, "traces": [_row(r) for r in rows], "count": len(rows)}


async def by_name(b: Any, tenant: str, name: str, since: datetime | None, until: datetime | None,
                  limit: int, offset: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.trace_by_name, tenant, name, since, until, limit, offset)
    return {"traceName": name, "traces": [_row(r) for r in rows], "count": len(rows), "limit": limit, "offset": offset}


async def names(b: Any, tenant: str, search: str | None, limit: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        prefix = None if search is None else search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = await conn.fetch(Q.trace_names, tenant, prefix, limit)
    out = [{"name": r["name"], "traces": r["traces"], "lastSeenAt": render.ts(r["last_seen_at"])} for r in rows]
    return {"names": out, "count": len(out)}
