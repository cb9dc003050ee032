"""Operator switches of the timer surface (``admin`` grant); the state and its queries are in
``broker.timers.switches`` (the database holds it, so a switch holds for every worker at once).

- ``GET  /api/v1/admin/timers/sweeper``      -> ``{"paused": bool, "schedulingEnabled": bool, "updatedAt"}``
- ``POST /api/v1/admin/timers/sweeper``      ``{"paused": bool}``: pause / resume the fire, cluster-wide.
  Only an operator stops the fire; no quota, storage or pause rung of the limits does.
- ``GET  /api/v1/admin/timers/scheduling``   -> the same document
- ``POST /api/v1/admin/timers/scheduling``   ``{"enabled": bool}``: with scheduling off,
  ``POST /api/v1/timers`` answers 503 ``timers_disabled`` (+ ``x-queen-timers-hint``, Retry-After), the
  transaction rider 403 ``timers_disabled``, and the DELETE cancel keeps working.
"""

from __future__ import annotations

from aiohttp import web

from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, read_object
from broker.timers import switches


async def _flag(request: web.Request, name: str) -> bool:
    body = await read_object(request)
    value = body.get(name)
    extra = set(body) - {name}
    if not isinstance(value, bool) or extra:
        raise BadRequest("bad_switch", f'the body must be {{"{name}": true|false}} and nothing else')
    return value


async def get_switches(request: web.Request) -> web.Response:
    principal(request).require("admin")
    return json_response(await switches.get(broker(request).require_pool()))


async def set_sweeper(request: web.Request) -> web.Response:
    principal(request).require("admin")
    paused = await _flag(request, "paused")
    return json_response(await switches.set_sweeper_paused(broker(request).require_pool(), paused))


async def set_scheduling(request: web.Request) -> web.Response:
    principal(request).require("admin")
    enabled = await _flag(request, "enabled")
    return json_response(await switches.set_scheduling(broker(request).require_pool(), enabled))


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/admin/timers/sweeper", get_switches)
    app.router.add_post("/api/v1/admin/timers/sweeper", set_sweeper)
    app.router.add_get("/api/v1/admin/timers/scheduling", get_switches)
    app.router.add_post("/api/v1/admin/timers/scheduling", set_scheduling)
