"""Timers at volume: the cost of a claim and of a schedule must not depend on how many rows
are pending or due, nor on when statistics were last gathered.

The failure these tests catch: on a table filled in one burst and never analyzed, the planner served a
lookup by key from the (tenant, queue, partition, due_at) index (it ties with the primary key on a
table it believes tiny), reading every row of the queue per key; a 256-op schedule took 1.8 s at 50k
rows and a 1,000-row claim 1-4 s at 20k due. So the tests fill the table in one statement with
autovacuum off and no ANALYZE, then count what one call touched in its own transaction
(``pg_stat_xact_user_tables``: sequential scans and index tuples fetched on queen_timers), which does
not depend on the machine's speed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from helpers import apply_call, fire_call, sweep_call, take_and_lease, take_call

from broker.store.pool import connect
from broker.store.queries import Q
from broker.timers.sweeper import SweeperConfig

ROWS = 30_000
SWEEP_DEFAULTS = SweeperConfig().sweep(None, in_tx=True)  # a cycle's statement as a default sweeper sends it
SEED = """
INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub, deliver_at, due_at)
SELECT 'vol', 'q', 'k' || g, 'p' || (g % 8), 'x' || g, gen_random_uuid(), '{}'::bytea, 's', now() + $1::text::interval,
       now() + $1::text::interval
FROM generate_series(1, $2::integer) AS g
"""
SEED_READY = SEED.replace("due_at)", "due_at, payload_ready)", 1).replace(
    "now() + $1::text::interval\nFROM", "now() + $1::text::interval, true\nFROM", 1)  # as a schedule stores JSON
TOUCHED = """
SELECT coalesce(seq_scan, 0) AS seq_scan, coalesce(seq_tup_read, 0) AS seq_tup_read,
       coalesce(idx_tup_fetch, 0) AS idx_tup_fetch, coalesce(idx_scan, 0) AS idx_scan
FROM pg_stat_xact_user_tables WHERE relname = 'queen_timers'
"""


@pytest.fixture
async def burst(pg):
    """A fresh database whose queen_timers got ROWS rows in one statement, never analyzed."""
    dsn = pg.new_db()
    conn = await connect(dsn)
    await conn.execute("ALTER TABLE queen_timers SET (autovacuum_enabled = false)")
    await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ('vol') ON CONFLICT DO NOTHING")
    yield conn
    await conn.close()


async def touched_by(conn: asyncpg.Connection, work: Callable[[], Awaitable[list]]) -> tuple[dict, list]:
    """Run ``work`` in a transaction; what it read from queen_timers (deltas) and its rows."""
    async with conn.transaction():
        before = dict(await conn.fetchrow(TOUCHED) or {"seq_scan": 0, "seq_tup_read": 0, "idx_tup_fetch": 0, "idx_scan": 0})
        rows = await work()
        after = dict(await conn.fetchrow(TOUCHED))
    return {k: after[k] - before[k] for k in after}, rows


async def touched(conn: asyncpg.Connection, query: str, *args: object) -> tuple[dict, list]:
    return await touched_by(conn, lambda: conn.fetch(query, *args))


def assert_never_analyzed(stats: asyncpg.Record) -> None:
    assert stats["last_analyze"] is None and stats["last_autoanalyze"] is None


async def test_take_and_lease_of_a_burst_read_what_they_take_without_statistics(burst):
    conn = burst
    await conn.execute(SEED, "-1 second", ROWS)
    assert_never_analyzed(await conn.fetchrow(
        "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables WHERE relname = 'queen_timers'"))
    batch = 500
    delta, claimed = await touched_by(conn, lambda: take_and_lease(conn, lease_ms=30_000, batch=batch))
    assert len(claimed) == batch
    # What a take and lease of `batch` rows need: the window of candidate rows, the partition walk, and
    # the stamp by primary key: a few index tuples per row taken. Reading the queue per key (the plan this
    # catches) fetches ROWS per row.
    assert delta["seq_scan"] == 0, delta
    assert delta["idx_tup_fetch"] <= 10 * batch, delta


async def test_schedule_into_a_big_queue_probes_by_key_without_statistics(burst):
    conn = burst
    await conn.execute(SEED, "1 hour", ROWS)
    n = 256
    keys = [f"new-{i}" for i in range(n)] + ["k1", "k2"]  # two reschedules of existing rows too
    m = len(keys)
    call = apply_call("vol", [("schedule", "q", k) for k in keys], txns=[f"t{i}" for i in range(m)],
                      payloads=[b"{}"] * m)
    delta, rows = await touched(conn, Q.timers_apply, *call.args())
    assert [r["status"] for r in rows] == ["scheduled"] * n + ["rescheduled"] * 2
    assert delta["seq_scan"] == 0, delta
    assert delta["idx_tup_fetch"] <= 4 * m, delta
    # The cancel path probes by key as well.
    call = apply_call("vol", [("cancel", "q", k) for k in ("k3", "k4", "nope")], check_switch=False,
                      txns=["c1", "c2", "c3"])
    delta, rows = await touched(conn, Q.timers_apply, *call.args())
    assert [r["status"] for r in rows] == ["cancelled", "cancelled", "absent"]
    assert delta["seq_scan"] == 0 and delta["idx_tup_fetch"] <= 20, delta


async def test_a_batch_of_new_keys_goes_in_without_reading_the_table(burst):
    """256 new keys into a big queue are one plain INSERT: no probe of queen_timers at all (the unique
    check of the insert is not a scan). The general statement probes the primary key once per key; this
    catches a batch of fresh timers sent down that path."""
    conn = burst
    await conn.execute(SEED, "1 hour", ROWS)
    n = 256
    keys = [f"fresh-{i}" for i in range(n)]
    call = apply_call("vol", [("schedule", "q", k) for k in keys], txns=keys, payloads=[b"{}"] * n)
    delta, rows = await touched(conn, Q.timers_apply, *call.args())
    assert [r["status"] for r in rows] == ["scheduled"] * n
    assert delta == {"seq_scan": 0, "seq_tup_read": 0, "idx_tup_fetch": 0, "idx_scan": 0}, delta


async def test_schedule_plan_cached_on_an_empty_table_still_probes_by_key(burst):
    """queen_timers_apply runs on one generic plan per connection, built at its first call. Built while
    the table was empty, it must still probe by key once a burst has filled the table (no ANALYZE, so
    nothing invalidates the cached plan): the plan catches a sequential scan or a walk of the queue."""
    conn = burst

    def ops(keys: list[str], op: str = "schedule") -> tuple:
        return apply_call("vol", [(op, "q", k) for k in keys], payloads=[b"{}"] * len(keys)).args()

    delta, rows = await touched(conn, Q.timers_apply, *ops(["first"]))  # the plan is built and cached now
    assert [r["status"] for r in rows] == ["scheduled"]
    await conn.execute(SEED, "1 hour", ROWS)
    assert_never_analyzed(await conn.fetchrow(
        "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables WHERE relname = 'queen_timers'"))
    keys = [f"late-{i}" for i in range(64)] + ["k10", "k20"]
    delta, rows = await touched(conn, Q.timers_apply, *ops(keys))
    assert [r["status"] for r in rows] == ["scheduled"] * 64 + ["rescheduled"] * 2
    assert delta["seq_scan"] == 0, delta
    assert delta["idx_tup_fetch"] <= 4 * len(keys), delta
    delta, rows = await touched(conn, Q.timers_apply, *ops(["k30", "nope"], "cancel"))
    assert [r["status"] for r in rows] == ["cancelled", "absent"]
    assert delta["seq_scan"] == 0 and delta["idx_tup_fetch"] <= 20, delta


async def test_the_lease_starts_when_the_claim_ends(burst):
    """claimed_until is measured from the clock at the claim's end, not from its transaction's start: a
    claim inside a transaction that began 600 ms earlier still gets its whole lease."""
    conn = burst
    await conn.execute(SEED, "-1 second", 10)
    lease_ms = 5_000
    async with conn.transaction():
        started = await conn.fetchval("SELECT now()")
        await conn.execute("SELECT pg_sleep(0.6)")
        assert len(await take_and_lease(conn, lease_ms=lease_ms, batch=10)) == 10
        ended = await conn.fetchval("SELECT clock_timestamp()")
    rows = await conn.fetch("SELECT claimed_until, due_at FROM queen_timers WHERE tenant = 'vol'")
    assert len(rows) == 10
    for r in rows:
        left_at_end = (r["claimed_until"] - ended).total_seconds()
        assert r["due_at"] == r["claimed_until"]
        assert (r["claimed_until"] - started).total_seconds() >= lease_ms / 1000 + 0.6
        assert lease_ms / 1000 - 0.5 <= left_at_end <= lease_ms / 1000, left_at_end


async def take_and_fire(conn: asyncpg.Connection, batch: int, random_page_cost: int | None = None,
                        in_db: bool = False) -> tuple[dict, int, list]:
    """One fire transaction as the sweeper runs it (take, then fire what was taken; ``in_db``: the
    sweep statement that takes and fires ready rows, queen_timers_fire_ready); what it read from
    queen_timers, how many rows it took and the fire's answer."""
    async with conn.transaction():
        if random_page_cost is not None:
            await conn.execute(f"SET LOCAL random_page_cost = {random_page_cost}")
        before = dict(await conn.fetchrow(TOUCHED) or {"seq_scan": 0, "seq_tup_read": 0, "idx_tup_fetch": 0, "idx_scan": 0})
        if in_db:
            got = await conn.fetch(Q.timers_sweep, *sweep_call(batch).args())
            n = next(r["taken"] for r in got if r["kind"] == "summary")
            out = [r for r in got if r["kind"] != "summary"]
        else:
            rows = [r for r in await conn.fetch(Q.timers_take, *take_call(batch).args()) if r["tenant"] is not None]
            n = len(rows)
            out = await conn.fetch(Q.timers_fire, *fire_call(rows).args())
        after = dict(await conn.fetchrow(TOUCHED))
    return {k: after[k] - before[k] for k in after}, n, out


@pytest.mark.parametrize("in_db", [False, True], ids=["packed", "in-db"])
@pytest.mark.parametrize(("random_page_cost", "cached_on_empty"), [(None, False), (100, False), (None, True)])
async def test_take_and_fire_of_a_burst_read_what_they_take_without_statistics(burst, random_page_cost, cached_on_empty,
                                                                              in_db):
    """The sweeper's fire transaction: the take reads the rows it takes through the due indexes, and the
    fire deletes them by ctid (a TID scan, not a scan of the table), whatever the statistics and the costs
    say. With random page reads priced high, a TID scan of 500 ctids costs more than a sequential scan of
    the table, which PostgreSQL 15 chose at the default costs on a 100,000-row burst (one read of the
    whole table and its dead rows per fire): the plan must not depend on that. The take runs on one
    generic plan per connection: cached while the table held one row, it must still walk the due
    indexes once a burst has filled the table (no ANALYZE, so nothing invalidates the cached plan). So
    does the fire of ready rows inside the sweep statement (in-db), whose delete is a generic plan too: a
    nested loop of TID probes, never a scan, cached on one row as well."""
    conn = burst
    seed = SEED_READY if in_db else SEED
    if cached_on_empty:
        for i in range(3):  # the plans are built and cached on this connection now
            await conn.execute("DELETE FROM queen_messages")
            await conn.execute(seed, "-1 second", 1)
            delta, n, out = await take_and_fire(conn, 500, in_db=in_db)
            assert n == 1 and [r["kind"] for r in out] == ["fired"], (i, out)
        await conn.execute("DELETE FROM queen_messages")
    await conn.execute(seed, "-1 second", ROWS)
    assert_never_analyzed(await conn.fetchrow(
        "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables WHERE relname = 'queen_timers'"))
    batch = 500
    delta, n, out = await take_and_fire(conn, batch, random_page_cost, in_db)
    assert n == batch and [r["kind"] for r in out] == ["fired"] * batch
    assert delta["seq_scan"] == 0, delta
    assert delta["idx_tup_fetch"] <= 10 * batch, delta
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == ROWS - batch


INDEX_BLOCKS_READ = """
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(i.indexrelid)), 0)::bigint
FROM pg_index i WHERE i.indrelid = 'queen_timers'::regclass
"""


async def test_a_vacuumed_table_of_far_timers_does_not_change_what_a_cycle_reads(pg):
    """Statistics the planner does get, from VACUUM (row count, pages, the visibility map) and not from
    ANALYZE, must not change the take's plan either. Once a vacuum had marked a million far-future rows
    of another tenant all-visible, the generic plan of the take's candidate window read them with an
    index-only scan of (tenant, queue, partition, due_at) and sorted them, instead of walking
    (tenant, due_at) from the start: ~800 buffers and 2.6 ms per cycle at a steady 1,000 due/s
    (PostgreSQL 15, pg_stat_statements). Counted here as the index blocks one sweep cycle reads, on a
    connection whose plans are built after the vacuum: 322 at 300,000 far rows and 874 at 1,000,000 with
    that plan; 75-85 with the walk, nearly all of them the probes of the 8 partitions the 10 due rows are in."""
    dsn = pg.new_db()
    conn = await connect(dsn)
    sweeper = None
    try:
        await conn.execute("ALTER TABLE queen_timers SET (autovacuum_enabled = false)")
        await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ('vol'), ('hot') ON CONFLICT DO NOTHING")
        await conn.execute(SEED, "1 day", 300_000)  # tenant 'vol', far in the future
        await conn.execute("VACUUM queen_timers")
        await conn.execute(SEED.replace("'vol'", "'hot'"), "-1 second", 10)
        assert_never_analyzed(await conn.fetchrow(
            "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables WHERE relname = 'queen_timers'"))
        sweeper = await connect(dsn)
        before = 0  # the counters add up over the connection's transactions until they are flushed
        for _ in range(2):  # the second cycle runs on the plans the first one cached
            async with sweeper.transaction():
                rows = await sweeper.fetch(Q.timers_sweep, *SWEEP_DEFAULTS.args())
                read = await sweeper.fetchval(INDEX_BLOCKS_READ) - before
            before += read
            assert [r["kind"] for r in rows] == ["taken"] * 10 + ["summary"]  # packed in Python: not fired
            assert read <= 150, read
    finally:
        if sweeper is not None:
            await sweeper.close()
        await conn.close()


async def test_other_tenants_add_nothing_to_a_cycle(pg):
    """A broker's tenants are many; few of them have timers due at any moment. The take once walked every
    row of queen_tenants and probed the due index for each, three times a cycle (a 5-row cycle took 16 ms
    beside 1,000 tenants without timers, 811 ms beside 100,000, PostgreSQL 15), then one descent per
    tenant holding any timer (18 ms beside 1,000 tenants with one far-future timer each, PostgreSQL 16).
    Now the due tenants are the front of the (due_at, tenant) index, so 20,000 tenants without timers
    and 2,000 with one far-future timer each must not change the blocks one cycle reads (queen_tenants
    and queen_timers' indexes): 10 due rows of one tenant, taken in a transaction as in the test above."""
    dsn = pg.new_db()
    conn = await connect(dsn)
    sweeper = None
    blocks = (
        "SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint FROM pg_class c "
        "WHERE c.oid = 'queen_tenants'::regclass OR c.oid IN "
        "(SELECT i.indexrelid FROM pg_index i WHERE i.indrelid IN ('queen_timers'::regclass, 'queen_tenants'::regclass))"
    )
    try:
        await conn.execute("INSERT INTO queen_tenants (tenant) SELECT 'idle-' || g FROM generate_series(1, 20000) g")
        await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ('vol'), ('hot') ON CONFLICT DO NOTHING")
        await conn.execute(SEED, "1 day", 1_000)  # tenant 'vol': timers, none due
        await conn.execute("INSERT INTO queen_tenants (tenant) SELECT 'far-' || g FROM generate_series(1, 2000) g")
        await conn.execute(  # 2,000 more tenants, one far-future timer each
            "INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub, "
            "deliver_at, due_at) SELECT 'far-' || g, 'q', 'k', 'p', 'x', gen_random_uuid(), '{}'::bytea, 's', "
            "now() + interval '1 day', now() + interval '1 day' FROM generate_series(1, 2000) g")
        await conn.execute(SEED.replace("'vol'", "'hot'"), "-1 second", 10)
        sweeper = await connect(dsn)
        before = 0
        for _ in range(2):  # the second cycle runs on the plans the first one cached
            async with sweeper.transaction():
                rows = await sweeper.fetch(Q.timers_sweep, *SWEEP_DEFAULTS.args())
                read = await sweeper.fetchval(blocks) - before
            before += read
            assert [r["kind"] for r in rows] == ["taken"] * 10 + ["summary"]
            summary = rows[-1]
            assert summary["next_due_ms"] is not None and summary["next_due_ms"] <= 0  # the 10, not yet fired
            assert read <= 150, read
    finally:
        if sweeper is not None:
            await sweeper.close()
        await conn.close()


async def test_sweepers_that_wake_together_split_a_due_set_that_fits_one_cycle(pg):
    """800 rows just due in 8 partitions of 100, two sweepers (queen.sweeper_peers = 2) taking at once:
    each takes 4 whole partitions (the first sweeper once took all 8 and fired them alone while the other
    found nothing). Rows due longer than queen.sweeper_split_window_ms ago, or a sweeper that is the only
    one (peers 1), or a due set under 200 rows: one sweeper takes it all."""
    dsn = pg.new_db()
    conn = await connect(dsn)
    sweepers = [await connect(dsn) for _ in range(2)]
    try:
        await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ('vol') ON CONFLICT DO NOTHING")
        await conn.execute(SEED, "-1 second", 800)

        async def take_both(peers: int, window_ms: int) -> list[dict[str, int]]:
            """Both sweepers take inside open transactions (nothing fired, the locks held), then roll back."""
            txs, taken = [], []
            try:
                for s in sweepers:
                    await s.execute("SELECT set_config('queen.sweeper_peers', $1, false), "
                                    "set_config('queen.sweeper_split_window_ms', $2, false)", str(peers), str(window_ms))
                    tx = s.transaction()
                    await tx.start()
                    txs.append(tx)
                    rows = await s.fetch(Q.timers_sweep, *SWEEP_DEFAULTS.args())
                    per: dict[str, int] = {}
                    for r in rows:
                        if r["kind"] == "taken":
                            per[r["partition"]] = per.get(r["partition"], 0) + 1
                    taken.append(per)
            finally:
                for tx in txs:
                    await tx.rollback()
            return taken

        a, b = await take_both(2, 600_000)  # just due (a window wider than the test's age)
        assert sum(a.values()) == sum(b.values()) == 400, (a, b)
        assert set(a).isdisjoint(b) and all(n == 100 for n in (*a.values(), *b.values()))  # whole partitions
        a, b = await take_both(2, 0)  # due for longer than the window: the first takes all
        assert (sum(a.values()), sum(b.values())) == (800, 0)
        a, b = await take_both(1, 600_000)  # alone
        assert (sum(a.values()), sum(b.values())) == (800, 0)
        await conn.execute("DELETE FROM queen_timers WHERE tenant = 'vol' AND partition IN ('p0', 'p1', 'p2', 'p3', 'p4', 'p5')")
        a, b = await take_both(2, 600_000)  # 200 rows in 2 partitions: split (at the threshold)
        assert sum(a.values()) == sum(b.values()) == 100, (a, b)
        await conn.execute("DELETE FROM queen_timers WHERE tenant = 'vol' AND partition = 'p6' AND timer_key > 'k5'")
        left = await conn.fetchval("SELECT count(*) FROM queen_timers WHERE tenant = 'vol'")
        assert 100 < left < 200
        a, b = await take_both(2, 600_000)  # under 200 rows: not split
        assert (sum(a.values()), sum(b.values())) == (left, 0)
    finally:
        for s in sweepers:
            await s.close()
        await conn.close()


OWN_SUBXACTS = """
SELECT s.subxact_count, s.subxact_overflowed
FROM pg_stat_get_backend_idset() AS b(id), LATERAL pg_stat_get_backend_subxact(b.id) AS s
WHERE pg_stat_get_backend_pid(b.id) = pg_backend_pid()
"""


async def test_a_fire_over_many_tenants_keeps_its_subtransactions_cached(pg):
    """Each push that writes a batch as if it were all new opens a subtransaction (broker/sql/functions/log.sql),
    and a fire pushes once per tenant: a cycle over 80 tenants must not pass the 64 subtransactions a
    backend caches (past them every other session's snapshots pay while the fire runs), so from its
    32nd tenant the fire's pushes take the careful statement. Every row still fires once."""
    conn = await connect(pg.new_db())
    try:
        tenants = [f"sub{i:02d}" for i in range(80)]
        await conn.execute("INSERT INTO queen_tenants (tenant) SELECT unnest($1::text[])", tenants)
        await conn.execute("""
            INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub,
                                      deliver_at, due_at, payload_ready)
            SELECT t, 'q', 'k' || g, 'p', 'x' || g, gen_random_uuid(), '{}'::bytea, 's', now() - interval '1 s',
                   now() - interval '1 s', true
            FROM unnest($1::text[]) AS t, generate_series(1, 3) AS g""", tenants)
        async with conn.transaction():
            taken = [r for r in await conn.fetch(Q.timers_take, *take_call(1000).args()) if r["tenant"] is not None]
            fired = await conn.fetch("SELECT kind FROM queen_timers_fire_ready($1::uuid[], $2::tid[])",
                                     [r["message_id"] for r in taken], [r["tid"] for r in taken])
            count, overflowed = await conn.fetchrow(OWN_SUBXACTS)
        assert len(taken) == 240 and [r["kind"] for r in fired] == ["fired"] * 240
        assert not overflowed and count < 64, count
        assert await conn.fetchval("SELECT count(*) FROM queen_messages") == 240
        assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 0
    finally:
        await conn.close()
