"""The locks route (docs/protocol.md §5). Parse + validate, call ``broker.locks``, render.

``POST /api/v1/locks`` ``{"operations": [...]}`` -> 200 ``{"results": [...]}``, exactly one result per op,
index-aligned, every op in one database round trip. Verdicts are fields, never statuses: a lock held by
somebody else is a 200 with ``acquired: false``. At most 64 ops, each lock named once; no query string
(400 ``locks_no_query_string``). Grants, switch and rungs: ``broker.locks.service``.
"""

from __future__ import annotations

from aiohttp import web

from broker.context import broker, principal
from broker.http.wire import json_response, read_json
from broker.locks import service
from broker.locks.parse import CODE, bad, parse_body


async def post_locks(request: web.Request) -> web.Response:
    if request.query_string:
        raise bad("locks_no_query_string", "POST /api/v1/locks takes no query string; everything goes in the body")
    call = parse_body(await read_json(request, code=CODE))
    results = await service.run(broker(request), principal(request), call)
    return json_response({"results": results})


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/locks", post_locks)
