"""Consumer-group management: what the official client's admin API and ``Queen.delete_consumer_group`` /
``update_consumer_group_timestamp`` call. Reads (list, get, lagging) aggregate one named query
(``groups_stats``); writes (delete, seek, subscription) are one statement each in one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from broker.errors import NotFound
from broker.log import render
from broker.log.catalog import queue_not_found
from broker.store.queries import Q


def _queue_row(r: Any) -> dict[str, Any]:
    return {
        "queue": r["queue"],
        "partitions": r["partitions"],
        "pending": int(r["pending"]),
        "leasedPartitions": r["leased_partitions"],
        "oldestPendingAt": render.ts(r["oldest_pending_at"]),
        "lagSeconds": round(float(r["lag_seconds"]), 3),
        "subscribedAt": render.ts(r["subscribed_at"]),
        "createdAt": render.ts(r["created_at"]),
    }


def _by_group(rows: list[Any]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = groups.setdefault(r["consumer_group"], {"name": r["consumer_group"], "queues": [], "pending": 0,
                                                    "lagSeconds": 0.0})
        q = _queue_row(r)
        g["queues"].append(q)
        g["pending"] += q["pending"]
        g["lagSeconds"] = max(g["lagSeconds"], q["lagSeconds"])
    return list(groups.values())


async def _stats(b: Any, tenant: str, group: str | None, queue: str | None, min_lag: float | None) -> list[Any]:
    async with b.require_pool().acquire() as conn:
        rows: list[Any] = await conn.fetch(Q.groups_stats, tenant, group, queue, min_lag)
    return rows


async def list_groups(b: Any, tenant: str) -> dict[str, Any]:
    groups = _by_group(await _stats(b, tenant, None, None, None))
    return {"consumerGroups": groups, "count": len(groups)}


async def get_group(b: Any, tenant: str, group: str) -> dict[str, Any]:
    groups = _by_group(await _stats(b, tenant, group, None, None))
    if not groups:
        raise NotFound("consumer_group_not_found", f"no consumer group {group!r}", code="consumer_group_not_found",
                       extra={"consumerGroup": group})
    return groups[0]


async def lagging(b: Any, tenant: str, min_lag_s: int) -> dict[str, Any]:
    rows = await _stats(b, tenant, None, None, float(min_lag_s))
    out = [{"consumerGroup": r["consumer_group"], **_queue_row(r)} for r in rows]
    return {"minLagSeconds": min_lag_s, "lagging": out, "count": len(out)}


async def delete(b: Any, tenant: str, group: str, queue: str | None, delete_metadata: bool) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        rows = await conn.fetch(Q.groups_delete, tenant, group, queue, delete_metadata)
    queues = sorted({r["queue"] for r in rows})
    return {"deleted": bool(queues), "consumerGroup": group, "queues": queues, "metadataDeleted": delete_metadata}


async def seek(b: Any, tenant: str, group: str, queue: str, to_end: bool, at: datetime | None) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        if await conn.fetchrow(Q.log_queue_get, tenant, queue) is None:
            raise queue_not_found(queue)
        rows = await conn.fetch(Q.groups_seek, tenant, group, queue, to_end, at)
    return {
        "success": True,
        "consumerGroup": group,
        "queue": queue,
        "toEnd": to_end,
        "timestamp": render.ts(at),
        "partitions": [{"partition": r["name"], "position": r["pos"], "head": r["head"],
                        "pending": max(int(r["head"]) - int(r["pos"]), 0)} for r in rows],
    }


async def set_subscription(b: Any, tenant: str, group: str, at: datetime) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        rows = await conn.fetch(Q.groups_set_subscription, tenant, group, at)
    if not rows:
        raise NotFound("consumer_group_not_found", f"no consumer group {group!r}", code="consumer_group_not_found",
                       extra={"consumerGroup": group})
    return {"success": True, "consumerGroup": group, "subscriptionTimestamp": render.ts(at),
            "queues": sorted(r["queue"] for r in rows)}
