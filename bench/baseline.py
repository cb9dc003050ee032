"""Bare-SQL baselines of the timer path, measured on the same server as the broker in the same run: what
the database itself does without a sweeper, HTTP or JSON (bench/bench_timers.py prints every row as a
ratio to one of these; ``queen loadtest capacity`` prints its held rate against ``bare_fire_rate``).
Bench-only SQL: the broker never runs it."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg

# Seeded rows carry payload_ready as POST /api/v1/timers would store these small JSON payloads
# (broker.timers.service.log_ready), so they fire as scheduled timers do; --seed-unready stores false
# (rows the sweeper must pack in Python: written by SQL, zstd, or above the compression threshold).
SEED = """
INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub,
                          deliver_at, due_at, payload_ready)
SELECT $1, $2, $3 || g, 'p' || (g % 16), $3 || g, gen_random_uuid(), convert_to('{"n": ' || g || '}', 'UTF8'),
       'bench', $4::timestamptz, $4::timestamptz, $6::boolean
FROM generate_series(1, $5::integer) AS g
"""
ENSURE_TENANT = "INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING"

# The bare-SQL bound of a fire: one statement per 1,000 rows that locks the earliest due rows, deletes
# them and pushes them into the log, on one connection (no fairness, no partition exclusivity, no pack).
RAW_FIRE = """
WITH due AS (SELECT ctid AS tid FROM queen_timers WHERE tenant = $1 AND due_at <= now()
             ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM queen_timers t WHERE t.ctid = ANY (ARRAY(SELECT tid FROM due)) RETURNING t.*),
agg AS (SELECT array_agg(queue COLLATE "default" ORDER BY queue, partition, deliver_at) qs,
               array_agg(partition COLLATE "default" ORDER BY queue, partition, deliver_at) ps,
               array_agg(message_id ORDER BY queue, partition, deliver_at) ids,
               array_agg(txn COLLATE "default" ORDER BY queue, partition, deliver_at) txns,
               array_agg(payload ORDER BY queue, partition, deliver_at) pls, count(*)::int n FROM gone)
SELECT count(*) FROM agg, LATERAL queen_push($1, qs, ps, ids, txns, array_fill(NULL::uuid, ARRAY[n]), pls,
       array_fill(0::smallint, ARRAY[n]), array_fill(NULL::text, ARRAY[n]), array_fill('bench'::text, ARRAY[n]),
       array_fill(NULL::bigint, ARRAY[n])) WHERE n > 0
"""
async def bare_fire_rate(dsn: str, n: int, batch: int = 1000) -> float:
    """Timers/s of the bare-SQL bound of a fire: ``n`` due rows (seeded, vacuumed, analyzed) moved into the
    log ``batch`` a statement (RAW_FIRE) on one connection."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(ENSURE_TENANT, "raw")
        at = await conn.fetchval("SELECT now() - interval '1 s'")
        await conn.execute(SEED, "raw", "burst", "r", at, n, True)
        await conn.execute("VACUUM ANALYZE queen_timers")
        t0 = time.perf_counter()
        done = 0
        while done < n:
            got = await conn.fetchval(RAW_FIRE, "raw", batch) or 0
            if not got:
                break
            done += got
        return done / (time.perf_counter() - t0)
    finally:
        await conn.close()


BARE_BURST_READ = """
SELECT m.payload FROM queen_messages m JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id
WHERE m.tenant = $1 AND p.queue = $2
"""


async def bare_burst_chain(dsn: str, n: int) -> float:
    """The bare-SQL floor under a burst's lag at the consumer: ``n`` rows already due (seeded, vacuumed),
    one connection fires them all (RAW_FIRE: lock, delete, queen_push) and NOTIFYs in one transaction; a
    second connection, LISTENing, is woken and reads the ``n`` messages. Seconds from sending the fire
    to having every row at the listener: no sweeper, no HTTP, no JSON."""
    a, b = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    got: asyncio.Queue[str] = asyncio.Queue()
    q = f"bare-burst-{uuid.uuid4().hex[:6]}"
    try:
        await a.execute(ENSURE_TENANT, "raw-burst")
        at = await a.fetchval("SELECT now() - interval '1 s'")
        await a.execute(SEED, "raw-burst", q, "r", at, n, True)
        await a.execute("VACUUM ANALYZE queen_timers")
        await b.add_listener("bench_bare_burst", lambda _c, _p, _ch, payload: got.put_nowait(payload))
        t0 = time.perf_counter()
        async with a.transaction():
            fired = await a.fetchval(RAW_FIRE, "raw-burst", n)
            await a.execute("NOTIFY bench_bare_burst")
        await got.get()
        rows = await b.fetch(BARE_BURST_READ, "raw-burst", q)
        took = time.perf_counter() - t0
        assert fired == n and len(rows) == n, (fired, len(rows))
        return took
    finally:
        await a.close()
        await b.close()
