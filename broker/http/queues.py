"""Queue resources: ``POST /api/v1/configure`` and ``GET/DELETE /api/v1/resources/queues[/:queue]``."""

from __future__ import annotations

from aiohttp import web

from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, q_int, read_object
from broker.log import catalog, parse
from broker.log.service import LogService

CONFIGURE_KEYS = frozenset({"queue", "namespace", "task", "options"})


def _svc(request: web.Request) -> LogService:
    return broker(request).services.log


async def configure(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("produce")
    body = await read_object(request)
    for key in body:
        if key not in CONFIGURE_KEYS:
            raise BadRequest("unknown_field", f"{key!r} is not a configure field", extra={"field": key})
    queue = parse.name(body.get("queue"), "queue")
    namespace = parse.opt_str(body.get("namespace"), "namespace")
    task = parse.opt_str(body.get("task"), "task")
    opts = parse.queue_options(body.get("options"))
    b = broker(request)
    if opts.encryption_enabled and not b.keyring:
        raise BadRequest(
            "encryption_unavailable", "encryptionEnabled needs QUEEN_ENCRYPTION_KEYS on the broker", code="bad_request"
        )
    out = await catalog.configure(b, p.tenant, queue, namespace, task, opts)
    _svc(request).forget(p.tenant, queue)
    return json_response(out)


async def list_queues(request: web.Request) -> web.Response:
    p = principal(request)
    ns = parse.opt_str(request.query.get("namespace"), "namespace")
    task = parse.opt_str(request.query.get("task"), "task")
    limit = q_int(request, "limit", 1000, lo=1, hi=10_000, clamp=True)
    return json_response(await catalog.list_queues(broker(request), p.tenant, ns, task, limit))


async def get_queue(request: web.Request) -> web.Response:
    p = principal(request)
    queue = parse.name(request.match_info["queue"], "queue")
    limit = q_int(request, "partitionLimit", 1000, lo=1, hi=100_000, clamp=True)
    return json_response(await catalog.get_queue(broker(request), p.tenant, queue, limit))


async def delete_queue(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("admin")
    queue = parse.name(request.match_info["queue"], "queue")
    out = await catalog.delete_queue(broker(request), p.tenant, queue)
    _svc(request).forget(p.tenant, queue)
    return json_response(out)


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/configure", configure)
    app.router.add_get("/api/v1/resources/queues", list_queues)
    app.router.add_get("/api/v1/resources/queues/{queue:[^/]+}", get_queue)
    app.router.add_delete("/api/v1/resources/queues/{queue:[^/]+}", delete_queue)
