"""Trace routes (docs/protocol.md §2.12):

- ``POST /api/v1/traces`` ``{"transactionId", "partitionId", "consumerGroup", "traceNames": [..] | null,
  "eventType": "info", "data": {...}}`` (``consume``): records one event about an existing message of the
  tenant; 404 ``message_not_found`` otherwise. Answers ``{"recorded": true, "id", "createdAt"}``.
- ``GET /api/v1/traces/{partitionId}/{transactionId}``: a message's traces, oldest first.
- ``GET /api/v1/traces/by-name/{name}?limit=&offset=&from=&to=``: newest first.
- ``GET /api/v1/traces/names?search=&limit=``: the names in use, with counts.

Reads: any principal of the tenant.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, q_int, read_object
from broker.log import QUEUE_MODE, parse, traces

TRACE_KEYS = frozenset({"transactionId", "partitionId", "consumerGroup", "traceNames", "eventType", "data"})
MAX_NAMES = 16
MAX_EVENT_TYPE = 64
MAX_DATA_BYTES = 64 * 1024


def _event(body: dict) -> traces.TraceEvent:
    for key in body:
        if key not in TRACE_KEYS:
            raise BadRequest("unknown_field", f"{key!r} is not a trace field", extra={"field": key})
    pid = parse.partition_id(body.get("partitionId"), "partitionId")
    txn = parse.txn_id(body.get("transactionId"), "transactionId")
    group = parse.name(body.get("consumerGroup") or QUEUE_MODE, "consumerGroup")
    raw_names = body.get("traceNames")
    names: list[str] = []
    if raw_names is not None:
        if not isinstance(raw_names, list) or len(raw_names) > MAX_NAMES:
            raise BadRequest("bad_trace", f"traceNames must be null or an array of at most {MAX_NAMES} names")
        names = sorted({parse.name(n, "traceNames[]") for n in raw_names})
    event_type = body.get("eventType") or "info"
    if not isinstance(event_type, str) or len(event_type) > MAX_EVENT_TYPE:
        raise BadRequest("bad_trace", f"eventType must be a string of at most {MAX_EVENT_TYPE} characters")
    if "data" not in body:
        raise BadRequest("bad_trace", "a trace needs data (any JSON value)")
    if len(orjson.dumps(body["data"])) > MAX_DATA_BYTES:
        raise BadRequest("bad_trace", f"trace data is larger than {MAX_DATA_BYTES} bytes")
    return traces.TraceEvent(pid, txn, group, event_type, names, body["data"])


async def record(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    ev = _event(await read_object(request))
    return json_response(await traces.record(broker(request), p.tenant, p.sub, ev), status=201)


async def for_message(request: web.Request) -> web.Response:
    pid = parse.partition_id(request.match_info["pid"], "the partition id")
    txn = parse.txn_id(request.match_info["txn"], "transactionId")
    return json_response(await traces.for_message(broker(request), principal(request).tenant, pid, txn))


async def by_name(request: web.Request) -> web.Response:
    name = parse.name(request.match_info["name"], "trace name")
    q = request.query
    since = parse.timestamp(q["from"], "from") if q.get("from") else None
    until = parse.timestamp(q["to"], "to") if q.get("to") else None
    limit = q_int(request, "limit", 100, lo=1, hi=1000, clamp=True)
    offset = q_int(request, "offset", 0, lo=0, hi=100_000)
    return json_response(await traces.by_name(broker(request), principal(request).tenant, name, since, until, limit, offset))


async def names(request: web.Request) -> web.Response:
    search = parse.opt_str(request.query.get("search"), "search")
    limit = q_int(request, "limit", 100, lo=1, hi=1000, clamp=True)
    return json_response(await traces.names(broker(request), principal(request).tenant, search, limit))


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/v1/traces", record)
    r.add_get("/api/v1/traces/names", names)
    r.add_get("/api/v1/traces/by-name/{name:[^/]+}", by_name)
    r.add_get("/api/v1/traces/{pid:[^/]+}/{txn:[^/]+}", for_message)
