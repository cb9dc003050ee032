"""Operator routes of the limits surface (the ``admin`` grant).

- ``GET /api/v1/admin/tenants/{tenant}/plan`` → ``{"tenant", "plan": <stored fields, null = inherit>,
  "cell": <cell defaults>, "effective": <what admit/plan_for use>}``.
- ``PUT /api/v1/admin/tenants/{tenant}/plan`` with any of ``timersHorizonMs, maxPayloadBytes,
  timersRowQuota, rateLimitPerS, periodQuotaMessages, storageQuotaBytes`` (integers >= 0, or null =
  inherit the cell's value). The PUT replaces the stored plan whole. A value that would WIDEN the cell
  (larger than the cell's, or 0 = unlimited where the cell has a limit) is refused with 400
  ``plan_widens_cell`` and nothing is stored: a tenant's plan can only narrow the cell.
- ``DELETE /api/v1/admin/tenants/{tenant}/plan`` → ``{"tenant", "deleted": bool}``: back to the cell.
- ``GET|POST /api/v1/admin/tenants/{tenant}/timers-paused`` ``{"paused": bool}``: the tenant's
  scheduling (POST /api/v1/timers, the timers rider) answers 403 ``timers_paused``; cancels by DELETE
  keep working.
- ``GET|POST /api/v1/admin/cluster/suspended`` ``{"suspended": bool}``: every produce-class call of every
  tenant answers 403 ``cluster_suspended`` (the DELETE timer cancel, reads and acks keep working).

Every change NOTIFYs ``queen_limits`` so every worker of every broker re-reads before its next decision.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker import limits
from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, read_object

WIRE = {
    "timersHorizonMs": "timers_horizon_ms",
    "maxPayloadBytes": "max_payload_bytes",
    "timersRowQuota": "timers_row_quota",
    "rateLimitPerS": "rate_limit_per_s",
    "periodQuotaMessages": "period_quota_messages",
    "storageQuotaBytes": "storage_quota_bytes",
}
_TENANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")
MAX_VALUE = 2**62


def check_tenant(t: str) -> str:
    if not t or len(t) > 128 or not set(t) <= _TENANT_CHARS:
        raise BadRequest("bad_tenant", "not a valid tenant name (1-128 of a-z A-Z 0-9 . _ - :)")
    return t


def _tenant(request: web.Request) -> str:
    principal(request).require("admin")
    return check_tenant(request.match_info.get("tenant", ""))


def wire_plan(plan: limits.Plan | dict[str, Any] | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    get = plan.get if isinstance(plan, dict) else (lambda n: getattr(plan, n))
    return {w: get(n) for w, n in WIRE.items()}


async def _plan_answer(request: web.Request, tenant: str) -> dict[str, Any]:
    b = broker(request)
    stored = await limits.stored_plan(b, tenant)
    cell = limits.cell_plan(b.settings)
    return {
        "tenant": tenant,
        "plan": wire_plan(stored),
        "cell": wire_plan(cell),
        "effective": wire_plan(limits.effective(cell, stored)),
    }


async def plan_get(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    return json_response(await _plan_answer(request, tenant))


async def plan_put(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    b = broker(request)
    body = await read_object(request)
    cell = limits.cell_plan(b.settings)
    values: dict[str, int | None] = {n: None for n in limits.PLAN_FIELDS}
    for k, v in body.items():
        if k not in WIRE:
            raise BadRequest("plan_unknown_field", f"unknown plan field {k!r}; known: {sorted(WIRE)}")
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > MAX_VALUE:
            raise BadRequest("plan_bad_value", f"{k} must be an integer >= 0, or null to inherit the cell's value")
        name = WIRE[k]
        if not limits.narrows(name, getattr(cell, name), v):
            raise BadRequest(
                "plan_widens_cell",
                f"{k}={v} would widen the cell's value {getattr(cell, name)}"
                + (" (0 = unlimited)" if name in limits.ZERO_UNLIMITED else "")
                + "; a tenant's plan can only narrow the cell",
            )
        values[name] = v
    await limits.store_plan(b, tenant, values)
    return json_response(await _plan_answer(request, tenant))


async def plan_delete(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    deleted = await limits.delete_plan(broker(request), tenant)
    return json_response({"tenant": tenant, "deleted": deleted})


def _flag(body: dict[str, Any], name: str) -> bool:
    v = body.get(name)
    if not isinstance(v, bool) or set(body) != {name}:
        raise BadRequest("bad_switch", f"the body must be {{\"{name}\": true|false}}")
    return v


async def paused(request: web.Request) -> web.Response:
    tenant = _tenant(request)
    value = _flag(await read_object(request), "paused") if request.method == "POST" else None
    now = await limits.timers_paused(broker(request), tenant, value)
    return json_response({"tenant": tenant, "paused": now})


async def suspended(request: web.Request) -> web.Response:
    principal(request).require("admin")
    value = _flag(await read_object(request), "suspended") if request.method == "POST" else None
    now = await limits.cluster_suspended(broker(request), value)
    return json_response({"suspended": now})


async def kv_switch(request: web.Request) -> web.Response:
    principal(request).require("admin")
    value = _flag(await read_object(request), "enabled") if request.method == "POST" else None
    now = await limits.kv_enabled(broker(request), value)
    return json_response({"enabled": now})


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/v1/admin/tenants/{tenant}/plan", plan_get)
    r.add_put("/api/v1/admin/tenants/{tenant}/plan", plan_put)
    r.add_delete("/api/v1/admin/tenants/{tenant}/plan", plan_delete)
    r.add_get("/api/v1/admin/tenants/{tenant}/timers-paused", paused)
    r.add_post("/api/v1/admin/tenants/{tenant}/timers-paused", paused)
    r.add_get("/api/v1/admin/cluster/suspended", suspended)
    r.add_post("/api/v1/admin/cluster/suspended", suspended)
    r.add_get("/api/v1/admin/kv", kv_switch)
    r.add_post("/api/v1/admin/kv", kv_switch)
