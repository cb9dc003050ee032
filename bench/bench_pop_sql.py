"""queen_pop's cost in the database, against a bare read of the same rows, in one run.

    .venv/bin/python bench/bench_pop_sql.py [--batches 1 10 100 1000] [--repeats 40] [--compare FILE] [--set-min N]
        [--messages N]

Starts an embedded PostgreSQL (or uses QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL, a server
DSN) and a fresh migrated database holding one partition of 1,000 messages (``--messages N``: N, e.g. the
few a sweep cycle fires, popped by a batch of 1,000 as a long-polling consumer does). Each sample is one
transaction, rolled back so every sample sees the same log: ``SELECT count(*) FROM queen_pop(...)`` of
the named partition (leased, and with autoAck), and the baseline, a bare ``SELECT count(*)`` of the same
rows' columns from queen_messages in offset order. It prints the median milliseconds per call and the
ratio to the baseline.

``--compare FILE`` loads another version of broker/sql/functions/log.sql (e.g. ``git show main:broker/sql/functions/log.sql
> /tmp/log_main.sql``) into a second database and alternates the two sample by sample, so both see the
same machine load. ``--set-min N`` sets queen_pop's smallest batch for its set path on this tree's side
(``queen.pop_set_min``, 0 = always). Numbers are printed; nothing is asserted. Not part of the test run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.db import new_migrated_db, run_on_a_server  # noqa: E402

TENANT = "default"
QM = "__QUEUE_MODE__"
MESSAGES = 1000
POP = "SELECT count(*) FROM queen_pop($1, 'q', 'p', $2, $3, 1, $4, NULL, NULL)"
BARE = ("SELECT count(*) FROM (SELECT m.seq, m.id, m.txn, m.trace_id, m.payload, m.codec, m.key_id, m.producer_sub, "
        "m.created_at, m.deadline_at FROM queen_messages m WHERE m.tenant = $1 AND m.partition_id = "
        "(SELECT p.id FROM queen_partitions p WHERE p.tenant = $1 AND p.queue = 'q' AND p.name = 'p') "
        "ORDER BY m.seq LIMIT $2) x")


async def prepare(server_dsn: str, functions: str | None, set_min: int | None, n: int) -> asyncpg.Connection:
    conn = await asyncpg.connect(await new_migrated_db(server_dsn, "bench_pop_sql"))
    if functions is not None:
        await conn.execute(functions)
    if set_min is not None:  # queen_pop's smallest batch for its set path (broker/sql/functions/log.sql)
        await conn.execute(f"SET queen.pop_set_min = {int(set_min)}")
    await conn.fetch("SELECT * FROM queen_push($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)", TENANT, ["q"] * n,
                     ["p"] * n, [uuid.uuid4() for _ in range(n)], [f"t{i}" for i in range(n)], [None] * n,
                     [b'{"order":42,"sku":"SKU-0042","qty":3}'] * n, [0] * n, [None] * n, [None] * n, [None] * n)
    return conn


async def rolled_back(conn: asyncpg.Connection, sql: str, *args: object) -> float:
    tr = conn.transaction()
    await tr.start()
    try:
        t = time.perf_counter()
        await conn.fetchval(sql, *args)
        return time.perf_counter() - t
    finally:
        await tr.rollback()


async def run(args: argparse.Namespace, server_dsn: str) -> None:
    sides = {"this tree": await prepare(server_dsn, None, args.set_min, args.messages)}
    if args.compare:
        sides["compared"] = await prepare(server_dsn, Path(args.compare).read_text(), None, args.messages)
    try:
        for batch in args.batches:
            shapes = {"bare read": (BARE, TENANT, batch), "pop leased": (POP, TENANT, QM, batch, False),
                      "pop autoAck": (POP, TENANT, QM, batch, True)}
            times: dict[tuple[str, str], list[float]] = {}
            for _ in range(5):  # warm the plans of every connection
                for conn in sides.values():
                    for sql, *a in shapes.values():
                        await rolled_back(conn, sql, *a)
            for _ in range(args.repeats):  # alternated sample by sample
                for side, conn in sides.items():
                    for shape, (sql, *a) in shapes.items():
                        times.setdefault((side, shape), []).append(await rolled_back(conn, sql, *a))
            for (side, shape), ts in times.items():
                med = statistics.median(ts) * 1000
                base = statistics.median(times[(side, "bare read")]) * 1000
                print(f"batch {batch:5d}  {side:10s} {shape:12s} {med:8.3f} ms  {med / base:6.2f}x bare", flush=True)
    finally:
        for conn in sides.values():
            await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100, 1000])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--compare", help="another log.sql to load into a second database and alternate with")
    ap.add_argument("--set-min", type=int, help="SET queen.pop_set_min on this tree's connection")
    ap.add_argument("--messages", type=int, default=MESSAGES, help="messages in the partition")
    args = ap.parse_args()
    run_on_a_server(lambda dsn: run(args, dsn), "bench_pop_sql")


if __name__ == "__main__":
    main()
