"""Retention of the message log (queen_log_prune in broker/sql/functions/log.sql, broker/log/retention.py):
retentionSeconds and completedRetentionSeconds delete only the head of each partition, in bounded
batches, one pruner per queue at a time; cursors below the new log start move up (or apply the floor
at their next advance), and the storage gauge sees the deletes."""

from __future__ import annotations

import json
import time
import uuid

import asyncpg
import httpx
import pytest
from conftest import run_sync, uniq
from helpers import sql_ack, sql_pop, sql_push

T = "ret-tenant"
# call_push / call_pop / call_ack drive the SQL functions queen_push / queen_pop / queen_ack directly
# (tests/helpers.py's sql_*, for this file's tenant: the pruner is judged below HTTP); tests/helpers.py's
# Api is the HTTP client for the route-level tests.


@pytest.fixture
def dsn(pg):
    """A fresh database of this test's own."""
    return pg.new_db()


@pytest.fixture
async def conn(dsn):
    c = await asyncpg.connect(dsn)
    yield c
    await c.close()


@pytest.fixture
async def other(dsn):
    """A second session on the same database (a concurrent pop or pruner)."""
    c = await asyncpg.connect(dsn)
    yield c
    await c.close()


async def configure(conn, queue, **options):
    await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING", T)
    await conn.execute("INSERT INTO queen_queues (tenant, name, options) VALUES ($1, $2, $3::jsonb)",
                       T, queue, json.dumps(options))


async def call_push(conn, queue, n, partition="p"):
    rows = await sql_push(conn, T, queue, [uuid.uuid4().hex for _ in range(n)], partition)
    return [r["seq"] for r in rows]


async def age(conn, queue, seqs, seconds, partition="p"):
    await conn.execute(
        "UPDATE queen_messages m SET created_at = now() - $4 * interval '1 second' FROM queen_partitions p "
        "WHERE p.tenant = $1 AND p.queue = $2 AND p.name = $5 AND m.tenant = p.tenant AND m.partition_id = p.id "
        "AND m.seq = ANY ($3::bigint[])", T, queue, seqs, seconds, partition)


async def seqs_left(conn, queue, partition="p"):
    rows = await conn.fetch(
        "SELECT m.seq FROM queen_messages m JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id "
        "WHERE p.tenant = $1 AND p.queue = $2 AND p.name = $3 ORDER BY m.seq", T, queue, partition)
    return [r["seq"] for r in rows]


async def prune(conn, limit=1000):
    return sum(r["deleted"] for r in await conn.fetch("SELECT * FROM queen_log_prune($1)", limit))


async def call_pop(conn, queue, group, batch=10, auto_ack=False):
    return await sql_pop(conn, T, queue, group=group, batch=batch, auto_ack=auto_ack)


async def call_ack(conn, msgs, group, lease=True):
    return await sql_ack(conn, T, msgs, group=group, lease=lease)


async def cursor(conn, queue, group):
    return await conn.fetchrow("SELECT acked_seq, lease_id, lease_end_seq FROM queen_cursors "
                               "WHERE tenant = $1 AND queue = $2 AND consumer_group = $3", T, queue, group)


async def storage(conn):
    return await conn.fetchval("SELECT coalesce(sum(storage_bytes), 0) FROM queen_usage_gauges WHERE tenant = $1", T)


async def test_retention_deletes_old_messages_consumed_or_not_and_gives_bytes_back(conn):
    await configure(conn, "q", retentionSeconds=60)
    await configure(conn, "keep")  # no option: never pruned
    await call_push(conn, "q", 10)
    await call_push(conn, "keep", 3)
    await age(conn, "q", list(range(1, 7)), 120)
    await age(conn, "keep", [1, 2, 3], 10_000)
    before = await storage(conn)
    assert await prune(conn) == 6
    assert await seqs_left(conn, "q") == [7, 8, 9, 10]
    assert await seqs_left(conn, "keep") == [1, 2, 3]
    assert before - await storage(conn) == 6 * len(b'{"x":1}')
    assert await prune(conn) == 0  # the young ones stay
    # A group that never read anything starts at the log start and its acks make a contiguous run.
    got = await call_pop(conn, "q", "g")
    assert [m["seq"] for m in got] == [7, 8, 9, 10]
    assert all(r["success"] for r in await call_ack(conn, got, "g"))
    c = await cursor(conn, "q", "g")
    assert c["acked_seq"] == 10 and c["lease_id"] is None
    counts = await conn.fetchrow(
        "SELECT sum(p.next_seq - 1 - coalesce(f.floor_seq, 0)) AS n FROM queen_partitions p "
        "LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id "
        "WHERE p.tenant = $1 AND p.queue = 'q'", T)
    assert counts["n"] == 4


async def test_only_the_head_of_a_partition_is_deleted(conn):
    await configure(conn, "q", retentionSeconds=60)
    await call_push(conn, "q", 6)
    await age(conn, "q", [1, 2, 4, 5], 120)  # 3 is young: it stops the run, so 4 and 5 stay too
    assert await prune(conn) == 2
    assert await seqs_left(conn, "q") == [3, 4, 5, 6]
    await age(conn, "q", [3], 120)
    assert await prune(conn) == 3
    assert await seqs_left(conn, "q") == [6]


async def test_completed_retention_waits_for_every_group(conn):
    await configure(conn, "q", completedRetentionSeconds=60)
    await call_push(conn, "q", 8)
    await age(conn, "q", list(range(1, 9)), 120)
    assert await prune(conn) == 0  # no group has consumed anything
    a = await call_pop(conn, "q", "a", batch=8)
    await call_ack(conn, a, "a")
    b = await call_pop(conn, "q", "b", batch=3)
    assert await prune(conn) == 0  # b holds 1..3 under a lease: not done
    await call_ack(conn, b, "b")
    assert await prune(conn) == 3  # done by a (1..8) and by b (1..3)
    assert await seqs_left(conn, "q") == [4, 5, 6, 7, 8]
    # a third group that joins now reads from the log start
    c = await call_pop(conn, "q", "c", batch=10, auto_ack=True)
    assert [m["seq"] for m in c] == [4, 5, 6, 7, 8]
    b2 = await call_pop(conn, "q", "b", batch=10, auto_ack=True)
    assert [m["seq"] for m in b2] == [4, 5, 6, 7, 8]
    assert await prune(conn) == 5
    await call_push(conn, "q", 2)  # young and unread: stays
    assert await prune(conn) == 0 and await seqs_left(conn, "q") == [9, 10]


async def test_a_lease_over_pruned_messages_still_acks_what_is_left(conn):
    await configure(conn, "q", retentionSeconds=60)
    await call_push(conn, "q", 5)
    got = await call_pop(conn, "q", "g", batch=5)
    await age(conn, "q", [1, 2, 3], 120)
    assert await prune(conn) == 3
    c = await cursor(conn, "q", "g")
    assert c["acked_seq"] == 3 and c["lease_id"] == got[0]["lease_id"]  # moved to the floor, lease kept
    res = await call_ack(conn, got, "g")
    assert [r["success"] for r in res] == [False, False, False, True, True]
    assert res[0]["error"] == "Message not found"
    c = await cursor(conn, "q", "g")
    assert c["acked_seq"] == 5 and c["lease_id"] is None


async def test_a_cursor_the_pruner_could_not_lock_applies_the_floor_at_its_next_advance(conn, other):
    await configure(conn, "q", retentionSeconds=60)
    await call_push(conn, "q", 4)
    await call_pop(conn, "q", "g", batch=1, auto_ack=True)  # cursor at 1
    await age(conn, "q", [1, 2, 3], 120)
    tr = other.transaction()
    await tr.start()
    await other.execute("SELECT 1 FROM queen_cursors WHERE tenant = $1 FOR UPDATE", T)  # a pop in flight
    assert await prune(conn) == 3
    assert (await cursor(conn, "q", "g"))["acked_seq"] == 1  # skipped, not waited for
    await tr.rollback()
    got = await call_pop(conn, "q", "g", batch=10)
    assert [m["seq"] for m in got] == [4]
    await call_ack(conn, got, "g")
    assert (await cursor(conn, "q", "g"))["acked_seq"] == 4


async def test_batches_are_bounded_and_one_pruner_per_queue(conn, other):
    await configure(conn, "q", retentionSeconds=60)
    for p in ("a", "b", "c"):
        await call_push(conn, "q", 10, partition=p)
        await age(conn, "q", list(range(1, 11)), 120, partition=p)
    assert await prune(conn, limit=15) == 15
    assert await prune(conn, limit=4) == 4
    tr = other.transaction()
    await tr.start()
    assert sum(r["deleted"] for r in await other.fetch("SELECT * FROM queen_log_prune(5)")) == 5
    assert await prune(conn, limit=100) == 0  # the queue is being pruned by the other session
    await tr.commit()
    assert await prune(conn, limit=100) == 6
    assert [await seqs_left(conn, "q", p) for p in ("a", "b", "c")] == [[], [], []]
    assert await prune(conn, limit=100) == 0


async def test_zero_means_keep_for_ever(conn):
    await configure(conn, "q", retentionSeconds=0, completedRetentionSeconds=0)
    await call_push(conn, "q", 3)
    await age(conn, "q", [1, 2, 3], 10**6)
    assert await prune(conn) == 0


@pytest.mark.timeout(60)
def test_the_retention_loop_prunes_a_configured_queue(start_broker):
    b = start_broker(env={"QUEEN_LOG_RETENTION_INTERVAL_MS": "100", "QUEEN_LOG_RETENTION_BATCH": "7"}, workers=2)
    q = uniq("ret")
    with httpx.Client(base_url=b.url, timeout=30) as c:
        r = c.post("/api/v1/configure", json={"queue": q, "options": {"retentionSeconds": 1}})
        assert r.status_code == 200, r.text
        items = [{"queue": q, "payload": {"i": i}} for i in range(20)]
        assert c.post("/api/v1/push", json={"items": items}).status_code == 201
        storage = c.get("/api/v1/usage").json()["storageBytes"]
        assert storage > 0

        def left():
            async def go():
                conn = await asyncpg.connect(b.dsn)
                try:
                    return await conn.fetchval(
                        "SELECT count(*) FROM queen_messages m JOIN queen_partitions p "
                        "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.queue = $1", q)
                finally:
                    await conn.close()
            return run_sync(go())

        deadline = time.monotonic() + 20
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left() == 0  # 20 messages, batches of 7: the loop went on until done
        assert c.get("/api/v1/usage").json()["storageBytes"] == 0
        assert c.get(f"/api/v1/pop/queue/{q}?wait=false").status_code == 204
        assert "queen_log_pruned_total" in c.get("/metrics").text
