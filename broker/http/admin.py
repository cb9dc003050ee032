"""Small identity and admin routes.

- ``GET /api/v1/whoami``: any authenticated principal; what the broker made of its credential:
  ``{"tenant", "sub", "grants"}`` (only the grants it recognises, sorted).
- ``GET /api/v1/admin/ping``: the ``admin`` grant; the cheapest way to check an admin token.
  ``POST /api/v1/admin/ping`` with an optional JSON object body answers it back under ``"echo"`` (it
  goes through the same body parsing as every other route: content type, size limit, envelope).
- ``GET /api/v1/test/sleep?ms=N``: a request that takes N ms (at most 60 000) to complete, for drain
  tests: status and headers at once, the JSON body after the sleep. Refused with 403 ``test_hooks_disabled`` unless ``QUEEN_TEST_HOOKS=1``.

Other surfaces add their own admin routes in their own modules.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from broker.context import broker, principal
from broker.errors import Forbidden
from broker.http.wire import json_response, q_int, read_object

MAX_SLEEP_MS = 60_000


async def whoami(request: web.Request) -> web.Response:
    p = principal(request)
    return json_response({"tenant": p.tenant, "sub": p.sub, "grants": sorted(p.grants)})


async def admin_ping(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("admin")
    body: dict[str, object] = {"ok": True, "tenant": p.tenant, "sub": p.sub}
    if request.method == "POST":
        body["echo"] = await read_object(request, allow_empty=True)
    return json_response(body)


async def sleep_hook(request: web.Request) -> web.StreamResponse:
    if not broker(request).settings.test_hooks:
        raise Forbidden("test_hooks_disabled", "test hooks are off; start the broker with QUEEN_TEST_HOOKS=1")
    ms = q_int(request, "ms", 1_000, lo=0, hi=MAX_SLEEP_MS)
    # The status line and headers go out first, so a test knows the request is in flight in a worker
    # (not waiting in the accept queue) before it, say, sends SIGTERM; the body follows after the sleep.
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await asyncio.sleep(ms / 1000)
    await resp.write(orjson.dumps({"slept_ms": ms, "worker_id": broker(request).worker_index}))
    await resp.write_eof()
    return resp


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/whoami", whoami)
    app.router.add_get("/api/v1/admin/ping", admin_ping)
    app.router.add_post("/api/v1/admin/ping", admin_ping)
    app.router.add_get("/api/v1/test/sleep", sleep_hook)
