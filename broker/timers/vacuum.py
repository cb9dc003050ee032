"""The ``timers-vacuum`` loop: keeps the dead rows in front of every claim few, whatever the server's
autovacuum settings.

A fired timer is a deleted row. Its entries stay at the front of the due indexes, which every take
walks from the start, until a vacuum removes them (broker/sql/migrations/0022_timers_vacuum.sql has the
measurements). The migration asks autovacuum to come at 5,000 dead rows, but autovacuum looks at a
database only every ``autovacuum_naptime`` (a minute by default: 60,000 dead rows at 1,000 fired/s) and
an operator may have tuned it otherwise. So every ``QUEEN_TIMERS_VACUUM_INTERVAL_MS`` each worker reads
the dead-row count of queen_timers from the statistics system; from ``QUEEN_TIMERS_VACUUM_DEAD_ROWS``
on, the worker that gets the cluster-wide lock (a tried advisory lock: one vacuum at a time, the others
skip) runs ``VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) queen_timers``, throttled as autovacuum is
(``QUEEN_TIMERS_VACUUM_COST_DELAY_MS``, 2 ms per ``vacuum_cost_limit`` of work). A pass reads every index of
the table whole, so its cost grows with the pending volume (10,000,000 timers: ~800 MB, 0.37 s at full
speed); unthrottled it took a core whole while it ran, and the sweepers and consumers waited for the
other one: a steady 1,000/s beside 10,000,000 pending lagged p99 11.6 ms at the consumer unthrottled,
6.8 ms throttled (medians of 3 alternated rounds; p50 1.9 and 2.0 ms). No ANALYZE: no plan of the broker
depends on column statistics. A vacuum takes no lock that a claim, a schedule or a fire waits for.
A role that does not own the table gets a warning from PostgreSQL and nothing is vacuumed (autovacuum
still is); ``QUEEN_TIMERS_VACUUM_DEAD_ROWS=0`` leaves it all to autovacuum.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from broker.config import Settings
from broker.metrics import TIMERS_VACUUMS
from broker.store.queries import Q

log = logging.getLogger("queen.timers.vacuum")


async def vacuum_once(pool: asyncpg.Pool, dead_rows: int, cost_delay_ms: int = 0) -> bool:
    """Vacuum queen_timers if it has at least ``dead_rows`` dead rows and no other worker is vacuuming
    it, pausing ``cost_delay_ms`` per ``vacuum_cost_limit`` of work; True when this call ran the VACUUM."""
    async with pool.acquire() as conn:
        dead = await conn.fetchval(Q.timers_dead_rows)
        if dead < dead_rows:
            return False
        if not await conn.fetchval(Q.timers_vacuum_lock):
            return False
        try:
            await conn.fetchval(Q.timers_vacuum_throttle, cost_delay_ms)
            await conn.execute(Q.timers_vacuum)
        finally:
            # The lock first: a session lock left on a pooled connection would stop every later vacuum.
            await conn.fetchval(Q.timers_vacuum_unlock)
            await conn.execute(Q.timers_vacuum_unthrottle)
    TIMERS_VACUUMS.inc()
    log.debug("vacuumed queen_timers at %d dead rows", dead)
    return True


async def run(pool: Callable[[], asyncpg.Pool], s: Settings) -> None:
    """The ``timers-vacuum`` loop body (started by ``broker.services`` unless the threshold is 0)."""
    while True:
        await asyncio.sleep(s.timers_vacuum_interval_ms / 1000)
        await vacuum_once(pool(), s.timers_vacuum_dead_rows, s.timers_vacuum_cost_delay_ms)
