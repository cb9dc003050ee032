"""Timer routes (docs/timer-routes.md, docs/protocol.md §3). Parse + validate, call ``broker.timers``, render.

- ``POST /api/v1/timers`` ``{"operations": [...]}`` -> 200 ``{"results": [...]}``, index-aligned, one
  transaction and one statement for the batch, at most ``QUEEN_TIMERS_MAX_OPS`` (256) ops. Needs the
  ``produce`` grant and passes the timers' admission (``service.admit``: ``limits.admit``, the plan); any refusal of the tenant or the cluster refuses the
  whole batch and carries ``x-queen-timers-hint`` naming the DELETE route. Scheduling switched off by an
  operator: 503 ``timers_disabled`` (+ hint, Retry-After).
- ``DELETE /api/v1/timers/{queue}/{timerKey}[?txn=...]`` -> the one result object. Its own authorization
  class: any authenticated principal of the tenant; only the boot flag refuses it (no grant, no
  limits, no kill switch). ``txn`` is echoed on ``absent``.
- ``GET /api/v1/timers/{queue}/{timerKey}`` -> peek (``found: false`` on a miss, HTTP 200).
- ``GET /api/v1/timers/{queue}[?after=&limit=]`` -> ``{rows, truncated, nextAfter}``; ``limit`` defaults
  to 100 and is clamped to 1..1000, never rejected. There is no tenant-wide list.
- ``GET /api/v1/timers-overview`` -> ``{pending, now, truncated, queues: [...], next: [...]}``: pending
  timers per queue and the tenant's next due ones (what the console shows); any principal.

``timerKey`` is a catch-all path segment (``tenant/42`` is a legal key).
"""

from __future__ import annotations

from aiohttp import web

from broker import errors
from broker.context import broker, principal
from broker.http.wire import json_response, read_object
from broker.timers import service
from broker.timers.parse import MAX_KEY, MAX_QUEUE, MAX_TXN, bad, check_name, parse_ops

LIST_DEFAULT = 100
LIST_MAX = 1000


async def post_timers(request: web.Request) -> web.Response:
    b = broker(request)
    p = principal(request)
    p.require("produce")
    try:
        body = await read_object(request, code=service.CODE)
    except errors.BadRequest as exc:
        raise bad("timers_bad_body", exc.detail) from None
    for field in body:
        if field != "operations":
            raise bad("timers_bad_body", f"unknown top-level field `{field}`; the body is {{\"operations\": [...]}}")
    if "operations" not in body:
        raise bad("timers_bad_body", "the body must carry `operations`, an array of timer operations")
    ops = parse_ops(body["operations"], max_ops=b.settings.timers_max_ops)
    if not ops:
        return json_response({"results": []})
    results = await service.schedule_call(b, p, ops)
    return json_response({"results": results})


def _path(request: web.Request) -> tuple[str, str | None]:
    queue = check_name(request.match_info["queue"], "queue", "timers_queue_required", MAX_QUEUE)
    key = request.match_info.get("timerKey")
    if key is not None:
        key = check_name(key, "timerKey", "timers_key_required", MAX_KEY)
    return queue, key


async def delete_timer(request: web.Request) -> web.Response:
    b = broker(request)
    p = principal(request)  # authenticated (the middleware did it); no grant, no limits, no switch
    queue, key = _path(request)
    assert key is not None
    txn = request.query.get("txn") or None
    if txn is not None:
        txn = check_name(txn, "txn", "timers_bad_txn", MAX_TXN)
    return json_response(await service.cancel_one(b, p, queue, key, txn))


async def peek_timer(request: web.Request) -> web.Response:
    b = broker(request)
    p = principal(request)
    queue, key = _path(request)
    assert key is not None
    return json_response(await service.peek(b, p.tenant, queue, key))


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    try:
        value = int(raw) if raw not in (None, "") else LIST_DEFAULT
    except ValueError:
        value = LIST_DEFAULT
    return max(1, min(LIST_MAX, value))


async def list_timers(request: web.Request) -> web.Response:
    b = broker(request)
    p = principal(request)
    queue, _ = _path(request)
    after = request.query.get("after") or None
    if after is not None and "\x00" in after:
        raise bad("timers_bad_name", "`after` contains a NUL character")
    return json_response(await service.list_page(b, p.tenant, queue, after, _limit(request)))


async def overview(request: web.Request) -> web.Response:
    """``GET /api/v1/timers-overview``: the tenant's pending timers per queue and its next due ones."""
    b = broker(request)
    p = principal(request)
    return json_response(await service.overview(b, p.tenant))


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/timers", post_timers)
    app.router.add_get("/api/v1/timers-overview", overview)
    app.router.add_get("/api/v1/timers/{queue:[^/]+}", list_timers)
    app.router.add_get(r"/api/v1/timers/{queue:[^/]+}/{timerKey:[\s\S]+}", peek_timer)
    app.router.add_delete(r"/api/v1/timers/{queue:[^/]+}/{timerKey:[\s\S]+}", delete_timer)
