"""The timers-vacuum loop (broker/timers/vacuum.py): from QUEEN_TIMERS_VACUUM_DEAD_ROWS dead rows in
queen_timers one worker vacuums it, one at a time across workers, and below that nothing runs; the
vacuum removes the dead front of the due indexes that every claim walks."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import httpx
import pytest
from helpers import Api, db_fetch, timer_op, wait_for

from broker.config import Settings
from broker.store import lock_keys
from broker.store.pool import connect, create_pool
from broker.timers import vacuum

SEED = """
INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub, deliver_at, due_at)
SELECT 'vac', 'q', 'k' || g, 'Default', 'x' || g, gen_random_uuid(), '{}'::bytea, 's', now() - interval '1 second',
       now() - interval '1 second'
FROM generate_series(1, $1::integer) AS g
"""
COUNTS = """
SELECT coalesce(vacuum_count, 0) AS vacuums, coalesce(n_dead_tup, 0) AS dead
FROM pg_stat_user_tables WHERE relname = 'queen_timers'
"""


@pytest.fixture
async def vac_db(pg):
    """A fresh database whose queen_timers only the loop vacuums, with tenant 'vac': its DSN and a connection."""
    dsn = pg.new_db()
    conn = await connect(dsn)
    await conn.execute("ALTER TABLE queen_timers SET (autovacuum_enabled = false)")  # only the loop vacuums
    await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ('vac') ON CONFLICT DO NOTHING")
    yield dsn, conn
    await conn.close()


@pytest.fixture
async def db(vac_db):
    dsn, conn = vac_db
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
    yield conn, pool
    await pool.close()


async def fired(conn: asyncpg.Connection, n: int) -> None:
    """``n`` timers gone as a fire leaves them (deleted rows), reported to the statistics at once."""
    await conn.execute(SEED, n)
    async with conn.transaction():
        await conn.execute("DELETE FROM queen_timers WHERE tenant = 'vac'")
        await conn.execute("SELECT pg_stat_force_next_flush()")
    for _ in range(50):
        if (await conn.fetchrow(COUNTS))["dead"] >= n:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the deletes never reached the statistics")


async def test_below_the_threshold_nothing_is_vacuumed(db):
    conn, pool = db
    await fired(conn, 500)
    assert await vacuum.vacuum_once(pool, 1_000) is False
    assert (await conn.fetchrow(COUNTS))["vacuums"] == 0


async def test_from_the_threshold_the_dead_front_is_vacuumed(db):
    conn, pool = db
    await fired(conn, 5_000)
    probe = "SELECT due_at FROM queen_timers WHERE tenant = 'vac' AND due_at <= now() ORDER BY due_at LIMIT 1"
    assert await vacuum.vacuum_once(pool, 1_000) is True
    after = await conn.fetchrow(COUNTS)
    assert after["vacuums"] == 1 and after["dead"] == 0, dict(after)
    # The due index's entries of the deleted rows are gone: a walk from its start reads one leaf.
    async with conn.transaction():
        before = await conn.fetchval("SELECT pg_stat_get_xact_blocks_fetched('queen_timers_due'::regclass)")
        assert await conn.fetchval(probe) is None
        read = await conn.fetchval("SELECT pg_stat_get_xact_blocks_fetched('queen_timers_due'::regclass)") - before
    assert read <= 4, read  # metapage, root, leaf (5,000 dead entries fill ~13 leaves)


async def test_one_vacuum_at_a_time_across_workers(db):
    conn, pool = db
    await fired(conn, 2_000)
    async with pool.acquire() as holder:  # another worker inside its vacuum holds the lock
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1, 1)", lock_keys.TIMERS_VACUUM)
        assert await vacuum.vacuum_once(pool, 1_000) is False
        await holder.fetchval("SELECT pg_advisory_unlock($1, 1)", lock_keys.TIMERS_VACUUM)
    assert (await conn.fetchrow(COUNTS))["vacuums"] == 0
    assert await vacuum.vacuum_once(pool, 1_000) is True


async def test_the_vacuum_is_throttled_and_leaves_its_connection_as_it_found_it(vac_db):
    """QUEEN_TIMERS_VACUUM_COST_DELAY_MS: the VACUUM pauses that long per vacuum_cost_limit of work (vacuuming
    5,000 deleted rows dirties well over 200 cost units of pages: at 100 ms per pause it cannot finish
    in under 0.2 s), and the connection goes back to the broker's pool, which resets nothing on release,
    with the server's own setting and without the loop's lock."""
    dsn, conn = vac_db
    pool = await create_pool(Settings(), dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as c:
            default = await c.fetchval("SHOW vacuum_cost_delay")
        await fired(conn, 5_000)
        t0 = time.perf_counter()
        assert await vacuum.vacuum_once(pool, 1_000, 100) is True
        assert time.perf_counter() - t0 >= 0.2
        assert (await conn.fetchrow(COUNTS))["vacuums"] == 1
        async with pool.acquire() as c:
            assert await c.fetchval("SHOW vacuum_cost_delay") == default
            assert await c.fetchval("SELECT pg_try_advisory_lock($1, 1)", lock_keys.TIMERS_VACUUM)  # the loop's lock released
    finally:
        await pool.close()


def test_a_broker_vacuums_what_its_sweeper_fired(start_broker):
    """End to end: timers fired by the sweeper are dead rows, and the worker's loop vacuums them (with
    autovacuum off on the table, only the loop can); a broker with the threshold 0 runs no such loop."""
    b = start_broker(env={"QUEEN_TIMERS_VACUUM_DEAD_ROWS": "300", "QUEEN_TIMERS_VACUUM_INTERVAL_MS": "200"}, workers=1)
    db_fetch(b.dsn, "ALTER TABLE queen_timers SET (autovacuum_enabled = false)")
    with Api(httpx.Client(base_url=b.url, timeout=30)) as a:
        assert "timers-vacuum" in a.get("/health").json()["loops"]
        for part in range(2):  # at most 256 operations per call
            a.timer_results(*[timer_op("vacq", f"k{part}-{i}", delay=0) for i in range(250)])
        wait_for(lambda: not db_fetch(b.dsn, "SELECT 1 FROM queen_timers LIMIT 1"), 30, "the fire")
        wait_for(lambda: db_fetch(b.dsn, COUNTS)[0]["vacuums"] >= 1, 30, "a vacuum by the loop")
    off = start_broker(env={"QUEEN_TIMERS_VACUUM_DEAD_ROWS": "0"}, workers=1)
    assert "timers-vacuum" not in httpx.get(off.url + "/health", timeout=30).json()["loops"]
