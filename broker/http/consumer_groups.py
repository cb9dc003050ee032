"""Consumer-group management routes the official client calls (docs/protocol.md §2.11):

- ``GET /api/v1/consumer-groups``: every group of the tenant with, per queue, pending and lag.
- ``GET /api/v1/consumer-groups/lagging?minLagSeconds=60``: (group, queue) pairs whose oldest pending
  message is at least that old (registered before ``/{group}`` so it wins).
- ``GET /api/v1/consumer-groups/{group}``: one group; 404 ``consumer_group_not_found``.
- ``DELETE /api/v1/consumer-groups/{group}[/queues/{queue}]?deleteMetadata=true|false``: forget its
  positions (all queues, or one); ``deleteMetadata=false`` keeps its subscription instant.
- ``POST /api/v1/consumer-groups/{group}/queues/{queue}/seek`` ``{"toEnd": true}`` | ``{"timestamp": ISO}``.
- ``POST /api/v1/consumer-groups/{group}/subscription`` ``{"subscriptionTimestamp": ISO}``.
- ``POST /api/v1/stats/refresh``: the statistics are computed on every read, so there is nothing to
  refresh; it answers so (``{"refreshed": true, "live": true}``).

Reads: any principal of the tenant. Writes move a group's positions: the ``consume`` grant.
"""

from __future__ import annotations

from aiohttp import web

from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, q_bool, q_int, read_object
from broker.log import groups, parse


def _group(request: web.Request) -> str:
    return parse.name(request.match_info["group"], "consumerGroup")


async def list_groups(request: web.Request) -> web.Response:
    return json_response(await groups.list_groups(broker(request), principal(request).tenant))


async def lagging(request: web.Request) -> web.Response:
    min_lag = q_int(request, "minLagSeconds", 60, lo=0, hi=10 * 365 * 86_400)
    return json_response(await groups.lagging(broker(request), principal(request).tenant, min_lag))


async def get_group(request: web.Request) -> web.Response:
    return json_response(await groups.get_group(broker(request), principal(request).tenant, _group(request)))


async def delete_group(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    group = _group(request)
    queue = request.match_info.get("queue")
    if queue is not None:
        queue = parse.name(queue, "queue")
    meta = q_bool(request, "deleteMetadata", True)
    return json_response(await groups.delete(broker(request), p.tenant, group, queue, meta))


SEEK_KEYS = frozenset({"toEnd", "timestamp"})


async def seek(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    group = _group(request)
    queue = parse.name(request.match_info["queue"], "queue")
    body = await read_object(request, allow_empty=True)
    for key in body:
        if key not in SEEK_KEYS:
            raise BadRequest("unknown_field", f"{key!r} is not a seek field (toEnd or timestamp)", extra={"field": key})
    to_end = body.get("toEnd", False)
    if not isinstance(to_end, bool):
        raise BadRequest("bad_seek", "toEnd must be true or false")
    raw_ts = body.get("timestamp")
    if to_end == (raw_ts is not None):
        raise BadRequest("bad_seek", "seek needs exactly one of {\"toEnd\": true} or {\"timestamp\": ISO-8601}")
    at = None
    if raw_ts is not None:
        if not isinstance(raw_ts, str):
            raise BadRequest("bad_timestamp", "timestamp must be an ISO-8601 string")
        at = parse.timestamp(raw_ts, "timestamp")
    return json_response(await groups.seek(broker(request), p.tenant, group, queue, to_end, at))


async def subscription(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    group = _group(request)
    body = await read_object(request)
    extra = set(body) - {"subscriptionTimestamp"}
    if extra:
        raise BadRequest("unknown_field", f"{sorted(extra)[0]!r} is not a subscription field")
    raw = body.get("subscriptionTimestamp")
    if not isinstance(raw, str):
        raise BadRequest("bad_timestamp", "subscriptionTimestamp must be an ISO-8601 string")
    at = parse.timestamp(raw, "subscriptionTimestamp")
    return json_response(await groups.set_subscription(broker(request), p.tenant, group, at))


async def stats_refresh(request: web.Request) -> web.Response:
    principal(request)
    await read_object(request, allow_empty=True)
    return json_response({"refreshed": True, "live": True,
                          "detail": "consumer-group statistics are computed on every read; nothing is cached"})


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/v1/consumer-groups", list_groups)
    r.add_get("/api/v1/consumer-groups/lagging", lagging)
    r.add_get("/api/v1/consumer-groups/{group:[^/]+}", get_group)
    r.add_delete("/api/v1/consumer-groups/{group:[^/]+}", delete_group)
    r.add_delete("/api/v1/consumer-groups/{group:[^/]+}/queues/{queue:[^/]+}", delete_group)
    r.add_post("/api/v1/consumer-groups/{group:[^/]+}/queues/{queue:[^/]+}/seek", seek)
    r.add_post("/api/v1/consumer-groups/{group:[^/]+}/subscription", subscription)
    r.add_post("/api/v1/stats/refresh", stats_refresh)
