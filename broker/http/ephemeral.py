"""Ephemeral queues, ``/api/v1/ephemeral/*`` (docs/protocol.md §6): configure, reset, delete, push,
pop (long poll), ack, the queue list and one queue's depth.

Grants as on the log: push and configure need ``produce``, pop and ack ``consume``, reset ``produce``
(it destroys nothing the class promised to keep), delete ``admin`` (like the log's queue delete); the
list and depth need none beyond a valid credential. Push passes ``limits.admit`` like the log's push.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker import limits
from broker.auth import Principal
from broker.context import broker, principal
from broker.ephemeral import parse
from broker.ephemeral.service import EphemeralPop, EphemeralService
from broker.errors import BadRequest, NotFound
from broker.http.wire import json_response, q_bool, q_int, read_object
from broker.log import QUEUE_MODE
from broker.log.parse import name, opt_str

MAX_TIMEOUT_MS = 300_000
MAX_BATCH = parse.MAX_ITEMS


def _svc(request: web.Request) -> EphemeralService:
    return broker(request).services.ephemeral


async def _body(request: web.Request, grant: str, keys: set[str]) -> tuple[Principal, dict[str, Any], str]:
    """The caller (holding ``grant``), the JSON body (only ``keys`` allowed) and its queue."""
    p = principal(request)
    p.require(grant)
    body = await read_object(request)
    extra = set(body) - keys
    if extra:
        key = sorted(extra)[0]
        raise BadRequest("unknown_field", f"{key!r} is not a field of this call", extra={"field": key})
    return p, body, parse.queue(body.get("queue"))


async def configure(request: web.Request) -> web.Response:
    p, body, queue = await _body(request, "produce", {"queue", "options"})
    opts = parse.options(body.get("options"))
    return json_response(await _svc(request).configure(p, queue, opts))


async def reset(request: web.Request) -> web.Response:
    p, _, queue = await _body(request, "produce", {"queue"})
    return json_response(await _svc(request).reset(p, queue))


async def delete(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("admin")
    queue = parse.queue(request.match_info["queue"])
    return json_response(await _svc(request).delete(p, queue))


async def push(request: web.Request) -> web.Response:
    p, body, queue = await _body(request, "produce", {"queue", "partition", "messages"})
    partition = name(body.get("partition"), "partition", default=parse.DEFAULT_PARTITION)
    plan = await limits.plan_for(broker(request), p.tenant)
    payloads = parse.payloads(body.get("messages"), max_payload=plan.max_payload_bytes)
    return json_response(await _svc(request).push(p, queue, partition, payloads), status=201)


async def pop(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    q = request.query
    req = EphemeralPop(
        queue=parse.queue(q.get("queue")),
        partition=opt_str(q.get("partition"), "partition"),
        group=opt_str(q.get("group"), "group") or QUEUE_MODE,
        batch=q_int(request, "batch", 1, lo=1, hi=MAX_BATCH, clamp=True),
        wait=q_bool(request, "wait", False),
        timeout_ms=q_int(request, "timeout", 30_000, lo=0, hi=MAX_TIMEOUT_MS, clamp=True),
        auto_ack=q_bool(request, "autoAck", False),
    )
    return json_response(await _svc(request).pop(p, req))


async def ack(request: web.Request) -> web.Response:
    p, body, queue = await _body(request, "consume", {"queue", "group", "acks"})
    # A group given must be a name (its schema: a non-empty string); "" or null is refused, never read as
    # the queue mode (the query string of a pop is where an empty value means "left out").
    group = name(body["group"], "group") if "group" in body else QUEUE_MODE
    return json_response(await _svc(request).ack(p, queue, group, parse.acks(body.get("acks"))))


async def queues(request: web.Request) -> web.Response:
    return json_response(await _svc(request).queues(principal(request)))


async def depth(request: web.Request) -> web.Response:
    queue = parse.queue(request.match_info["queue"])
    out = await _svc(request).depth(principal(request), queue)
    if out is None:
        raise NotFound("ephemeral_queue_not_found", f"no ephemeral queue {queue!r}",
                       code="ephemeral_queue_not_found")
    return json_response(out)


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/v1/ephemeral/configure", configure)
    r.add_post("/api/v1/ephemeral/reset", reset)
    r.add_delete("/api/v1/ephemeral/queue/{queue:[^/]+}", delete)
    r.add_post("/api/v1/ephemeral/push", push)
    r.add_get("/api/v1/ephemeral/pop", pop)
    r.add_post("/api/v1/ephemeral/ack", ack)
    r.add_get("/api/v1/ephemeral/queues", queues)
    r.add_get("/api/v1/ephemeral/queues/{queue:[^/]+}/depth", depth)
