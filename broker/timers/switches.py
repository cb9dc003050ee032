"""Operator switches of the timer surface, kept in the database (``queen_timer_switches``) so a switch
holds for every worker and every broker on the database at once (routes: ``broker/http/admin_timers.py``).

Each call answers the switches document ``{"paused", "schedulingEnabled", "updatedAt"}``.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from broker.store.queries import Q
from broker.timers.status import iso_us


def _doc(row: asyncpg.Record | None) -> dict[str, Any]:
    assert row is not None  # the switches row always exists (the migration inserts it)
    return {
        "paused": row["sweeper_paused"],
        "schedulingEnabled": row["scheduling_enabled"],
        "updatedAt": iso_us(row["updated_at"]),
    }


async def get(pool: asyncpg.Pool) -> dict[str, Any]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(Q.timers_switches_get)
    return _doc(row)


async def set_sweeper_paused(pool: asyncpg.Pool, paused: bool) -> dict[str, Any]:
    """Pause or resume the fire cluster-wide; a resume wakes the sweepers now, not at their next tick."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            row = await conn.fetchrow(Q.timers_switch_sweeper, paused)
            if not paused:
                await conn.execute(Q.timers_wake, "0")
    return _doc(row)


async def set_scheduling(pool: asyncpg.Pool, enabled: bool) -> dict[str, Any]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(Q.timers_switch_scheduling, enabled)
    return _doc(row)
