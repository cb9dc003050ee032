"""Monitoring routes the official client's admin API calls (docs/protocol.md §2.9, §2.10, §2.13). Reads:
any principal of the tenant sees its own figures; message payloads (``GET /api/v1/messages``) need the
``consume`` grant like every other read of a payload; process and database metrics, which are not a
tenant's, need ``admin``.

- ``GET /api/v1/resources/overview`` | ``/namespaces`` | ``/tasks`` | ``/partitions?queue=&limit=&offset=``
- ``GET /api/v1/resources/queues/{queue}/depth[?group=]``
- ``GET /api/v1/status`` | ``/status/queues?limit=&offset=`` | ``/status/queues/{queue}`` |
  ``/status/analytics?from=&to=`` (the meter's periods) | ``/status/live`` (one sample of the console's
  live charts: broker-wide counters and the tenant's backlog per queue and dead letters)
- ``GET /api/v1/analytics/system-metrics`` | ``/analytics/worker-metrics`` (``admin``)
- ``GET /api/v1/messages?queue=&partition=&consumerGroup=&status=&limit=&offset=`` (``consume``)
- ``DELETE /api/v1/messages/{partitionId}/{transactionId}`` (``admin``): the message becomes a tombstone
  at its offset (docs/decisions.md §9); 404 ``message_not_found`` when the tenant has none there.
"""

from __future__ import annotations

from aiohttp import web

from broker import metering
from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, q_int
from broker.log import catalog, monitor, parse


def _opt_ts(request: web.Request, name: str):  # type: ignore[no-untyped-def]
    raw = request.query.get(name)
    return parse.timestamp(raw, name) if raw else None


async def overview(request: web.Request) -> web.Response:
    return json_response(await monitor.overview(broker(request), principal(request).tenant))


async def namespaces(request: web.Request) -> web.Response:
    return json_response(await monitor.by_label(broker(request), principal(request).tenant, "namespace"))


async def tasks(request: web.Request) -> web.Response:
    return json_response(await monitor.by_label(broker(request), principal(request).tenant, "task"))


async def partitions(request: web.Request) -> web.Response:
    queue = parse.opt_str(request.query.get("queue"), "queue")
    limit = q_int(request, "limit", 1000, lo=1, hi=10_000, clamp=True)
    offset = q_int(request, "offset", 0, lo=0, hi=2**31 - 1)
    return json_response(await monitor.partitions(broker(request), principal(request).tenant, queue, limit, offset))


async def depth(request: web.Request) -> web.Response:
    queue = parse.name(request.match_info["queue"], "queue")
    group = parse.opt_str(request.query.get("group"), "group")
    return json_response(await monitor.depth(broker(request), principal(request).tenant, queue, group))


async def status(request: web.Request) -> web.Response:
    return json_response(await monitor.status(broker(request), principal(request).tenant))


async def status_queues(request: web.Request) -> web.Response:
    limit = q_int(request, "limit", 100, lo=1, hi=10_000, clamp=True)
    offset = q_int(request, "offset", 0, lo=0, hi=2**31 - 1)
    return json_response(await monitor.queue_status(broker(request), principal(request).tenant, limit, offset))


async def status_queue(request: web.Request) -> web.Response:
    queue = parse.name(request.match_info["queue"], "queue")
    return json_response(await monitor.queue_detail(broker(request), principal(request).tenant, queue))


async def live(request: web.Request) -> web.Response:
    """One sample of the console's live charts (any principal of the tenant; the counters are the
    broker's own, as ``/metrics`` serves them)."""
    return json_response(await monitor.live(broker(request), principal(request).tenant))


async def analytics(request: web.Request) -> web.Response:
    since, until = _opt_ts(request, "from"), _opt_ts(request, "to")
    return json_response(await monitor.analytics(broker(request), principal(request).tenant, since, until,
                                                 metering.period_seconds()))


async def system_metrics(request: web.Request) -> web.Response:
    principal(request).require("admin")
    return json_response(await monitor.system_metrics(broker(request)))


async def worker_metrics(request: web.Request) -> web.Response:
    principal(request).require("admin")
    return json_response(monitor.worker_metrics(broker(request)))


async def list_messages(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    q = request.query
    if not q.get("queue"):
        raise BadRequest("bad_query", "list messages needs ?queue= (messages are listed one queue at a time)")
    queue = parse.name(q.get("queue"), "queue")
    state = q.get("status") or None
    if state is not None and state not in monitor.MESSAGE_STATES:
        raise BadRequest("bad_query", f"status must be one of {sorted(monitor.MESSAGE_STATES)}")
    out = await monitor.list_messages(
        broker(request), p.tenant, queue,
        parse.opt_str(q.get("partition"), "partition"),
        parse.opt_str(q.get("consumerGroup"), "consumerGroup"),
        state,
        q_int(request, "limit", 100, lo=1, hi=1000, clamp=True),
        q_int(request, "offset", 0, lo=0, hi=100_000),
    )
    return json_response(out)


async def delete_message(request: web.Request) -> web.Response:
    """Delete one message: its payload goes, its offset stays as a tombstone that every consumer group
    passes over (``catalog.message_delete``)."""
    p = principal(request)
    p.require("admin")
    pid = parse.partition_id(request.match_info["pid"], "the partition id")
    txn = parse.txn_id(request.match_info["txn"], "transactionId")
    return json_response(await catalog.message_delete(broker(request), p, pid, txn))


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/v1/resources/overview", overview)
    r.add_get("/api/v1/resources/namespaces", namespaces)
    r.add_get("/api/v1/resources/tasks", tasks)
    r.add_get("/api/v1/resources/partitions", partitions)
    r.add_get("/api/v1/resources/queues/{queue:[^/]+}/depth", depth)
    r.add_get("/api/v1/status", status)
    r.add_get("/api/v1/status/queues", status_queues)
    r.add_get("/api/v1/status/queues/{queue:[^/]+}", status_queue)
    r.add_get("/api/v1/status/analytics", analytics)
    r.add_get("/api/v1/status/live", live)
    r.add_get("/api/v1/analytics/system-metrics", system_metrics)
    r.add_get("/api/v1/analytics/worker-metrics", worker_metrics)
    r.add_get("/api/v1/messages", list_messages)
    r.add_delete("/api/v1/messages/{pid:[^/]+}/{txn:[^/]+}", delete_message)
