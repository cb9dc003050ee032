"""The sweeper's take + fire of 1,000 due timers, against bare SQL doing the same read, insert and delete.

Ours: one ``broker.timers.sweeper.Sweeper.run_once()`` cycle, one transaction: the take statement
(``queen_timers_take``: tenant slices, partition locks, nothing written), packing in Python (JSON check,
sealing) and the fire statement (``queen_timers_fire``: delete the taken rows by ctid and message id,
``queen_push`` into the log), then the commit ("packed": rows written by SQL); "in-db": rows stored as
the broker's schedule stores JSON payloads (payload_ready), taken and fired by ``queen_timers_sweep`` in
one statement.
Baseline: bare SQL in one transaction: a DELETE .. RETURNING of the same due rows (SKIP LOCKED), then the
same ``queen_push`` with those rows in fire order: the floor with no fairness, no partition locks, no
packing and no second pass over the rows. Each round is
seeded (not timed) with 1,000 due rows spread over 8 partitions of one queue; each test has its own
database.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import asyncpg
import pytest

from broker.codec import Codec
from broker.store.queries import parse as parse_queries
from broker.timers.sweeper import Sweeper, SweeperConfig

N = 1000
ROUNDS = 12
SQL = parse_queries((Path(__file__).parent / "sql" / "sweep.sql").read_text())
_seq = itertools.count()


def _seed(loop: asyncio.AbstractEventLoop, conn: asyncpg.Connection, tenant: str, ready: bool = False) -> None:
    loop.run_until_complete(conn.execute(SQL["ensure_tenant"], tenant))
    loop.run_until_complete(conn.execute(SQL["seed_due"], tenant, "bench-sweep", f"r{next(_seq)}-", N, ready))


def test_fire_bare_sql_baseline(benchmark, bench_pg, loop):  # type: ignore[no-untyped-def]
    benchmark.group = f"claim + fire {N} due timers"
    benchmark.extra_info["role"] = "baseline"
    dsn = bench_pg.new_db()
    conn = loop.run_until_complete(asyncpg.connect(dsn))
    fired: list[int] = []
    try:
        async def bare() -> int:
            async with conn.transaction():
                rows = sorted(await conn.fetch(SQL["bare_take"], "acme", N),
                              key=lambda r: (r["queue"], r["partition"], r["deliver_at"], r["timer_key"]))
                return await conn.fetchval(
                    SQL["bare_push"], "acme", [r["queue"] for r in rows], [r["partition"] for r in rows],
                    [r["message_id"] for r in rows], [r["txn"] for r in rows], len(rows),
                    [r["payload"] for r in rows], [r["producer_sub"] for r in rows])

        def fire() -> None:
            fired.append(loop.run_until_complete(bare()))

        benchmark.pedantic(fire, setup=lambda: _seed(loop, conn, "acme"), rounds=ROUNDS, iterations=1)
        assert fired and all(n == N for n in fired)
    finally:
        loop.run_until_complete(conn.close())


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
def test_fire_sweeper_cycle(benchmark, bench_pg, loop, ready):  # type: ignore[no-untyped-def]
    benchmark.group = f"claim + fire {N} due timers"
    benchmark.extra_info["role"] = "ours"
    dsn = bench_pg.new_db()
    conn = loop.run_until_complete(asyncpg.connect(dsn))
    sweeper = Sweeper(dsn, SweeperConfig(batch=N), Codec(1024), name="bench")
    fired: list[int] = []
    try:
        def cycle() -> None:
            fired.append(loop.run_until_complete(sweeper.run_once()).fired)

        benchmark.pedantic(cycle, setup=lambda: _seed(loop, conn, "acme", ready), rounds=ROUNDS, iterations=1)
        assert fired and all(n == N for n in fired)
    finally:
        loop.run_until_complete(sweeper.stop())
        loop.run_until_complete(conn.close())
