"""The message log's hot routes: push, pop (long poll), ack, lease extend, the DLQ, lookups.

Thin handlers: parse and validate (``broker.log.parse``), call ``LogService`` / ``catalog``, render.
"""

from __future__ import annotations

import dataclasses
import uuid

from aiohttp import web

from broker import limits
from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http import binary
from broker.http.wire import json_response, q_bool, q_int, read_object
from broker.log import QUEUE_MODE, catalog, parse
from broker.log.service import LogService, PopRequest

MAX_TIMEOUT_MS = 300_000
MAX_BATCH = 10_000
MAX_PARTITIONS = 100
# The sweep width of a pop that leaves it to the broker (the client's pop autopilot, its default: the
# ``autopilot=true`` flag with no ``partitions``): up to this many partitions, never more than the batch.
# One round trip then drains what is ready across partitions, instead of one pop per partition (a
# burst of timers fired into 16 partitions would reach a long-polling consumer through 16 pops).
AUTOPILOT_PARTITIONS = 32


def _svc(request: web.Request) -> LogService:
    return broker(request).services.log


async def push(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("produce")
    if binary.is_binary(request):  # QPB1 (docs/protocol.md §1.9): the same items, the same one call
        raw = await request.read()
        plan = await limits.plan_for(broker(request), p.tenant)
        pushed = binary.decode_push(raw, max_payload=plan.max_payload_bytes)
        results = await _svc(request).push(p, pushed.items)
        return json_response(binary.push_counts(results) if pushed.counts else results, status=201)
    body = await read_object(request)
    extra = set(body) - {"items"}
    if extra:
        raise BadRequest("unknown_field", f"{sorted(extra)[0]!r} is not a push field; send {{\"items\": [...]}}")
    plan = await limits.plan_for(broker(request), p.tenant)
    items = parse.push_items(body.get("items"), max_payload=plan.max_payload_bytes)
    return json_response(await _svc(request).push(p, items), status=201)


def _pop_request(request: web.Request, queue: str, partition: str | None) -> PopRequest:
    b = broker(request)
    conflation = q_bool(request, "conflation", False)
    group = request.query.get("consumerGroup") or QUEUE_MODE
    auto_ack = q_bool(request, "autoAck", False)
    if conflation and group == QUEUE_MODE:
        raise BadRequest("conflation_needs_group", "conflation is a consumer group's policy: pop with consumerGroup")
    if conflation and auto_ack:
        raise BadRequest("conflation_with_auto_ack", "conflation cannot be combined with autoAck (commit at delivery)")
    q_bool(request, "frames", False)  # validated here; read by the answer (binary.wants_frames)
    mode = request.query.get("subscriptionMode") or None
    if mode is not None and mode not in ("all", "new"):
        raise BadRequest("bad_query", "subscriptionMode must be 'all' or 'new'")
    raw_from = request.query.get("subscriptionFrom") or None
    sub_from = None
    if raw_from is not None and raw_from != "now":
        sub_from = parse.timestamp(raw_from, "subscriptionFrom")
    if raw_from == "now":
        mode = "new"
    batch = q_int(request, "batch", b.settings.pop_default_batch, lo=1, hi=MAX_BATCH, clamp=True)
    return PopRequest(
        queue=queue,
        partition=partition,
        group=parse.name(group, "consumerGroup"),
        batch=batch,
        partitions=_pop_width(request, batch),
        auto_ack=auto_ack,
        sub_mode=mode,
        sub_from=sub_from,
        wait=q_bool(request, "wait", False),
        timeout_ms=q_int(request, "timeout", 30_000, lo=0, hi=MAX_TIMEOUT_MS, clamp=True),
        conflation=conflation,
    )


def _pop_width(request: web.Request, batch: int) -> int:
    """How many partitions one pop may lease: ``partitions`` as sent (default 1); a client that engaged
    autopilot and sent no ``partitions`` leaves the width to us (docs/protocol.md §2.4). Any other
    ``autopilot`` value changes nothing (unknown values stay tolerated, as before)."""
    if "partitions" in request.query or request.query.get("autopilot") != "true":
        return q_int(request, "partitions", 1, lo=1, hi=MAX_PARTITIONS, clamp=True)
    return max(1, min(batch, AUTOPILOT_PARTITIONS))


def _pop_answer(request: web.Request, answer: dict | None) -> web.Response:
    if answer is None:
        return web.Response(status=204)
    if binary.wants_frames(request):  # QPF1 (docs/protocol.md §1.11); an answer it cannot carry stays JSON
        framed = binary.encode_pop(answer)
        if framed is not None:
            return web.Response(body=framed, content_type=binary.POP_TYPE)
    return json_response(answer)


async def pop_queue(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    queue = parse.name(request.match_info["queue"], "queue")
    partition = request.match_info.get("partition")
    if partition is not None:
        partition = parse.name(partition, "partition")
    req = _pop_request(request, queue, partition)
    return _pop_answer(request, await _svc(request).pop(p, req))


async def pop_by_namespace(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    ns = parse.opt_str(request.query.get("namespace"), "namespace")
    task = parse.opt_str(request.query.get("task"), "task")
    if ns is None and task is None:
        raise BadRequest("bad_query", "pop by namespace needs namespace and/or task")
    req = _pop_request(request, "", None)  # validate the parameters before the lookup can answer 204
    queues = await catalog.queues_by_namespace(broker(request), p.tenant, ns, task)
    if not queues:
        return _pop_answer(request, LogService.empty_answer(req, {}))
    return _pop_answer(request, await _svc(request).pop(p, dataclasses.replace(req, queue=queues[0]), queues))


async def ack(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    body = await read_object(request)
    item = parse.ack_item(body, "body", None)
    return json_response(await _svc(request).ack(p, [item]))


async def ack_batch(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    body = await read_object(request)
    acks = body.get("acknowledgments")
    if not isinstance(acks, list):
        raise BadRequest("bad_ack", "acknowledgments must be an array")
    if len(acks) > parse.MAX_ITEMS:
        raise BadRequest("too_many_items", f"at most {parse.MAX_ITEMS} acknowledgments per call")
    group = body.get("consumerGroup")
    if group is not None:
        group = parse.name(group, "consumerGroup")
    memo: dict = {}
    items = [parse.ack_item(a, f"acknowledgments[{i}]", group, memo) for i, a in enumerate(acks)]
    return json_response(await _svc(request).ack(p, items))


async def lease_extend(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    await read_object(request, allow_empty=True)
    return json_response(await _svc(request).extend(p, request.match_info["lease"]))


async def dlq_list(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    q = request.query
    since = parse.timestamp(q["from"], "from") if q.get("from") else None
    until = parse.timestamp(q["to"], "to") if q.get("to") else None
    out = await catalog.dlq_list(
        broker(request), p.tenant,
        parse.opt_str(q.get("queue"), "queue"),
        parse.opt_str(q.get("consumerGroup"), "consumerGroup"),
        parse.opt_str(q.get("partition"), "partition"),
        since, until,
        q_int(request, "limit", 100, lo=1, hi=1000, clamp=True),
        q_int(request, "offset", 0, lo=0, hi=2**31 - 1, clamp=True),
    )
    return json_response(out)


async def dlq_replay(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("produce")
    await read_object(request, allow_empty=True)
    try:
        dlq_id = uuid.UUID(request.match_info["id"])
    except ValueError:
        raise BadRequest("bad_uuid", "the DLQ id is not a UUID") from None
    return json_response(await catalog.dlq_replay(broker(request), p, dlq_id))


async def message_retry(request: web.Request) -> web.Response:
    """``admin.retry_message``: replay the dead letter of the message at this address."""
    p = principal(request)
    p.require("produce")
    await read_object(request, allow_empty=True)
    pid, txn = _address(request)
    return json_response(await catalog.dlq_retry_message(broker(request), p, pid, txn))


def _address(request: web.Request) -> tuple[uuid.UUID, str]:
    pid = parse.partition_id(request.match_info["pid"], "the partition id")
    return pid, parse.txn_id(request.match_info["txn"], "transactionId")


async def lookup(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    queue = parse.name(request.query.get("queue"), "queue")
    txn = parse.txn_id(request.query.get("txn"), "txn")
    return json_response(await catalog.lookup(broker(request), p.tenant, queue, txn))


async def message_get(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    pid, txn = _address(request)
    return json_response(await catalog.message_get(broker(request), p.tenant, pid, txn))


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/v1/push", push)
    r.add_get("/api/v1/pop/queue/{queue:[^/]+}", pop_queue)
    r.add_get("/api/v1/pop/queue/{queue:[^/]+}/partition/{partition:[^/]+}", pop_queue)
    r.add_get("/api/v1/pop", pop_by_namespace)
    r.add_post("/api/v1/ack", ack)
    r.add_post("/api/v1/ack/batch", ack_batch)
    r.add_post("/api/v1/lease/{lease:[^/]+}/extend", lease_extend)
    r.add_get("/api/v1/dlq", dlq_list)
    r.add_post("/api/v1/dlq/{id}/replay", dlq_replay)
    r.add_get("/api/v1/messages/lookup", lookup)
    r.add_get("/api/v1/messages/{pid}/{txn:[^/]+}", message_get)
    r.add_post("/api/v1/messages/{pid}/{txn:[^/]+}/retry", message_retry)
