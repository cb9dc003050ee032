"""queen_push's two paths (broker/sql/functions/log.sql): a batch for one partition takes
the fast path, a batch over several partitions the general one. Both must give the same rows for the
same input: per-partition gapless offsets in item order, duplicates (stored or earlier in the batch)
answered with the first message's id, queues/partitions created on first use and counted."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

T = "paths"


async def call(conn, items):
    n = len(items)
    rows = await conn.fetch(
        "SELECT * FROM queen_push($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)", T,
        [q for q, _, _ in items], [p for _, p, _ in items], [uuid.uuid4() for _ in range(n)], [t for _, _, t in items],
        [None] * n, [b"1"] * n, [0] * n, [None] * n, [None] * n, [None] * n)
    return [(r["idx"], r["status"], r["seq"], r["message_id"], r["partition_id"]) for r in rows]


def shape(rows):
    """What must not depend on the path: index, status, offset, and which rows share a message id."""
    first = {}
    return [(i, st, seq, first.setdefault(mid, i)) for i, st, seq, mid, _ in rows]


async def test_one_partition_and_mixed_batches_give_the_same_answers(pg):
    conn = await asyncpg.connect(pg.new_db())
    try:
        one = await call(conn, [("a", "p", "t1"), ("a", "p", "t2"), ("a", "p", "t1"), ("a", "p", "t3")])
        # the same logical batch through the general path: a second partition rides along
        mixed = await call(conn, [("b", "p", "t1"), ("b", "p", "t2"), ("b", "p", "t1"), ("b", "p", "t3"),
                                  ("b", "other", "z")])
        assert shape(one) == shape(mixed[:4])
        assert [r[1] for r in one] == ["queued", "queued", "duplicate", "queued"]
        assert [r[2] for r in one] == [1, 2, None, 3]
        assert one[2][3] == one[0][3]
        again = await call(conn, [("a", "p", "t3"), ("a", "p", "t4")])  # stored duplicate + a new one
        assert [(r[1], r[2]) for r in again] == [("duplicate", None), ("queued", 4)]
        assert again[0][3] == one[3][3] and again[0][4] == one[0][4]
        counts = dict(await conn.fetch("SELECT name, partition_count FROM queen_queues WHERE tenant = $1", T))
        assert counts == {"a": 1, "b": 2}
        await call(conn, [("a", "p2", "x")])
        assert await conn.fetchval("SELECT partition_count FROM queen_queues WHERE tenant = $1 AND name = 'a'", T) == 2
        assert await call(conn, []) == []
        all_dup = await call(conn, [("a", "p", "t1")])
        assert all_dup[0][1] == "duplicate"
        assert await conn.fetchval("SELECT next_seq FROM queen_partitions WHERE tenant = $1 AND queue = 'a' "
                                   "AND name = 'p'", T) == 5
    finally:
        await conn.close()


async def test_concurrent_one_partition_pushes_stay_gapless(pg):
    dsn = pg.new_db()
    conns = [await asyncpg.connect(dsn) for _ in range(4)]
    try:
        async def worker(c, k):
            for j in range(25):
                await call(c, [("q", "p", f"{k}-{j}-{i}") for i in range(3)])
        await asyncio.gather(*[worker(c, k) for k, c in enumerate(conns)])
        seqs = [r["seq"] for r in await conns[0].fetch("SELECT seq FROM queen_messages WHERE tenant = $1 ORDER BY seq", T)]
        assert seqs == list(range(1, 301))
    finally:
        for c in conns:
            await c.close()


async def pop(conn, queue):
    """One autoAck pop of up to 100 messages from one partition of ``queue`` (queue mode)."""
    return await conn.fetch("SELECT * FROM queen_pop($1, $2, NULL, '__QUEUE_MODE__', 100, 1, true, NULL, NULL)",
                            T, queue)


async def test_partitions_created_concurrently_are_all_counted_and_all_delivered(pg):
    """Two open transactions each create a new partition of one queue; the second one's count waits for
    the first's row lock. The queue must count both partitions, and a pop must reach both: queen_pop
    creates a group's cursors only while cursor_count < partition_count, so a count left one short (a
    recount from a stale snapshot) hid the newest partition from every consumer for good."""
    dsn = pg.new_db()
    a, b, reader = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        for path, items in (("fast", lambda p: [("q1", p, f"t-{p}")]),
                            ("general", lambda p: [("q2", p, f"t-{p}"), ("q2", p + "-x", f"u-{p}")])):
            queue = items("p")[0][0]
            await call(reader, items("p0"))  # the queue exists, with one partition (and a group's cursor)
            await pop(reader, queue)
            ta, tb = a.transaction(), b.transaction()
            await ta.start()
            await tb.start()
            await call(a, items("p1"))
            second = asyncio.ensure_future(call(b, items("p2")))  # blocks on the queue row
            await asyncio.sleep(0.3)
            assert not second.done(), path
            await ta.commit()
            await second
            await tb.commit()
            made = await reader.fetchval("SELECT count(*) FROM queen_partitions WHERE tenant = $1 AND queue = $2",
                                         T, queue)
            counted = await reader.fetchval("SELECT partition_count FROM queen_queues WHERE tenant = $1 AND name = $2",
                                            T, queue)
            assert counted == made, (path, counted, made)
            got: set[str] = set()
            for _ in range(2 * made):
                rows = await pop(reader, queue)
                got |= {r["partition"] for r in rows if r["kind"] == "msg"}
            expected = {r["name"] for r in await reader.fetch(
                "SELECT name FROM queen_partitions WHERE tenant = $1 AND queue = $2", T, queue)} - {"p0"}
            assert got == expected, (path, got, expected)
    finally:
        for c in (a, b, reader):
            await c.close()


MESSAGES_READ = "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables " \
                "WHERE relname = 'queen_messages'"


async def test_a_push_reads_only_its_own_items_whatever_the_partition_holds(pg):
    """A one-partition push (the fast path: a client batch, a timer fire into one partition) probes
    (tenant, partition, txn) per item: 10 items into a partition of 20,000 messages read a handful of
    rows, not the partition (its join once hashed the whole partition under the generic plan: 0.8 ms
    empty, 103 ms at 200k messages)."""
    conn = await asyncpg.connect(pg.new_db())
    try:
        for b in range(20):
            await call(conn, [("big", "p", f"s{b}-{i}") for i in range(1000)])
        items = [("big", "p", f"n{i}") for i in range(10)]
        for attempt in range(2):  # the second call runs on the plan the first one cached
            async with conn.transaction():
                before = await conn.fetchval(MESSAGES_READ) or 0
                rows = await call(conn, [(q, p, f"{t}-{attempt}") for q, p, t in items])
                read = (await conn.fetchval(MESSAGES_READ) or 0) - before
            assert {r[1] for r in rows} == {"queued"}
            assert read < 200, read
        dup = await call(conn, [("big", "p", "s3-7"), ("big", "p", "new")])  # stored duplicates still found
        assert [r[1] for r in dup] == ["duplicate", "queued"]
    finally:
        await conn.close()


TUPLES_READ = ("SELECT pg_stat_get_xact_tuples_fetched('queen_partitions'::regclass)"
               " + pg_stat_get_xact_tuples_returned('queen_partitions'::regclass)"
               " + pg_stat_get_xact_tuples_fetched('queen_queues'::regclass)"
               " + pg_stat_get_xact_tuples_returned('queen_queues'::regclass)")
# What the timer fire runs queen_push under (queen_timers_fire_ready's SET clauses).
FIRE_PLANNER = ("SET enable_seqscan = off", "SET enable_bitmapscan = off", "SET enable_hashjoin = off",
                "SET enable_mergejoin = off")


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
async def test_a_push_over_partitions_reads_only_its_own(pg, analyzed):
    """The general path looks up the batch's queues and partitions by key: joined on (queue, name), the
    planner read every partition of the tenant per statement, and under the fire's planner settings it
    compared every item with each of them (a 1,000-row timer fire into 2 partitions: 53 ms beside 16
    partitions of the tenant, 162 ms beside 96). Beside 4,000 partitions of 1,000 queues, a push of 200
    items over 4 partitions (new ones, then existing ones) scans none of the tenant's rows (the counters
    below count rows read by sequential and bitmap scans), under either planner, on a fresh connection's
    plans and on the plans it cached, with the tables never analyzed and analyzed. (The tables are
    analyzed here, not left to autovacuum: with 200 queues, a table of three pages, an analyzed
    queen_queues is rightly read whole, and whether autovacuum had got to it made this test flaky.)"""
    dsn = pg.new_db()
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute("INSERT INTO queen_tenants (tenant) VALUES ($1)", T)
        await setup.execute("INSERT INTO queen_queues (tenant, name, partition_count) "
                            "SELECT $1, 'q' || g, 4 FROM generate_series(1, 1000) g", T)
        await setup.execute("INSERT INTO queen_partitions (tenant, id, queue, name) SELECT $1, queen_partition_id(), "
                            "'q' || g, 'p' || h FROM generate_series(1, 1000) g, generate_series(1, 4) h", T)
        if analyzed:
            await setup.execute("ANALYZE queen_tenants, queen_queues, queen_partitions")
    finally:
        await setup.close()
    for planner in ((), FIRE_PLANNER):
        conn = await asyncpg.connect(dsn)
        try:
            for stmt in planner:
                await conn.execute(stmt)
            queue = f"wide-{len(planner)}"
            for rnd in range(3):  # the first creates the queue and its 4 partitions
                items = [(queue, f"p{i % 4}", f"r{rnd}-{i}") for i in range(200)]
                async with conn.transaction():
                    before = await conn.fetchval(TUPLES_READ)
                    rows = await call(conn, items)
                    read = await conn.fetchval(TUPLES_READ) - before
                assert [r[1] for r in rows] == ["queued"] * 200
                assert sorted(r[2] for r in rows) == sorted(list(range(50 * rnd + 1, 50 * rnd + 51)) * 4)
                assert read <= 260, (planner, rnd, read)
        finally:
            await conn.close()


MESSAGES_PROBED = "SELECT coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables WHERE relname = 'queen_messages'"


async def test_a_batch_of_new_items_is_written_without_looking_for_duplicates(pg):
    """Both paths first write a batch as if all of it were new: no probe of the log per item (the
    unique (tenant, partition_id, txn) index refuses a duplicate, and only then is the batch looked up
    item by item). A batch with a duplicate, stored or repeated in it, still gets the careful answer and
    leaves no trace of the first attempt: offsets stay gapless."""
    conn = await asyncpg.connect(pg.new_db())
    try:
        for name, part in (("fast", lambda i: "p"), ("general", lambda i: f"p{i % 3}")):
            q = f"opt-{name}"
            await call(conn, [(q, part(i), f"seed-{i}") for i in range(30)])  # queue and partitions exist
            async with conn.transaction():
                before = await conn.fetchval(MESSAGES_PROBED)
                rows = await call(conn, [(q, part(i), f"new-{i}") for i in range(30)])
                probed = await conn.fetchval(MESSAGES_PROBED) - before
            assert [r[1] for r in rows] == ["queued"] * 30
            assert probed == 0, (name, probed)
            async with conn.transaction():
                before = await conn.fetchval(MESSAGES_PROBED)
                rows = await call(conn, [(q, part(0), "seed-0"), (q, part(1), "again"), (q, part(1), "again"),
                                         (q, part(2), "fresh")])
                probed = await conn.fetchval(MESSAGES_PROBED) - before
            assert [r[1] for r in rows] == ["duplicate", "queued", "duplicate", "queued"], name
            assert rows[2][3] == rows[1][3]  # the repeat answers the first one's message id
            assert probed > 0  # (the counter sees the careful statement's probes)
            seqs = await conn.fetch("SELECT p.name, array_agg(m.seq ORDER BY m.seq) AS s FROM queen_messages m "
                                    "JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id "
                                    "WHERE m.tenant = $1 AND p.queue = $2 GROUP BY p.name", T, q)
            for r in seqs:
                assert r["s"] == list(range(1, len(r["s"]) + 1)), (name, r["name"], r["s"])
            nexts = await conn.fetch("SELECT name, next_seq FROM queen_partitions WHERE tenant = $1 AND queue = $2", T, q)
            counts = {r["name"]: len(r["s"]) for r in seqs}
            assert {r["name"]: r["next_seq"] - 1 for r in nexts} == counts, name
    finally:
        await conn.close()
