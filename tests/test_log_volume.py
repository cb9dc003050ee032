"""The log's per-call cost must not grow with the queue (broker/sql/functions/log.sql): a pop of one named
partition and a one-item ack touch that partition's rows, not every partition or cursor of the queue,
whatever the planner knows (fresh tables, never analyzed, generic plans). And queen_ack's one-item
fast path gives the same outcome as its general path around out-of-order acks and failures, as queen_pop's
set path does its per-message loop around dead letters, held messages and out-of-order acks."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from helpers import QUEUE_MODE as QM
from helpers import sql_ack, sql_pop, sql_push

T = "vol"

# Rows fetched or scanned on the log's consumer-side tables inside the current transaction.
TOUCHED = ("SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0) "
           "FROM pg_stat_xact_user_tables WHERE relname IN ('queen_cursors', 'queen_partitions')")

PARTITIONS_READ = ("SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables "
                   "WHERE relname = 'queen_partitions'")


async def push(conn, queue, partition, txns):
    await sql_push(conn, T, queue, txns, partition, payload=b"1")


async def pop(conn, queue, partition=None, batch=1, auto_ack=False):
    return await sql_pop(conn, T, queue, partition=partition, batch=batch, auto_ack=auto_ack)


async def ack(conn, msgs, status="completed"):
    return [r["success"] for r in await sql_ack(conn, T, msgs, status=status)]


async def cursor(conn, pid):
    return await conn.fetchrow("SELECT acked_seq, lease_id FROM queen_cursors WHERE tenant = $1 AND partition_id = $2 "
                               "AND consumer_group = $3", T, pid, QM)


async def test_named_partition_pop_and_one_item_ack_read_only_their_partition(pg):
    conn = await asyncpg.connect(pg.new_db())
    try:
        for i in range(600):  # 600 partitions with a message each, and a cursor each for the group
            await push(conn, "wide", f"w{i}", [f"w{i}"])
        await push(conn, "wide", "mine", [f"m{i}" for i in range(10)])
        assert len(await pop(conn, "wide", auto_ack=True)) == 1  # the group's cursors for every partition
        for attempt in range(8):  # the later calls run on the plans the first ones cached
            async with conn.transaction():
                before = await conn.fetchval(TOUCHED)
                got = await pop(conn, "wide", "mine")
                popped = await conn.fetchval(TOUCHED) - before
                assert [m["txn"] for m in got] == [f"m{attempt}"]
                assert await ack(conn, got) == [True]
                acked = await conn.fetchval(TOUCHED) - before - popped
            assert popped < 30 and acked < 30, (attempt, popped, acked)
        c = await cursor(conn, got[0]["partition_id"])
        assert c["acked_seq"] == 8 and c["lease_id"] is None
        # a partition that does not exist (yet): nothing, and nothing to wait for
        rows = await conn.fetch("SELECT kind, seq FROM queen_pop($1, 'wide', 'nope', $2, 1, 1, false, NULL, NULL)", T, QM)
        assert [tuple(r) for r in rows] == [("idle", None)]
        # a named partition that is leased: the answer says when the lease ends
        await push(conn, "wide", "mine", ["late"])
        held = await pop(conn, "wide", "mine")
        rows = await conn.fetch("SELECT kind, seq FROM queen_pop($1, 'wide', 'mine', $2, 1, 1, false, NULL, NULL)", T, QM)
        assert len(held) == 1 and len(rows) == 1 and rows[0]["kind"] == "idle" and rows[0]["seq"] > 1000
    finally:
        await conn.close()


async def analyzed_small(pg) -> str:
    """A database whose log tables HAVE statistics, of small tables: queue "walk" of 100 partitions, every
    cursor made and claimed once, beside another tenant's 300 partitions, analyzed. Its DSN: connect
    afresh, so the plans are built on those statistics."""
    dsn = pg.new_db()
    setup = await asyncpg.connect(dsn)
    try:
        for i in range(300):
            await sql_push(setup, "other", "elsewhere", [f"o{i}"], f"o{i}", payload=b"1")
        for i in range(100):
            await push(setup, "walk", f"w{i}", [f"w{i}"])
        while await pop(setup, "walk", batch=100, auto_ack=True):
            pass
        await setup.execute("ANALYZE queen_partitions; ANALYZE queen_cursors")
    finally:
        await setup.close()
    return dsn


async def test_after_an_analyze_an_ack_probes_only_its_items_partitions(pg):
    """The same bound on queen_partitions for queen_ack's item query once the tables HAVE statistics, of
    a small table: a queue of 100 partitions and another tenant's 300, analyzed, then a fresh connection
    (its plans built on those statistics). A two-item ack (its general statement) reads a few partition
    rows; as a join, its generic plan hashed every partition of the table for each call (402 rows).
    (The pop's walk has the same bound: the next test.)"""
    conn = await asyncpg.connect(await analyzed_small(pg))
    try:
        for attempt in range(4):  # the later calls run on the plans the first ones cached
            await push(conn, "walk", f"w{attempt}", [f"again{attempt}", f"more{attempt}"])
            got = await pop(conn, "walk", partition=f"w{attempt}", batch=2)
            assert [m["txn"] for m in got] == [f"again{attempt}", f"more{attempt}"]
            async with conn.transaction():
                before = await conn.fetchval(PARTITIONS_READ)
                assert await ack(conn, got) == [True, True]  # two items: the ack's general statement
                acked = await conn.fetchval(PARTITIONS_READ) - before
            assert acked < 10, (attempt, acked)
    finally:
        await conn.close()


async def test_after_an_analyze_a_pop_walk_probes_only_the_partitions_it_walks(pg):
    """The same bound for queen_pop's walk (a pop naming no partition) and its empty answer's lease hint,
    in the same state: a queue of 100 partitions beside another tenant's 300, analyzed, a fresh
    connection. The walk and the hint read the partition row of each cursor they pass, at most the
    queue's 100 each; as a join, the generic plan on those statistics read every partition of the table
    for each pop (317-401 rows with a message to hand out, 400 without) and compared each cursor walked
    with each: a pop's cost grew with the other tenants' partitions."""
    conn = await asyncpg.connect(await analyzed_small(pg))
    try:
        for attempt in range(6):  # the later calls run on the plans the first ones cached
            await push(conn, "walk", f"w{attempt * 7}", [f"again{attempt}"])
            async with conn.transaction():
                before = await conn.fetchval(PARTITIONS_READ)
                got = await pop(conn, "walk", batch=100, auto_ack=True)
                popped = await conn.fetchval(PARTITIONS_READ) - before
            assert [m["txn"] for m in got] == [f"again{attempt}"]
            async with conn.transaction():
                before = await conn.fetchval(PARTITIONS_READ)
                assert await pop(conn, "walk", batch=100, auto_ack=True) == []  # the walk, then the hint
                empty = await conn.fetchval(PARTITIONS_READ) - before
            # at most a probe per cursor of the queue for the walk, and again for the hint: never the table
            assert popped <= 200 and empty <= 200, (attempt, popped, empty)
    finally:
        await conn.close()


async def test_one_item_acks_out_of_order_and_after_a_failure_settle_as_a_batch_would(pg):
    conn = await asyncpg.connect(pg.new_db())
    try:
        await push(conn, "ooo", "p", ["a", "b", "c", "d"])
        msgs = await pop(conn, "ooo", "p", batch=3)
        pid = msgs[0]["partition_id"]
        assert await ack(conn, [msgs[0]]) == [True]  # the head: the cursor moves, the lease stays
        c = await cursor(conn, pid)
        assert c["acked_seq"] == 1 and c["lease_id"] == msgs[0]["lease_id"]
        assert await ack(conn, [msgs[2]]) == [True]  # beyond the head: remembered beside the cursor
        assert (await cursor(conn, pid))["acked_seq"] == 1
        assert await ack(conn, [msgs[1]]) == [True]  # fills the gap: the cursor jumps over the run
        c = await cursor(conn, pid)
        assert c["acked_seq"] == 3 and c["lease_id"] is None
        assert await conn.fetchval("SELECT count(*) FROM queen_msg_state WHERE tenant = $1", T) == 0
        assert await ack(conn, [msgs[1]]) == [True]  # idempotent
        # a failed delivery is remembered; the completed ack of the redelivery clears it
        d = await pop(conn, "ooo", "p")
        assert await ack(conn, d, "failed") == [True]
        again = await pop(conn, "ooo", "p")
        assert [m["txn"] for m in again] == ["d"] and again[0]["attempt"] == 2
        assert await ack(conn, again) == [True]
        assert (await cursor(conn, pid))["acked_seq"] == 4
        assert await conn.fetchval("SELECT count(*) FROM queen_msg_state WHERE tenant = $1", T) == 0
        # a lease that is not the cursor's is refused and changes nothing
        await push(conn, "ooo", "p", ["e"])
        e = await pop(conn, "ooo", "p")
        forged = [{**dict(e[0]), "lease_id": uuid.uuid4()}]
        assert await ack(conn, forged) == [False]
        assert (await cursor(conn, pid))["acked_seq"] == 4
    finally:
        await conn.close()


# queen_pop hands out a partition's clean prefix as one set and treats each message on its own only from
# the first that needs it. Forcing either path (queen.pop_set_min) on the same log must give the same
# answer and leave the same state behind.
SET_PATH, LOOP_PATH = 0, 1_000_000
HOUR_MS = 3_600_000


async def mixed_log(conn):
    """Queue 'mix' (retry limit 3, DLQ on, retryDelay and maxWaitTimeSeconds set, so the pop is gated):
    partition 'a' holds 100 messages: 41 past its deadline, 55 waited out, 61 with its retries spent,
    71 already acked out of order, 80 failed once, 90 waiting for its retry (it holds back the rest);
    partition 'b' starts with 60 messages past their deadline, then 30 fine; partition 'c' has a held head."""
    await push_mixed(conn, "a", 100, expired={41})
    await push_mixed(conn, "b", 90, expired=set(range(1, 61)))
    await push_mixed(conn, "c", 5, expired=set())
    await conn.execute("UPDATE queen_queues SET retry_limit = 3, dlq_enabled = true, options = options || "
                       "'{\"retryDelay\": 1000, \"maxWaitTimeSeconds\": 3600}' WHERE tenant = $1 AND name = 'mix'", T)
    pids = {r["name"]: r["id"] for r in await conn.fetch(
        "SELECT name, id FROM queen_partitions WHERE tenant = $1 AND queue = 'mix'", T)}
    await conn.execute("UPDATE queen_messages SET created_at = now() - interval '2 hours' "
                       "WHERE tenant = $1 AND partition_id = $2 AND seq = 55", T, pids["a"])
    for part, seq, acked, failures, retry_in in (("a", 61, False, 5, None), ("a", 71, True, 0, None),
                                                 ("a", 80, False, 1, None), ("a", 90, False, 1, 3600),
                                                 ("c", 1, False, 1, 3600)):
        await conn.execute("INSERT INTO queen_msg_state (tenant, partition_id, consumer_group, seq, acked, failures, "
                           "retry_at) VALUES ($1, $2, $3, $4, $5, $6, now() + $7 * interval '1 second')",
                           T, pids[part], QM, seq, acked, failures, retry_in)


async def push_mixed(conn, partition, n, expired):
    txns = [f"{partition}{i}" for i in range(1, n + 1)]
    await sql_push(conn, T, "mix", txns, partition, payload=b'{"k":1}',
                   deadlines_ms=[-1000 if i in expired else HOUR_MS for i in range(1, n + 1)])


async def drain_mixed(conn, path, batch, auto_ack):
    """Pop 'mix' partition by partition until nothing comes, acking what a leased pop delivered; every
    answer row and, after each pop, the cursor, normalised (ids and instants differ between databases)."""
    await conn.execute(f"SET queen.pop_set_min = {path}")
    seen = []
    for part in ("a", "b", "c"):
        for _ in range(8):
            rows = await conn.fetch("SELECT * FROM queen_pop($1, 'mix', $2, $3, $4, 1, $5, NULL, NULL)",
                                    T, part, QM, batch, auto_ack)
            seen.append([(r["kind"], r["partition"], r["seq"], r["txn"], r["attempt"], r["payload"],
                          r["lease_id"] is not None, r["deadline_at"] is not None) for r in rows if r["kind"] != "idle"])
            seen.append(tuple(await conn.fetchrow(
                "SELECT c.acked_seq, c.lease_end_seq, c.lease_id IS NOT NULL FROM queen_cursors c "
                "JOIN queen_partitions p ON p.tenant = c.tenant AND p.id = c.partition_id "
                "WHERE c.tenant = $1 AND p.queue = 'mix' AND p.name = $2", T, part)))
            msgs = [r for r in rows if r["kind"] == "msg"]
            if not msgs:
                break
            if not auto_ack:
                assert all(r["success"] for r in await sql_ack(conn, T, msgs))
    state = [tuple(r) for r in await conn.fetch(
        "SELECT p.name, s.seq, s.acked, s.failures FROM queen_msg_state s JOIN queen_partitions p "
        "ON p.tenant = s.tenant AND p.id = s.partition_id WHERE s.tenant = $1 ORDER BY 1, 2", T)]
    dlq = [tuple(r) for r in await conn.fetch(
        "SELECT partition, txn, error, retry_count FROM queen_dlq WHERE tenant = $1 ORDER BY 1, 2", T)]
    return seen, state, dlq


@pytest.mark.parametrize("batch, auto_ack", [(1000, False), (50, False), (1000, True), (40, True)])
async def test_pop_set_path_answers_exactly_as_the_per_message_loop(pg, batch, auto_ack):
    results = []
    for path in (SET_PATH, LOOP_PATH):
        conn = await asyncpg.connect(pg.new_db())
        try:
            await mixed_log(conn)
            results.append(await drain_mixed(conn, path, batch, auto_ack))
        finally:
            await conn.close()
    assert results[0] == results[1]
    seen, state, dlq = results[0]
    rows = [r for answer in seen if isinstance(answer, list) for r in answer]
    got = [(r[2], r[4]) for r in rows if r[0] == "msg" and r[1] == "a"]
    # 'a': offsets 1..89 except the dead letters and the acked one, in order; 80 is its second attempt; the
    # retry waiting at 90 holds back the rest
    assert [s for s, _ in got] == [s for s in range(1, 90) if s not in (41, 55, 61, 71)]
    assert dict(got)[80] == 2 and dict(got)[1] == 1
    assert [(r[0], r[2]) for r in rows if r[0] != "msg" and r[1] == "a"] == [("expired", 41), ("expired", 55),
                                                                           ("exhausted", 61)]
    assert [r[2] for r in rows if r[0] == "msg" and r[1] == "b"] == list(range(61, 91))
    assert not [r for r in rows if r[1] == "c"]
    assert ("a", "a41", "deadline_exceeded", 0) in dlq and ("a", "a55", "max_wait_exceeded", 0) in dlq
    assert ("a", "a61", "retries_exhausted", 5) in dlq and len(dlq) == 63
    assert ("a", 90, False, 1) in state and ("c", 1, False, 1) in state


async def test_an_auto_ack_pop_wakes_long_polls_only_while_its_partition_holds_more_on_both_paths(pg):
    for path in (SET_PATH, LOOP_PATH):
        dsn = pg.new_db()
        conn, listener = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        woken: list[str] = []
        try:
            await listener.add_listener("queen_push", lambda *a, w=woken: w.append(a[3]))
            await sql_push(conn, T, "wk", [f"w{i}" for i in range(100)], "p")
            await conn.execute("SELECT queen_listen($1, 'wk', 'worker-x', 60000)", T)
            await conn.execute(f"SET queen.pop_set_min = {path}")
            got = []
            for batch, wakes in ((40, 1), (100, 0)):  # 60 left after the first pop; none after the second
                before = len(woken)
                got += await sql_pop(conn, T, "wk", partition="p", batch=batch, auto_ack=True)
                for _ in range(20):  # a notification reaches the listener after the pop's commit
                    await asyncio.sleep(0.05)
                assert len(woken) - before == wakes, (path, batch)
            assert [m["seq"] for m in got] == list(range(1, 101)) and woken[0] == f"{T}\twk"
        finally:
            await conn.close()
            await listener.close()
