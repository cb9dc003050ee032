"""``/streams/v1/*``: the official client's streams SDK (docs/protocol.md §11). Parse and validate
(``broker.streams.parse``), call the domain (``broker.streams.service``), render. The boot flag and
authentication apply to this prefix exactly as to ``/api/``."""

from __future__ import annotations

from aiohttp import web

from broker import limits
from broker.context import broker, principal
from broker.http.wire import json_response, read_object
from broker.streams import parse, service


async def register(request: web.Request) -> web.Response:
    reg = parse.registration(await read_object(request))
    return json_response(await service.register(broker(request), principal(request), reg))


async def cycle(request: web.Request) -> web.Response:
    p = principal(request)
    b = broker(request)
    body = await read_object(request)
    plan = await limits.plan_for(b, p.tenant)
    return json_response(await service.cycle(b, b.services.log, p, parse.cycle(body, plan.max_payload_bytes)))


async def state_get(request: web.Request) -> web.Response:
    sq = parse.state_query(await read_object(request))
    return json_response(await service.state_get(broker(request), principal(request), sq))


def setup(app: web.Application) -> None:
    app.router.add_post("/streams/v1/queries", register)
    app.router.add_post("/streams/v1/cycle", cycle)
    app.router.add_post("/streams/v1/state/get", state_get)
