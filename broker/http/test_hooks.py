"""Fault injection for the timer sweeper, for tests and the conformance suite (routes; the state and its
queries are in ``broker.timers.faults``).

Every route here answers 403 ``{"error": "test_hooks_disabled", "reason": "test_hooks_disabled"}``
unless the broker runs with ``QUEEN_TEST_HOOKS=1``. State lives in the database, so whichever worker
(or broker) runs the fire honours it. Everything is scoped to the caller's tenant; no grant is needed.

- ``POST /api/v1/test/timers/fail`` ``{"queue": Q, "count": N, "class": "transient"|"permanent"}``
  The next N fires of queue Q fail with that class: ``permanent`` spends one attempt of the budget,
  ``transient`` spends none; both clear the claim and back off (the row reads ``claimed: false`` and
  can be cancelled). ``{"class": "stall", "ms": M}`` instead holds the next N claimed fires of Q for
  M ms between claim and commit (a slow pack) — for drain and crash tests. ``count: 0`` clears.
  Answer: ``{"queue", "class", "remaining", "ms"}``.
- ``POST /api/v1/test/timers/hold`` ``{"queue": Q, "timerKey": K, "ms": M}``
  Claims timer K now with a lease of M ms without firing it (the claim token is held by nobody), so
  ``too_late`` and ``claimed: true`` can be observed from outside. When the lease expires the row is due
  again (never before its deliverAt) and a sweeper fires it. Answer ``{"held": bool, "claimedUntil"}``;
  ``held: false`` when there is no such timer.
- ``POST /api/v1/test/timers/release`` ``{"queue"?: Q, "timerKey"?: K}`` (body optional)
  Releases every live claim of the tenant (or of Q, or of Q/K) — held ones and a sweeper's alike, which
  is safe: a sweeper commits only rows still holding its token — and clears injected faults (of Q).
  Answer ``{"released": n, "faultsCleared": n}``.
"""

from __future__ import annotations

from aiohttp import web

from broker.context import broker, principal
from broker.errors import BadRequest, Forbidden
from broker.http.wire import json_response, read_object
from broker.timers import faults
from broker.timers.parse import MAX_KEY, MAX_QUEUE, check_name

MAX_MS = 3_600_000
MAX_COUNT = 1_000_000


def _guard(request: web.Request) -> None:
    if not broker(request).settings.test_hooks:
        raise Forbidden(
            "test_hooks_disabled",
            "test hooks are off; start the broker with QUEEN_TEST_HOOKS=1",
            code="test_hooks_disabled",
        )


def _int(body: dict, name: str, lo: int, hi: int, default: int | None = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest("bad_test_hook", f"`{name}` must be an integer in {lo}..{hi}")
    return value


async def fail(request: web.Request) -> web.Response:
    _guard(request)
    body = await read_object(request)
    queue = check_name(body.get("queue"), "queue", "timers_queue_required", MAX_QUEUE)
    count = _int(body, "count", 0, MAX_COUNT)
    klass = body.get("class")
    if klass not in ("transient", "permanent", "stall"):
        raise BadRequest("bad_test_hook", '`class` must be "transient", "permanent" or "stall"')
    ms = _int(body, "ms", 0, MAX_MS, 0)  # checked whatever the class: a bad value is refused, not ignored
    if klass != "stall":
        ms = 0
    tenant = principal(request).tenant
    return json_response(await faults.fail(broker(request).require_pool(), tenant, queue, klass, count, ms))


async def hold(request: web.Request) -> web.Response:
    _guard(request)
    body = await read_object(request)
    queue = check_name(body.get("queue"), "queue", "timers_queue_required", MAX_QUEUE)
    key = check_name(body.get("timerKey"), "timerKey", "timers_key_required", MAX_KEY)
    ms = _int(body, "ms", 1, MAX_MS)
    tenant = principal(request).tenant
    return json_response(await faults.hold(broker(request).require_pool(), tenant, queue, key, ms))


async def release(request: web.Request) -> web.Response:
    _guard(request)
    body = await read_object(request, allow_empty=True)
    queue = body.get("queue")
    key = body.get("timerKey")
    if queue is not None:
        queue = check_name(queue, "queue", "timers_queue_required", MAX_QUEUE)
    if key is not None:
        key = check_name(key, "timerKey", "timers_key_required", MAX_KEY)
    tenant = principal(request).tenant
    return json_response(await faults.release(broker(request).require_pool(), tenant, queue, key))


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/test/timers/fail", fail)
    app.router.add_post("/api/v1/test/timers/hold", hold)
    app.router.add_post("/api/v1/test/timers/release", release)
