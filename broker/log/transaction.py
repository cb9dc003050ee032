"""``POST /api/v1/transaction``: pushes, acks and the riders (kv, timers) in ONE database transaction.

All or nothing. The flat result space is: each pushed item and each ack, in operation order, then one
entry per kv op, then one per timer op. Acks run first (one ``queen_ack`` call for all of them), then
every pushed item (one ``queen_push`` call), then the metering hook, then the riders on the same
connection. Any refusal rolls everything back:
  - an ack the log refuses (bad or expired lease, unknown message), or a ``requiredLeases`` entry
    that is not live: HTTP 200 ``{"success": false, "error": <prose>, "reason": <id>,
    "failedIndex": <flat index or null>, "results": []}`` (the official client raises on it);
  - a push to a queue whose maxSize it would exceed: the same shape, reason ``queue_full``;
  - a rider's ``RiderAbort(body)``: HTTP 200 with that body (e.g. a lost required KV precondition);
  - malformed input: 400 before anything runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from broker import limits, metering, riders
from broker.auth import Principal
from broker.errors import BadRequest, Unavailable
from broker.ids import uuid7
from broker.log import parse
from broker.log.parse import AckItem, PushItem
from broker.log.service import ENCRYPTION_RACE, QUEUE_FULL, LogService, queue_full_error, queues_full
from broker.metrics import MESSAGES_PUSHED
from broker.store.pool import Conn
from broker.store.queries import Q

if TYPE_CHECKING:
    from broker.context import Broker

TX_KEYS = frozenset({"operations", "requiredLeases", "kv", "timers"})


@dataclass
class Bundle:
    layout: list[tuple[str, int]] = field(default_factory=list)  # ("push", item#) | ("ack", ack#) per flat slot
    pushes: list[PushItem] = field(default_factory=list)
    acks: list[AckItem] = field(default_factory=list)
    required: list[uuid.UUID | None] = field(default_factory=list)
    riders: list[tuple[Any, Any]] = field(default_factory=list)  # (rider, parsed)


class _Refused(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("error"))
        self.body = body


def parse_bundle(body: dict[str, Any], principal: Principal, b: Broker, max_payload: int) -> Bundle:
    for key in body:
        if key not in TX_KEYS:
            raise BadRequest("unknown_field", f"{key!r} is not a transaction field", extra={"field": key})
    ops = body.get("operations", [])
    if not isinstance(ops, list):
        raise BadRequest("bad_operations", "operations must be an array")
    req = body.get("requiredLeases")
    req = [] if req is None else req  # only null means "none"; false, 0 or "" are malformed
    if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
        raise BadRequest("bad_required_leases", "requiredLeases must be an array of lease id strings")
    bundle = Bundle(required=[parse.maybe_uuid(x) for x in dict.fromkeys(req)])
    lend = bundle.required[0] if len(bundle.required) == 1 else None
    for i, op in enumerate(ops):
        where = f"operations[{i}]"
        if not isinstance(op, dict):
            raise BadRequest("bad_operation", f"{where} must be an object")
        kind = op.get("type")
        if kind == "push":
            extra = set(op) - {"type", "items"}
            if extra:
                raise BadRequest("unknown_field", f"{where}.{sorted(extra)[0]} is not a push operation field")
            items = parse.push_items(op.get("items"), max_payload=max_payload, where=f"{where}.items")
            for it in items:
                bundle.layout.append(("push", len(bundle.pushes)))
                bundle.pushes.append(it)
        elif kind == "ack":
            extra = set(op) - {"type", "transactionId", "partitionId", "status", "consumerGroup", "leaseId", "error"}
            if extra:
                raise BadRequest("unknown_field", f"{where}.{sorted(extra)[0]} is not an ack operation field")
            item = parse.ack_item(op, where, None)
            if item.lease is None and not item.lease_malformed and lend is not None:
                item = AckItem(item.partition_id, item.txn, item.status, lend, False, item.group, item.error)
            bundle.layout.append(("ack", len(bundle.acks)))
            bundle.acks.append(item)
        else:
            raise BadRequest("bad_operation_type", f"{where}.type must be 'push' or 'ack'")
    for name in riders.ORDER:
        if name not in body:
            continue
        rider = b.services.riders.get(name)
        if rider is None:
            raise BadRequest("rider_unavailable", f"this broker does not serve the {name!r} rider")
        bundle.riders.append((rider, rider.parse(body[name], principal, b)))
    if bundle.pushes:
        principal.require("produce")
    if bundle.acks:
        principal.require("consume")
    return bundle


def add_pushes(bundle: Bundle, items: list[PushItem], principal: Principal) -> None:
    """Append pushed items after the bundle's operations (a binary transaction's groups: their results
    follow the head's operations, before the riders')."""
    if items:
        principal.require("produce")
    for it in items:
        bundle.layout.append(("push", len(bundle.pushes)))
        bundle.pushes.append(it)


async def run(b: Broker, svc: LogService, principal: Principal, bundle: Bundle) -> dict[str, Any]:
    if bundle.pushes:
        await limits.admit(b, principal, "push", len(bundle.pushes))
    for rider, parsed in bundle.riders:
        await rider.admit(parsed, principal, b)
    try:
        async with b.require_pool().acquire() as conn, conn.transaction():
            results = await _apply(b, svc, principal, bundle, conn)
    except _Refused as exc:
        return exc.body
    except riders.RiderAbort as exc:
        return exc.body
    except asyncpg.PostgresError as exc:
        if getattr(exc, "sqlstate", None) == ENCRYPTION_RACE:
            raise Unavailable("queue_reconfigured", "a destination queue's encryption changed during the transaction; retry") from None
        if getattr(exc, "sqlstate", None) == QUEUE_FULL:
            return _queue_full(bundle, queues_full(exc))
        raise
    queued = sum(1 for r in results if r.get("type") == "push" and r.get("status") == "queued")
    if queued:
        MESSAGES_PUSHED.labels("transaction").inc(queued)
    return {"success": True, "transactionId": str(uuid7()), "results": results}


def _queue_full(bundle: Bundle, full: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A push of the transaction would exceed a queue's maxSize: all or nothing, so nothing ran."""
    flat = next(i for i, (kind, n) in enumerate(bundle.layout) if kind == "push" and bundle.pushes[n].queue in full)
    f = full[bundle.pushes[bundle.layout[flat][1]].queue]
    return {"success": False, "error": queue_full_error(f), "reason": "queue_full", "failedIndex": flat, "results": []}


async def _apply(b: Broker, svc: LogService, principal: Principal, bundle: Bundle, conn: Conn) -> list[dict[str, Any]]:
    if bundle.required:
        wanted = [x for x in bundle.required if x is not None]
        live = {r["lease_id"] for r in await conn.fetch(Q.log_leases_live, principal.tenant, wanted)} if wanted else set()
        if any(x is None or x not in live for x in bundle.required):
            raise _Refused({"success": False, "error": "Invalid or expired lease in requiredLeases",
                            "reason": "lease_invalid", "failedIndex": None, "results": []})
    acked = await svc.ack(principal, bundle.acks, conn=conn) if bundle.acks else []
    pushed = await svc.push_in_tx(conn, principal, bundle.pushes) if bundle.pushes else []
    results: list[dict[str, Any]] = []
    for flat, (kind, n) in enumerate(bundle.layout):
        if kind == "ack":
            a = acked[n]
            if not a["success"]:
                raise _Refused({"success": False, "error": a["error"] or "acknowledgement refused", "reason": "ack_refused",
                                "failedIndex": flat, "results": []})
            results.append({"index": flat, "type": "ack", "success": True, "transactionId": a["transactionId"],
                            "partitionId": a["partitionId"], "status": a["status"], "dlq": a["dlq"], "error": None})
        else:
            p = pushed[n]
            it = bundle.pushes[n]
            results.append({"index": flat, "type": "push", "success": True, "status": p["status"],
                            "transactionId": p["txn"], "messageId": str(p["message_id"]),
                            "partitionId": str(p["partition_id"]), "queueName": it.queue, "error": None})
    queued = sum(1 for p in pushed if p["status"] == "queued")
    await metering.record(conn, principal.tenant, messages=queued)
    for rider, parsed in bundle.riders:
        results.extend(await rider.apply(conn, parsed, principal, b, len(results)))
    return results
