"""Monitoring reads for the official client's admin API: overview, namespaces, tasks, partitions, queue
depth, status (per queue), analytics (the meter's periods), system metrics (this worker and the
database) and the message listing. Every read is tenant-scoped and built from partition arithmetic,
never from a count over the message log."""

from __future__ import annotations

import os
import resource
import time
from datetime import datetime
from typing import Any

from broker import metrics
from broker.log import QUEUE_MODE, render
from broker.log.catalog import get_queue, queue_not_found
from broker.payloads import Sealed, open_
from broker.store.queries import Q

STARTED = time.monotonic()
MESSAGE_STATES = frozenset({"pending", "leased", "completed", "deleted"})


async def overview(b: Any, tenant: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        r = await conn.fetchrow(Q.mon_overview, tenant)
    return {
        "tenant": tenant,
        "queues": r["queues"],
        "partitions": r["partitions"],
        "messages": int(r["messages"]),
        "consumerGroups": r["consumer_groups"],
        "namespaces": r["namespaces"],
        "tasks": r["tasks"],
        "deadLetters": r["dead_letters"],
        "timersPending": int(r["timers_pending"]),
        "time": render.ts(r["db_now"]),
    }


async def by_label(b: Any, tenant: str, label: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.mon_by_label, tenant, label)
    key = "namespaces" if label == "namespace" else "tasks"
    items = [{label: r["label"], "queues": r["queues"], "partitions": int(r["partitions"]),
              "messages": int(r["messages"]), "queueNames": list(r["queue_names"])} for r in rows]
    return {key: items, "count": len(items)}


async def partitions(b: Any, tenant: str, queue: str | None, limit: int, offset: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.mon_partitions, tenant, queue, limit, offset)
    parts = [{"id": str(r["id"]), "queue": r["queue"], "name": r["name"], "messages": int(r["messages"]),
              "lastOffset": int(r["last_offset"]), "logStart": int(r["log_start"]),
              "createdAt": render.ts(r["created_at"]), "lastPushAt": render.ts(r["last_push_at"])} for r in rows]
    return {"partitions": parts, "count": len(parts), "limit": limit, "offset": offset}


async def depth(b: Any, tenant: str, queue: str, group: str | None) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        if await conn.fetchrow(Q.log_queue_get, tenant, queue) is None:
            raise queue_not_found(queue)
        rows = await conn.fetch(Q.mon_depth, tenant, queue, group)
        # a per-group policy: false when no group is named (docs/protocol.md §2.4)
        conflating = bool(group and await conn.fetchval(Q.mon_group_conflation, tenant, queue, group))
    pending = sum(int(r["pending"]) for r in rows)
    owing = sum(1 for r in rows if r["pending"] > 0)
    return {
        "queue": queue,
        "group": group,
        "pending": pending,
        "partitionsPending": owing,
        "conflation": conflating,
        # work depth: a conflating group runs its handler once per partition that owes work
        "effectivePending": owing if conflating else pending,
        "partitions": [{"partition": r["name"], "pending": int(r["pending"])} for r in rows],
    }


def _status_row(r: Any) -> dict[str, Any]:
    return {"name": r["name"], "namespace": r["namespace"], "task": r["task"], "partitions": r["partitions"],
            "messages": int(r["messages"]), "pending": int(r["pending"]), "consumerGroups": r["consumer_groups"],
            "deadLetters": r["dead_letters"], "createdAt": render.ts(r["created_at"]),
            "lastPushAt": render.ts(r["last_push_at"])}


async def queue_status(b: Any, tenant: str, limit: int, offset: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.mon_queue_status, tenant, None, limit, offset)
    queues = [_status_row(r) for r in rows]
    return {"queues": queues, "count": len(queues), "limit": limit, "offset": offset}


async def queue_detail(b: Any, tenant: str, queue: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.mon_queue_status, tenant, queue, 1, 0)
    if not rows:
        raise queue_not_found(queue)
    out = _status_row(rows[0])
    detail = await get_queue(b, tenant, queue, 1000)
    out["options"] = detail["options"]
    out["partitionList"] = detail["partitions"]
    out["consumerGroupList"] = detail["consumerGroups"]
    return out


async def status(b: Any, tenant: str) -> dict[str, Any]:
    body = await overview(b, tenant)
    return {"status": "ok", "database": "connected", **body}


async def analytics(b: Any, tenant: str, since: datetime | None, until: datetime | None, period_s: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.mon_usage_history, tenant, since, until)
    return {
        "tenant": tenant,
        "source": "meter",
        "periodSeconds": period_s,
        "periods": [{"periodStart": render.ts(r["period_start"]), "messages": int(r["messages"]),
                     "kvOps": int(r["kv_ops"])} for r in rows],
        "current": await overview(b, tenant),
    }


LIVE_QUEUES = 8  # the queues with the largest backlog that a live sample names (the rest are summed)


async def live(b: Any, tenant: str) -> dict[str, Any]:
    """One sample for the console's live charts: the broker-wide counters (``metrics.live_snapshot``),
    and this tenant's backlog (pending behind the slowest consumer group) of its largest queues and its
    dead letters, from the same partition arithmetic as the status reads (first 1,000 queues by name)."""
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.mon_queue_status, tenant, None, 1000, 0)
    ranked = sorted(rows, key=lambda r: (-int(r["pending"]), r["name"]))
    top = ranked[:LIVE_QUEUES]
    return {
        "metrics": metrics.live_snapshot(),
        "queues": [{"name": r["name"], "pending": int(r["pending"]), "deadLetters": int(r["dead_letters"])} for r in top],
        "otherQueues": {"count": len(ranked) - len(top), "pending": sum(int(r["pending"]) for r in ranked[len(top):])},
        "deadLetters": sum(int(r["dead_letters"]) for r in rows),
        "pending": sum(int(r["pending"]) for r in rows),
        "queueCount": len(rows),
    }


def _worker(b: Any) -> dict[str, Any]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    pool = b.pool
    return {
        "workerId": b.worker_index,
        "pid": os.getpid(),
        "uptimeSeconds": round(time.monotonic() - STARTED, 3),
        "cpu": {"userSeconds": ru.ru_utime, "systemSeconds": ru.ru_stime},
        "memory": {"maxRssBytes": ru.ru_maxrss * 1024},
        "pool": {"size": pool.get_size() if pool else 0, "idle": pool.get_idle_size() if pool else 0,
                 "max": pool.get_max_size() if pool else 0},
    }


async def system_metrics(b: Any) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        r = await conn.fetchrow(Q.mon_db_stats)
    return {"time": render.ts(r["db_now"]), "worker": _worker(b),
            "database": {"connections": r["connections"], "sizeBytes": int(r["size_bytes"])}}


def worker_metrics(b: Any) -> dict[str, Any]:
    # Workers share nothing but the database: the worker that answers reports itself.
    return {"scope": "the worker that served this request", "workers": [_worker(b)]}


async def list_messages(
    b: Any, tenant: str, queue: str, partition: str | None, group: str | None, state: str | None, limit: int, offset: int,
) -> dict[str, Any]:
    grp = group or QUEUE_MODE
    async with b.require_pool().acquire() as conn:
        if await conn.fetchrow(Q.log_queue_get, tenant, queue) is None:
            raise queue_not_found(queue)
        rows = await conn.fetch(Q.mon_messages, tenant, queue, partition, limit, grp, offset, state)
    msgs = []
    for r in rows:
        if r["deleted_at"] is not None:  # a tombstone (docs/decisions.md §9): no payload to open
            data: dict[str, Any] = {"data": None}
        else:
            data = render.checked_data_fields(
                open_(b.codec, b.keyring, tenant, queue, Sealed(r["payload"], r["codec"], r["key_id"])))
        msgs.append({
            "id": str(r["id"]), "transactionId": r["txn"], "partition": r["partition"],
            "partitionId": str(r["partition_id"]), "offset": r["seq"],
            "traceId": str(r["trace_id"]) if r["trace_id"] else None, "producerSub": r["producer_sub"],
            "createdAt": render.ts(r["created_at"]), "deadlineAt": render.ts(r["deadline_at"]),
            "status": r["status"], "failures": r["failures"], "deletedAt": render.ts(r["deleted_at"]), **data,
        })
    return {"messages": msgs, "queue": queue, "consumerGroup": grp, "limit": limit, "offset": offset, "count": len(msgs)}
