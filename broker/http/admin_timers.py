"""Operator switches of the timer surface (``admin`` grant). State lives in the database
(``queen_timer_switches``), so a switch holds for every worker and every broker on the database at once.

- ``GET  /api/v1/admin/timers/sweeper``      -> ``{"paused": bool, "schedulingEnabled": bool, "updatedAt"}``
- ``POST /api/v1/admin/timers/sweeper``      ``{"paused": bool}``: pause / resume the fire, cluster-wide.
  Only an operator stops the fire; no quota, storage or pause rung of the limits does.
- ``GET  /api/v1/admin/timers/scheduling``   -> the same document
- ``POST /api/v1/admin/timers/scheduling``   ``{"enabled": bool}``: with scheduling off,
  ``POST /api/v1/timers`` answers 503 ``timers_disabled`` (+ ``x-queen-timers-hint``, Retry-After), the
  transaction rider 403 ``timers_disabled``, and the DELETE cancel keeps working.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker.context import BROKER, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, read_object
from broker.store.queries import Q
from broker.timers.status import iso_us


def _doc(row: Any) -> dict[str, Any]:
    return {
        "paused": row["sweeper_paused"],
        "schedulingEnabled": row["scheduling_enabled"],
        "updatedAt": iso_us(row["updated_at"]),
    }


async def _flag(request: web.Request, name: str) -> bool:
    body = await read_object(request)
    value = body.get(name)
    extra = set(body) - {name}
    if not isinstance(value, bool) or extra:
        raise BadRequest("bad_switch", f'the body must be {{"{name}": true|false}} and nothing else')
    return value


async def get_switches(request: web.Request) -> web.Response:
    principal(request).require("admin")
    async with request.app[BROKER].require_pool().acquire() as conn:
        row = await conn.fetchrow(Q.timers_switches_get)
    return json_response(_doc(row))


async def set_sweeper(request: web.Request) -> web.Response:
    principal(request).require("admin")
    paused = await _flag(request, "paused")
    async with request.app[BROKER].require_pool().acquire() as conn:
        async with conn.transaction():
            row = await conn.fetchrow(Q.timers_switch_sweeper, paused)
            if not paused:
                await conn.execute(Q.timers_wake)  # resumed: wake the sweepers now, not at their next tick
    return json_response(_doc(row))


async def set_scheduling(request: web.Request) -> web.Response:
    principal(request).require("admin")
    enabled = await _flag(request, "enabled")
    async with request.app[BROKER].require_pool().acquire() as conn:
        row = await conn.fetchrow(Q.timers_switch_scheduling, enabled)
    return json_response(_doc(row))


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/admin/timers/sweeper", get_switches)
    app.router.add_post("/api/v1/admin/timers/sweeper", set_sweeper)
    app.router.add_get("/api/v1/admin/timers/scheduling", get_switches)
    app.router.add_post("/api/v1/admin/timers/scheduling", set_scheduling)
