"""The log's per-call cost must not grow with the queue (sql/functions/log.sql): a pop of one named
partition and a one-item ack touch that partition's rows, not every partition or cursor of the queue,
whatever the planner knows (fresh tables, never analyzed, generic plans). And queen_ack's one-item
fast path gives the same outcome as its general path around out-of-order acks and failures."""

from __future__ import annotations

import uuid

import asyncpg
from helpers import QUEUE_MODE as QM
from helpers import sql_ack, sql_pop, sql_push

T = "vol"

# Rows fetched or scanned on the log's consumer-side tables inside the current transaction.
TOUCHED = ("SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0) "
           "FROM pg_stat_xact_user_tables WHERE relname IN ('queen_cursors', 'queen_partitions')")


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
