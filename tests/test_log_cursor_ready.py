"""queen_cursors.ready (migration 0027): a pop's walk reads only the cursors with something to hand out,
and no message is ever left behind a cursor marked drained. The invariant is kept by pushes (they mark
their partitions' cursors ready under the partition row lock) and by autoAck pops (they mark a cursor
drained only under the partition row FOR SHARE, reading next_seq after it): shown here with pushes and
pops racing on real connections, then every message checked by id."""

from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg
from helpers import QUEUE_MODE as QM
from helpers import sql_ack, sql_pop, sql_push
from test_log_volume import TOUCHED

from broker.log.calls import Pop, Push
from broker.store.queries import Q

T = "ready"
# Mark drained cursors whatever the queue's size (the default starts past 1,000 partitions): the tests
# run the same code on a few hundred.
MARK_ALL = {"queen.ready_min": "0"}


async def fill_and_drain(conn: asyncpg.Connection, queue: str, partitions: int) -> list[str]:
    """One message in each of ``partitions`` partitions (txn ``<queue>-<i>``), then autoAck pops until the
    queue answers nothing; the txns delivered."""
    for i in range(partitions):
        await sql_push(conn, T, queue, [f"{queue}-{i}"], f"p{i}", payload=b"1")
    got: list[str] = []
    while msgs := await sql_pop(conn, T, queue, batch=100, auto_ack=True):
        got += [m["txn"] for m in msgs]
    return got


async def drained_wrongly(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Cursors marked drained whose partition holds messages past them: must never exist."""
    return await conn.fetch(
        "SELECT c.partition_id, c.consumer_group, c.acked_seq, p.next_seq FROM queen_cursors c "
        "JOIN queen_partitions p ON p.tenant = c.tenant AND p.id = c.partition_id "
        "WHERE c.tenant = $1 AND NOT c.ready AND p.next_seq - 1 > c.acked_seq", T)


async def test_a_pop_over_many_drained_partitions_reads_only_the_ones_with_messages(pg):
    conn = await asyncpg.connect(pg.new_db(), server_settings=MARK_ALL)
    try:
        assert len(await fill_and_drain(conn, "wide", 600)) == 600
        assert await conn.fetchval("SELECT count(*) FROM queen_cursors WHERE tenant = $1 AND ready", T) == 0
        # a push over two partitions (the general path) refills their cursors by key, not by a read of
        # the tenant's 600 drained cursors
        for attempt in range(3):
            push = Push(tenant=T, plain=[], queues=["wide"] * 2, partitions=["p7", "p9"],
                        ids=[uuid.uuid4(), uuid.uuid4()], txns=[f"two{attempt}-a", f"two{attempt}-b"],
                        traces=[None] * 2, payloads=[b"1"] * 2, codecs=[0] * 2, key_ids=[None] * 2,
                        subs=[None] * 2, deadline_ms=[None] * 2)
            async with conn.transaction():
                before = await conn.fetchval(TOUCHED)
                await conn.fetch(push.query, *push.args())
                touched = await conn.fetchval(TOUCHED) - before
            assert touched < 30, (attempt, touched)
            assert await conn.fetchval("SELECT count(*) FROM queen_cursors WHERE tenant = $1 AND ready", T) == 2
            got = [m["txn"] for _ in range(2) for m in await sql_pop(conn, T, "wide", batch=100, auto_ack=True)]
            assert sorted(got) == [f"two{attempt}-a", f"two{attempt}-b"]  # one partition a pop
        for attempt in range(6):  # the later calls run on the plans the first ones cached
            await sql_push(conn, T, "wide", [f"late{attempt}"], f"p{random.randrange(600)}", payload=b"1")
            async with conn.transaction():
                before = await conn.fetchval(TOUCHED)
                msgs = await sql_pop(conn, T, "wide", batch=100, auto_ack=True)
                touched = await conn.fetchval(TOUCHED) - before
            assert [m["txn"] for m in msgs] == [f"late{attempt}"]
            assert touched < 30, (attempt, touched)  # was every drained cursor before the walk found it
        # an empty pop's answer reads no drained cursor either
        async with conn.transaction():
            before = await conn.fetchval(TOUCHED)
            assert await sql_pop(conn, T, "wide", batch=100, auto_ack=True) == []
            assert await conn.fetchval(TOUCHED) - before < 30
        assert await drained_wrongly(conn) == []
    finally:
        await conn.close()


async def test_a_leased_consumer_that_acks_to_the_end_leaves_drained_cursors_too(pg):
    """Leased pops and acks, one message at a time (the one-item ack) and a batch (the general path):
    a cursor acked to its partition's end, lease released, leaves the walk's index as an autoAck pop's
    does, so a leased consumer's pop over many drained partitions reads few rows as well."""
    conn = await asyncpg.connect(pg.new_db(), server_settings=MARK_ALL)
    try:
        for i in range(200):
            await sql_push(conn, T, "leased", [f"a{i}"] if i % 2 else [f"a{i}", f"b{i}"], f"p{i}", payload=b"1")
        while msgs := await sql_pop(conn, T, "leased", batch=100):
            if len(msgs) == 1:
                assert [r["success"] for r in await sql_ack(conn, T, msgs)] == [True]
            else:
                assert [r["success"] for r in await sql_ack(conn, T, msgs)] == [True] * len(msgs)
        assert await conn.fetchval("SELECT count(*) FROM queen_cursors WHERE tenant = $1 AND ready", T) == 0
        for attempt in range(4):
            await sql_push(conn, T, "leased", [f"late{attempt}"], f"p{random.randrange(200)}", payload=b"1")
            async with conn.transaction():
                before = await conn.fetchval(TOUCHED)
                msgs = await sql_pop(conn, T, "leased", batch=100)
                touched = await conn.fetchval(TOUCHED) - before
            assert [m["txn"] for m in msgs] == [f"late{attempt}"] and touched < 30, (attempt, touched)
            assert [r["success"] for r in await sql_ack(conn, T, msgs)] == [True]
        assert await drained_wrongly(conn) == []
    finally:
        await conn.close()


async def test_a_push_in_flight_when_a_consumer_drains_the_partition_keeps_its_cursor_ready(pg):
    """The exact interleaving the partition row FOR SHARE is for: a push has written to the partition
    (its cursors refilled, which changed nothing: they were ready) but not committed when an autoAck
    pop, or the ack of a leased pop, takes the partition to its end. Marking the cursor drained then
    would hide the push's message once it commits; it stays ready, and the next pop delivers it."""
    dsn = pg.new_db()
    conn, pusher = await asyncpg.connect(dsn, server_settings=MARK_ALL), await asyncpg.connect(dsn)
    try:
        await fill_and_drain(conn, "flight", 70)
        for leased in (False, True):
            await sql_push(conn, T, "flight", [f"head-{leased}"], "p0", payload=b"1")
            if leased:
                msgs = await sql_pop(conn, T, "flight", batch=100)
                assert [m["txn"] for m in msgs] == ["head-True"]
            tx = pusher.transaction()
            await tx.start()
            await sql_push(pusher, T, "flight", [f"in-flight-{leased}"], "p0", payload=b"1")
            # the consumer takes the partition to its end (by what it can see) while the push is in flight
            if leased:
                assert [r["success"] for r in await sql_ack(conn, T, msgs)] == [True]
            else:
                msgs = await sql_pop(conn, T, "flight", batch=100, auto_ack=True)
                assert [m["txn"] for m in msgs] == ["head-False"]
            await tx.commit()
            assert await drained_wrongly(conn) == []
            got = await sql_pop(conn, T, "flight", batch=100, auto_ack=True)
            assert [m["txn"] for m in got] == [f"in-flight-{leased}"]
    finally:
        await conn.close()
        await pusher.close()


async def test_below_the_threshold_cursors_stay_ready_and_pushes_never_wait_for_pops(pg):
    """A queue of a few partitions keeps every cursor ready: its walk is short, and its pops take no
    lock on a hot partition's row (queen_ready_min(): 1,000 partitions)."""
    conn = await asyncpg.connect(pg.new_db())
    try:
        assert len(await fill_and_drain(conn, "narrow", 3)) == 3
        assert await conn.fetchval("SELECT count(*) FILTER (WHERE ready) FROM queen_cursors WHERE tenant = $1", T) == 3
    finally:
        await conn.close()


async def test_a_group_moved_back_is_ready_again(pg):
    conn = await asyncpg.connect(pg.new_db(), server_settings=MARK_ALL)
    try:
        first = await fill_and_drain(conn, "back", 100)
        assert await conn.fetchval("SELECT count(*) FROM queen_cursors WHERE tenant = $1 AND ready", T) == 0
        await conn.fetch(Q.groups_seek, T, QM, "back", False, await conn.fetchval("SELECT now() - interval '1 hour'"))
        got = []
        while msgs := await sql_pop(conn, T, "back", batch=100, auto_ack=True):
            got += [m["txn"] for m in msgs]
        assert sorted(got) == sorted(first) and len(got) == 100
    finally:
        await conn.close()


async def test_racing_pushes_and_pops_never_strand_a_message(pg):
    """Pushers (one partition a push, and batches over three partitions: the general path), autoAck
    pops of two groups, alone and gathered, and a third group's leased pops acknowledged at once race
    over 16 partitions (queen.ready_min 0: the pops mark drained cursors as they do past 1,000
    partitions, and pushes and pops meet on the same partitions often). Every pop is queue-wide, so a
    cursor wrongly marked drained would hide its partition's messages from all of them. Every message is
    delivered exactly once per group, and no statement is chosen as a deadlock victim (each would raise
    here)."""
    dsn = pg.new_db()
    setup = await asyncpg.connect(dsn)
    await setup.execute("INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING", T)
    parts = 16
    pushed: list[str] = []
    delivered: dict[str, list[str]] = {QM: [], "g2": [], "g3": []}
    pushing = True

    async def pusher(k: int) -> None:
        conn = await asyncpg.connect(dsn)
        rnd = random.Random(k)
        try:
            for i in range(250):
                n = 3 if i % 2 == 0 else 1
                txns = [f"k{k}-{i}-{j}" for j in range(n)]
                push = Push(tenant=T, plain=[], queues=["race"] * n,
                            partitions=[f"p{rnd.randrange(parts)}" for _ in range(n)],
                            ids=[uuid.uuid4() for _ in range(n)], txns=txns, traces=[None] * n,
                            payloads=[b"1"] * n, codecs=[0] * n, key_ids=[None] * n, subs=[None] * n,
                            deadline_ms=[None] * n)
                rows = await conn.fetch(push.query, *push.args())
                assert [r["status"] for r in rows] == ["queued"] * n
                pushed.extend(txns)
        finally:
            await conn.close()

    async def popper(group: str, gathered: int = 1, leased: bool = False) -> None:
        """``gathered`` > 1: that many pops in one statement (log_pop_many, as the pop coalescer sends
        them): one transaction that holds a drained partition FOR SHARE while its next pop goes on.
        ``leased``: pops under a lease, each answer acknowledged at once (one item or a batch)."""
        conn = await asyncpg.connect(dsn, server_settings=MARK_ALL)
        empty = 0
        try:
            while pushing or empty < 3:
                pop = Pop(tenant=T, queue="race", partition=None, group=group, batch=5, max_partitions=1,
                          auto_ack=not leased)
                if gathered > 1:
                    rows = await conn.fetch(Q.log_pop_many, *Pop.many_args(T, [pop] * gathered))
                else:
                    rows = await conn.fetch(Q.log_pop, *pop.args())
                got = [r["txn"] for r in rows if r["kind"] == "msg"]
                if leased and got:
                    acks = await sql_ack(conn, T, [r for r in rows if r["kind"] == "msg"], group=group)
                    assert [a["success"] for a in acks] == [True] * len(got)
                delivered[group].extend(got)
                empty = 0 if got else empty + 1
                if not got:
                    await asyncio.sleep(0.005)
        finally:
            await conn.close()

    try:
        # the groups exist (and hold cursors) before the race, as long-running consumers would
        await sql_push(setup, T, "race", ["seed"], "p0")
        for g in (QM, "g2", "g3"):
            pop = Pop(tenant=T, queue="race", partition=None, group=g, batch=5, max_partitions=1, auto_ack=True)
            delivered[g] += [r["txn"] for r in await setup.fetch(Q.log_pop, *pop.args()) if r["kind"] == "msg"]
        pushed.append("seed")
        poppers = [asyncio.ensure_future(popper(g, n, leased)) for g, n, leased in (
            (QM, 1, False), (QM, 3, False), ("g2", 1, False), ("g2", 3, False), ("g3", 1, True), ("g3", 1, True))]
        await asyncio.gather(*(pusher(k) for k in range(5)))
        pushing = False
        await asyncio.wait_for(asyncio.gather(*poppers), 60)
        assert await setup.fetchval("SELECT count(*) FROM queen_cursors WHERE tenant = $1 AND NOT ready", T) > 0
        assert await drained_wrongly(setup) == []
        # the partitions, created by racing pushes, are numbered 1..n without a gap, and each group has
        # a cursor on every one (created past cursor_upto, never by a search of the queue)
        n, ordinals, count = await setup.fetchrow(
            "SELECT count(*), array_agg(p.ordinal ORDER BY p.ordinal), q.partition_count FROM queen_partitions p "
            "JOIN queen_queues q ON q.tenant = p.tenant AND q.name = p.queue WHERE p.tenant = $1 "
            "GROUP BY q.partition_count", T)
        assert ordinals == list(range(1, n + 1)) and count == n
        rows = await setup.fetch("SELECT consumer_group, cursor_count, cursor_upto FROM queen_groups WHERE tenant = $1", T)
        assert sorted(tuple(r) for r in rows) == sorted([(QM, n, n), ("g2", n, n), ("g3", n, n)])
        for g in (QM, "g2", "g3"):
            assert len(delivered[g]) == len(set(delivered[g])), g  # no duplicate
            assert sorted(delivered[g]) == sorted(pushed), g  # nothing left behind
    finally:
        await setup.close()
