"""``GET /health``: 200 when this worker is booted and the database answers as a writable primary, 503
otherwise with a stable ``reason`` (``booting``, ``database_unavailable`` or ``database_read_only``) and the
operator-facing cause in ``detail``. ``server`` and ``role`` say which PostgreSQL the pool reached and
what it is (``primary`` or ``standby``): behind a failover manager, the node this worker sees."""

from __future__ import annotations

import asyncio
import os

import asyncpg
from aiohttp import web

from broker import __version__
from broker.context import broker
from broker.http.wire import json_response
from broker.store.failures import DOWN_REASON, describe
from broker.store.pool import drop_stale, dsn_hosts, ping

PING_TIMEOUT_S = 2.0
READ_ONLY_REASON = "database_read_only"
WAITING_FOR_PRIMARY = "waiting for a writable primary"


async def health(request: web.Request) -> web.Response:
    b = broker(request)
    base = {"worker_id": b.worker_index, "pid": os.getpid(), "version": __version__}
    if not b.ready or b.pool is None:
        seen: dict[str, object] = {"database": "unknown"}
        if b.boot_reason.startswith(WAITING_FOR_PRIMARY):  # broker.app._boot: only standbys answered
            seen = {"database": "read_only", "server": dsn_hosts(b.dsn), "role": "standby", "writable": False}
        return json_response(
            {"status": "booting", **seen, "reason": "booting", "detail": b.boot_reason, **base},
            status=503,
            headers={"Retry-After": "1"},
        )
    try:
        async with asyncio.timeout(PING_TIMEOUT_S):
            seen = await ping(b.pool)
    except asyncpg.TargetServerAttributeNotMatched as exc:  # every host the DSN names is read-only
        return json_response(
            {"status": "unhealthy", "database": "read_only", "reason": READ_ONLY_REASON, "server": dsn_hosts(b.dsn),
             "role": "standby", "writable": False, "detail": f"no writable server among {dsn_hosts(b.dsn)}: {describe(exc)}",
             **base},
            status=503,
            headers={"Retry-After": "1"},
        )
    except Exception as exc:  # the database is down, or the pool cannot reach it in time
        return json_response(
            {"status": "unhealthy", "database": "unreachable", "reason": DOWN_REASON, "detail": describe(exc), **base},
            status=503,
            headers={"Retry-After": "1"},
        )
    if not seen["writable"]:
        drop_stale()  # the next connect asks for a writable server again
        return json_response(
            {"status": "unhealthy", "database": "read_only", "reason": READ_ONLY_REASON, **seen,
             "detail": f"the database server {seen['server'] or dsn_hosts(b.dsn)} is a {seen['role']} and cannot write", **base},
            status=503,
            headers={"Retry-After": "1"},
        )
    return json_response(
        {"status": "healthy", "database": "connected", **seen, "draining": b.draining, "loops": b.loops.running(), **base}
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/api/v1/health", health)
