"""Usage routes: what the meter counted in the current period, read from the database (not a cache).

- ``GET /api/v1/usage``: the caller's tenant →
  ``{"tenant", "periodStart", "periodEnd", "messages", "kvOps", "storageBytes", "timersPending",
  "plan": <effective plan>}``.
- ``GET /api/v1/admin/usage`` (``admin`` grant): ``{"periodStart", "periodEnd", "tenants": [...]}``, one
  element per tenant with a meter or a gauge (same fields, without ``plan``); ``?tenant=`` narrows it.

Units (broker/metering.py): messages = pushed messages + timer schedule/reschedule ops (cancel and fire
0); kvOps = KV operations applied; storageBytes = stored log payloads + KV keys and values;
timersPending = timers not yet fired or cancelled.
"""

from __future__ import annotations

from aiohttp import web

from broker import limits, metering
from broker.context import broker, principal
from broker.http.admin_limits import check_tenant, wire_plan
from broker.http.wire import json_response


async def usage(request: web.Request) -> web.Response:
    b = broker(request)
    p = principal(request)
    body = (await metering.usage(b.require_pool(), p.tenant))[0]
    body["plan"] = wire_plan(await limits.plan_for(b, p.tenant))
    return json_response(body)


async def admin_usage(request: web.Request) -> web.Response:
    b = broker(request)
    principal(request).require("admin")
    tenant = request.query.get("tenant") or None
    if tenant is not None:
        tenant = check_tenant(tenant)
    tenants = await metering.usage(b.require_pool(), tenant)
    start, end = await metering.period_bounds(b.require_pool())
    return json_response({"periodStart": start, "periodEnd": end, "tenants": tenants})


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/usage", usage)
    app.router.add_get("/api/v1/admin/usage", admin_usage)
