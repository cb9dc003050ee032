"""``POST /api/v1/transaction``: see ``broker.log.transaction`` for the bundle's semantics."""

from __future__ import annotations

from aiohttp import web

from broker import limits
from broker.context import broker, principal
from broker.http import binary
from broker.http.wire import json_response, read_object
from broker.log import transaction


async def run(request: web.Request) -> web.Response:
    p = principal(request)
    b = broker(request)
    if binary.is_binary(request):  # QTB1 (docs/protocol.md §1.10): the head's operations, then the pushes
        raw = await request.read()
        plan = await limits.plan_for(b, p.tenant)
        tx = binary.decode_transaction(raw, max_payload=plan.max_payload_bytes)
        bundle = transaction.parse_bundle(tx.head, p, b, plan.max_payload_bytes)
        transaction.add_pushes(bundle, tx.items, p)
        answer = await transaction.run(b, b.services.log, p, bundle)
        return json_response(binary.transaction_counts(answer) if tx.counts else answer)
    body = await read_object(request)
    plan = await limits.plan_for(b, p.tenant)
    bundle = transaction.parse_bundle(body, p, b, plan.max_payload_bytes)
    return json_response(await transaction.run(b, b.services.log, p, bundle))


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/transaction", run)
