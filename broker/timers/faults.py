"""Fault injection for the sweeper (the test hooks, ``broker/http/test_hooks.py``): state lives in the
database, so whichever worker (or broker) runs the fire honours it. Everything is scoped to a tenant.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from broker.store.queries import Q
from broker.timers.status import iso_us


async def fail(pool: asyncpg.Pool, tenant: str, queue: str, klass: str, count: int, ms: int) -> dict[str, Any]:
    """The next ``count`` fires of ``queue`` fail with ``klass`` (or stall ``ms``); count 0 clears."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(Q.timers_fault_set, tenant, queue, klass, count, ms)
    assert row is not None  # an upsert ... RETURNING: always one row
    return {"queue": queue, "class": row["failure_class"], "remaining": row["remaining"], "ms": row["stall_ms"]}


async def hold(pool: asyncpg.Pool, tenant: str, queue: str, key: str, ms: int) -> dict[str, Any]:
    """Lease one timer for ``ms`` without firing it (the token is held by nobody)."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(Q.timers_hold, tenant, queue, key, ms)
    return {"held": row is not None, "claimedUntil": iso_us(row["claimed_until"]) if row else None}


async def release(pool: asyncpg.Pool, tenant: str, queue: str | None, key: str | None) -> dict[str, Any]:
    """Release every live lease of the tenant (or of queue, or of queue/key), clear injected faults (of
    queue) and wake the sweepers."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            released = await conn.execute(Q.timers_release_hook_leases, tenant, queue, key)
            cleared = await conn.execute(Q.timers_faults_clear, tenant, queue)
            await conn.execute(Q.timers_wake, "0")
    return {"released": int(released.split()[-1]), "faultsCleared": int(cleared.split()[-1])}
