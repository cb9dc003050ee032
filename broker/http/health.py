"""``GET /health``: 200 when this worker is booted and the database answers, 503 otherwise with a
stable ``reason`` (``booting`` or ``database_unavailable``) and the operator-facing cause in ``detail``."""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from broker import __version__
from broker.context import broker
from broker.http.wire import json_response
from broker.store.failures import DOWN_REASON, describe
from broker.store.pool import ping

PING_TIMEOUT_S = 2.0


async def health(request: web.Request) -> web.Response:
    b = broker(request)
    base = {"worker_id": b.worker_index, "pid": os.getpid(), "version": __version__}
    if not b.ready or b.pool is None:
        return json_response(
            {"status": "booting", "database": "unknown", "reason": "booting", "detail": b.boot_reason, **base},
            status=503,
            headers={"Retry-After": "1"},
        )
    try:
        async with asyncio.timeout(PING_TIMEOUT_S):
            await ping(b.pool)
    except Exception as exc:  # the database is down, or the pool cannot reach it in time
        return json_response(
            {"status": "unhealthy", "database": "unreachable", "reason": DOWN_REASON, "detail": describe(exc), **base},
            status=503,
            headers={"Retry-After": "1"},
        )
    return json_response(
        {"status": "healthy", "database": "connected", "draining": b.draining, "loops": b.loops.running(), **base}
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/api/v1/health", health)
