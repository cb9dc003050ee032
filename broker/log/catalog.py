"""Queues, the DLQ and lookups: the log's less hot operations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from broker.auth import Principal
from broker.errors import Conflict, NotFound
from broker.ids import uuid7
from broker.log import render
from broker.log.calls import Push
from broker.log.parse import QueueOptions
from broker.log.service import QUEUE_FULL, queue_full_error, queues_full
from broker.metrics import MESSAGES_DELETED, MESSAGES_PUSHED
from broker.payloads import Sealed, open_
from broker.store.queries import Q

if TYPE_CHECKING:
    from broker.context import Broker


def queue_not_found(queue: str) -> NotFound:
    return NotFound("queue_not_found", f"queue {queue!r} does not exist", code="queue_not_found", extra={"queue": queue})


async def configure(b: Broker, tenant: str, queue: str, namespace: str | None, task: str | None, opts: QueueOptions) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        await conn.execute(Q.log_configure, tenant)
        r = await conn.fetchrow(
            Q.log_configure_queue, tenant, queue, namespace, task, opts.lease_time_s, opts.retry_limit,
            opts.dlq_enabled, opts.encryption_enabled, opts.extra,
        )
    body = render.queue_row(r)
    return {"configured": True, "queue": queue, "namespace": namespace, "task": task, "options": body["options"]}


async def list_queues(b: Broker, tenant: str, namespace: str | None, task: str | None, limit: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.log_queue_list, tenant, namespace, task, limit)
    queues = []
    for r in rows:
        q = render.queue_row(r)
        q["partitions"] = r["partitions"]
        q["messages"] = r["messages"]
        queues.append(q)
    return {"queues": queues, "count": len(queues)}


async def get_queue(b: Broker, tenant: str, queue: str, partition_limit: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        r = await conn.fetchrow(Q.log_queue_get, tenant, queue)
        if r is None:
            raise queue_not_found(queue)
        parts = await conn.fetch(Q.log_queue_partitions, tenant, queue, partition_limit)
        groups = await conn.fetch(Q.log_queue_groups, tenant, queue)
    body = render.queue_row(r)
    body["partitions"] = [
        {"id": str(p["id"]), "name": p["name"], "messages": p["messages"], "createdAt": render.ts(p["created_at"]),
         "lastPushAt": render.ts(p["last_push_at"])}
        for p in parts
    ]
    body["consumerGroups"] = [
        {"name": g["consumer_group"], "pending": int(g["pending"]), "leasedPartitions": g["leased_partitions"],
         "oldestUnackedAt": render.ts(g["oldest_unacked_at"])}
        for g in groups
    ]
    return body


async def delete_queue(b: Broker, tenant: str, queue: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        gone = await conn.fetchval(Q.log_queue_delete, tenant, queue)
    # A queue that does not exist answers 200 deleted:false, as the official client expects: clean-up
    # code that deletes unconditionally must not raise (docs/decisions.md §7).
    return {"deleted": gone is not None, "queue": queue}


def _dlq_row(b: Broker, tenant: str, r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(r["id"]),
        "messageId": str(r["message_id"]),
        "queueName": r["queue"],
        "partitionId": str(r["partition_id"]) if r["partition_id"] else None,
        "partitionName": r["partition"],
        "transactionId": r["txn"],
        "traceId": str(r["trace_id"]) if r["trace_id"] else None,
        "consumerGroup": r["consumer_group"],
        "synthetic": r["synthetic"],
        "errorMessage": r["error"],
        "retryCount": r["retry_count"],
        "producerSub": r["producer_sub"],
        "originalCreatedAt": render.ts(r["original_created_at"]),
        "messageCreatedAt": render.ts(r["original_created_at"]),
        "movedToDlqAt": render.ts(r["created_at"]),
    }
    if r["payload"] is None:
        out["data"] = None
    else:
        opened = open_(b.codec, b.keyring, tenant, r["queue"], Sealed(r["payload"], r["codec"], r["key_id"]))
        out.update(render.checked_data_fields(opened))
    return out


async def dlq_list(
    b: Broker, tenant: str, queue: str | None, group: str | None, partition: str | None,
    since: datetime | None, until: datetime | None, limit: int, offset: int,
) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.log_dlq_list, tenant, queue, group, partition, since, until, limit, offset)
        total = rows[0]["total"] if rows else await conn.fetchval(Q.log_dlq_count, tenant, queue, group, partition, since, until)
    return {"messages": [_dlq_row(b, tenant, r) for r in rows], "total": total, "limit": limit, "offset": offset}


def replay_txn(txn: str, dlq_id: uuid.UUID) -> str:
    """The replayed message's transaction id: the original is still in the log (consumed messages are
    kept), so reusing it would dedupe the replay away. Derived from the DLQ row, so replaying the same
    row twice can never make two messages."""
    return f"{txn}:replay:{dlq_id}"


async def dlq_replay(b: Broker, principal: Principal, dlq_id: uuid.UUID) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn, conn.transaction():
        r = await conn.fetchrow(Q.log_dlq_take, principal.tenant, dlq_id)
        if r is None:
            raise NotFound("dlq_not_found", f"no dead letter {dlq_id}", code="dlq_not_found")
        return await _replay(conn, principal, r)


async def dlq_retry_message(b: Any, principal: Any, pid: uuid.UUID, txn: str) -> dict[str, Any]:
    """The official client's ``admin.retry_message``: replay the dead letter of the message at
    (partition id, transaction id). When several consumer groups dead-lettered the same message the
    address is ambiguous (each replay would be a new message): refused with the rows' ids, to be
    replayed one by one with ``POST /api/v1/dlq/{id}/replay``."""
    async with b.require_pool().acquire() as conn, conn.transaction():
        rows = await conn.fetch(Q.log_dlq_take_by_address, principal.tenant, pid, txn)
        if not rows:
            raise NotFound(
                "dlq_not_found", "no dead letter for this partition id and transaction id", code="dlq_not_found",
                extra={"partitionId": str(pid), "transactionId": txn},
            )
        if len(rows) > 1:
            raise Conflict(
                "ambiguous_dead_letter",
                f"{len(rows)} consumer groups dead-lettered this message; replay one row with POST /api/v1/dlq/{{id}}/replay",
                code="dlq_replay_refused",
                extra={"dlqIds": [str(r["id"]) for r in rows], "consumerGroups": [r["consumer_group"] for r in rows]},
            )
        return await _replay(conn, principal, rows[0])


async def _replay(conn: Any, principal: Any, r: Any) -> dict[str, Any]:
    """Push a NEW message carrying the dead letter's stored bytes and delete the row, in the caller's
    transaction. A synthetic row (a timer that exhausted its fire attempts) is refused."""
    dlq_id = r["id"]
    if r["synthetic"]:
        raise Conflict(
            "synthetic_consumer_group",
            "this dead letter never had a consumer group (a timer that exhausted its fire attempts): its offset "
            "is not a position in any group, so it cannot be replayed; schedule a new timer instead",
            code="dlq_replay_refused",
        )
    if r["payload"] is None or r["partition"] is None:
        raise Conflict("no_payload", "this dead letter carries no stored message to replay", code="dlq_replay_refused")
    txn = replay_txn(r["txn"], dlq_id)
    mid = uuid7()
    try:
        push = Push(tenant=principal.tenant, plain=[], queues=[r["queue"]], partitions=[r["partition"]], ids=[mid],
                    txns=[txn], traces=[r["trace_id"]], payloads=[r["payload"]], codecs=[r["codec"]],
                    key_ids=[r["key_id"]], subs=[r["producer_sub"]], deadline_ms=[None])
        rows = await conn.fetch(push.query, *push.args())
    except asyncpg.PostgresError as exc:
        if getattr(exc, "sqlstate", None) != QUEUE_FULL:
            raise
        [full] = queues_full(exc).values()
        raise Conflict("queue_full", f"{queue_full_error(full)}; the dead letter is kept", code="dlq_replay_refused",
                       extra={"maxSize": full["maxSize"]}) from None
    await conn.execute(Q.log_dlq_delete, principal.tenant, dlq_id)
    row = rows[0]
    if row["status"] == "queued":
        MESSAGES_PUSHED.labels("dlq_replay").inc()
    return {
        "replayed": True,
        "success": True,
        "dlqId": str(dlq_id),
        "queue": r["queue"],
        "partition": r["partition"],
        "partitionId": str(row["partition_id"]),
        "messageId": str(row["message_id"]),
        "transactionId": txn,
        "originalMessageId": str(r["message_id"]),
        "originalTransactionId": r["txn"],
        "status": row["status"],
    }


async def lookup(b: Broker, tenant: str, queue: str, txn: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        r = await conn.fetchrow(Q.log_lookup_txn, tenant, queue, txn)
    if r is None:
        return {"found": False, "queue": queue, "transactionId": txn}
    return {
        "found": True,
        "queue": r["queue"],
        "partition": r["partition"],
        "partitionId": str(r["partition_id"]),
        "messageId": str(r["message_id"]),
        "transactionId": r["txn"],
        "producerSub": r["producer_sub"],
        "createdAt": render.ts(r["created_at"]),
        "deleted": r["deleted_at"] is not None,
        "deletedAt": render.ts(r["deleted_at"]),
    }


def message_not_found(pid: uuid.UUID, txn: str) -> NotFound:
    return NotFound("message_not_found", "no message with this partition id and transaction id",
                    code="message_not_found", extra={"partitionId": str(pid), "transactionId": txn})


async def message_get(b: Broker, tenant: str, pid: uuid.UUID, txn: str) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        r = await conn.fetchrow(Q.log_message_get, tenant, pid, txn)
    if r is None:
        raise message_not_found(pid, txn)
    if r["deleted_at"] is not None:  # a tombstone: its offset and address stay, its payload is gone
        data: dict[str, Any] = {"data": None}
    else:
        data = render.checked_data_fields(
            open_(b.codec, b.keyring, tenant, r["queue"], Sealed(r["payload"], r["codec"], r["key_id"])))
    return {
        "id": str(r["id"]),
        "transactionId": r["txn"],
        "traceId": str(r["trace_id"]) if r["trace_id"] else None,
        **data,
        "producerSub": r["producer_sub"],
        "createdAt": render.ts(r["created_at"]),
        "deadlineAt": render.ts(r["deadline_at"]),
        "queue": r["queue"],
        "partition": r["partition"],
        "partitionId": str(r["partition_id"]),
        "offset": r["seq"],
        "encrypted": r["key_id"] is not None,
        "deleted": r["deleted_at"] is not None,
        "deletedAt": render.ts(r["deleted_at"]),
    }


async def message_delete(b: Broker, principal: Principal, pid: uuid.UUID, txn: str) -> dict[str, Any]:
    """The official client's ``admin.delete_message`` (docs/decisions.md §9): the message becomes a
    tombstone at its offset (payload gone, offset kept, every consumer group done with it, its dead
    letters removed), in one statement. Deleting a tombstone again answers the first deletion
    (``alreadyDeleted: true``); an address this tenant has no message at is 404 ``message_not_found``."""
    async with b.require_pool().acquire() as conn, conn.transaction():
        r = await conn.fetchrow(Q.log_message_delete, principal.tenant, pid, txn, principal.sub, uuid7())
    if r is None or r["status"] == "not_found":
        raise message_not_found(pid, txn)
    MESSAGES_DELETED.labels(r["status"]).inc()
    return {
        "deleted": True,
        "alreadyDeleted": r["status"] == "already_deleted",
        "partitionId": str(pid),
        "transactionId": txn,
        "messageId": str(r["message_id"]),
        "queue": r["queue"],
        "partition": r["partition"],
        "offset": r["seq"],
        "deletedAt": render.ts(r["deleted_at"]),
        "freedBytes": int(r["freed_bytes"]),
        "deadLettersRemoved": int(r["dead_letters"]),
    }


async def queues_by_namespace(b: Broker, tenant: str, namespace: str | None, task: str | None) -> list[str]:
    async with b.require_pool().acquire() as conn:
        return [r["name"] for r in await conn.fetch(Q.log_queues_by_namespace, tenant, namespace, task)]
