"""The sweeper on its own (no HTTP): ``Sweeper.run_once()`` / ``run()`` against a fresh database.

Time is moved by the database only: a test that needs a row due again sets its ``due_at`` in SQL
rather than sleeping through a backoff.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import asyncpg
import pytest
from helpers import apply_call, fire_call, take_and_lease, take_call

from broker.codec import Codec
from broker.log.calls import Push
from broker.store import lock_keys
from broker.store.pool import connect
from broker.store.queries import Q
from broker.timers.sweeper import BLOCKED_SLEEP_MS, CycleResult, Sweeper, SweeperConfig


@pytest.fixture
async def db(pg):
    dsn = pg.new_db()
    conn = await connect(dsn)
    yield dsn, conn
    await conn.close()


def sweeper(dsn: str, **kw) -> Sweeper:
    cfg = SweeperConfig(**{"min_sleep_ms": 5, "max_sleep_ms": 200, "batch": 100, "max_attempts": 3,
                           "backoff_base_ms": 50, "faults": True, **kw})
    return Sweeper(dsn, cfg, Codec(1024), name=f"test-{uuid.uuid4().hex[:6]}")


async def schedule(conn: asyncpg.Connection, tenant: str, queue: str, keys: list[str], *, delays: list[int] | None = None,
                   payloads: list[bytes] | None = None, txns: list[str] | None = None, partition: str | None = None,
                   ready: bool = False) -> list:
    """``ready``: store payload_ready (what the broker's schedule sets for a JSON payload), so the sweep
    fires the rows inside the database; False (as rows written by SQL) takes the pack in Python."""
    n = len(keys)
    delays = delays if delays is not None else [0] * n
    payloads = payloads if payloads is not None else [b'{"i": %d}' % i for i in range(n)]
    txns = txns if txns is not None else [f"{queue}-{k}" for k in keys]
    call = apply_call(tenant, [("schedule", queue, k) for k in keys], sub=f"sub-{tenant}", txns=txns,
                      partition=partition, payloads=payloads, delays_ms=delays, ready=ready)
    return await conn.fetch(Q.timers_apply, *call.args())


def one_push(queue: str, partition: str, message_id: uuid.UUID, txn: str) -> Push:
    """One message of tenant t1 pushed straight into the log, as an earlier fire would have."""
    return Push(tenant="t1", plain=[], queues=[queue], partitions=[partition], ids=[message_id], txns=[txn],
                traces=[None], payloads=[b"{}"], codecs=[0], key_ids=[None], subs=["s"], deadline_ms=[None])


async def faulty_timer(db: tuple[str, asyncpg.Connection], fault: str, count: int, ms: int,
                       **sweeper_kw: object) -> tuple[asyncpg.Connection, Sweeper]:
    """Timer t1/q/k due now whose next ``count`` fires meet the injected ``fault``, and a sweeper."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"])
    await conn.execute(Q.timers_fault_set, "t1", "q", fault, count, ms)
    return conn, sweeper(dsn, **sweeper_kw)


async def make_due(conn: asyncpg.Connection) -> None:
    await conn.execute("UPDATE queen_timers SET due_at = now() - interval '1 ms' WHERE claim_token IS NULL")


async def log_rows(conn: asyncpg.Connection, tenant: str | None = None) -> list:
    return await conn.fetch(
        "SELECT m.tenant, p.queue, p.name AS partition, m.seq, m.id, m.txn, m.payload, m.producer_sub, m.created_at "
        "FROM queen_messages m JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id "
        "WHERE $1::text IS NULL OR m.tenant = $1 ORDER BY m.tenant, p.queue, p.name, m.seq", tenant)


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
async def test_fire_pushes_with_the_timers_identity_and_deletes_the_row(db, ready):
    dsn, conn = db
    [res] = await schedule(conn, "t1", "q", ["k"], txns=["tx-1"], partition="P", ready=ready)
    sw = sweeper(dsn, faults=False)
    out = await sw.run_once()
    assert (out.taken, out.fired) == (1, 1)
    [m] = await log_rows(conn)
    assert (m["queue"], m["partition"], m["txn"], m["id"], m["producer_sub"]) == ("q", "P", "tx-1", res["message_id"], "sub-t1")
    assert m["payload"] == b'{"i": 0}'
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 0
    assert m["created_at"] >= res["deliver_at"] and 0 <= out.lags[0] < 5
    await sw.stop()


async def test_a_cycle_is_one_statement_until_rows_need_a_pack(db):
    """Ready rows are taken and fired by one statement that is its own transaction; rows to pack found
    that way are taken again in a transaction by the same cycle (nothing lost, nothing fired twice), and
    cycles stay transactional until one finds nothing to pack."""
    dsn, conn = db
    sw = sweeper(dsn, faults=False)
    await schedule(conn, "t1", "q", ["r1"], ready=True)
    out = await sw.run_once()
    assert (out.taken, out.fired, sw._in_tx) == (1, 1, False)
    await schedule(conn, "t1", "q", ["p1", "p2"], ready=False)
    out = await sw.run_once()
    assert (out.taken, out.fired, sw._in_tx) == (2, 2, True)
    await schedule(conn, "t1", "q", ["r2"], ready=True)
    out = await sw.run_once()  # in a transaction, fired by the database: back to one statement
    assert (out.taken, out.fired, sw._in_tx) == (1, 1, False)
    assert [r["txn"] for r in await log_rows(conn)] == ["q-r1", "q-p1", "q-p2", "q-r2"]
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 0
    await sw.stop()


async def test_a_fire_whose_commit_fails_counts_nothing_and_fires_later(db):
    """The fired rows are counted after the commit: a commit that fails (a deferred check that raises at
    COMMIT) leaves the timer due, the log empty and the fired counters where they were."""
    from prometheus_client import REGISTRY

    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"], txns=["tx-1"], ready=True)
    await conn.execute("""
        CREATE FUNCTION test_refuse_commit() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
        CREATE CONSTRAINT TRIGGER test_refuse_commit AFTER INSERT ON queen_messages
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_refuse_commit();
    """)
    before = REGISTRY.get_sample_value("queen_timers_fired_total") or 0.0
    sw = sweeper(dsn)
    with pytest.raises(asyncpg.RaiseError, match="refused at commit"):
        await sw.run_once()
    assert sw.fired == 0
    assert (REGISTRY.get_sample_value("queen_timers_fired_total") or 0.0) == before
    assert await log_rows(conn) == []
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 1

    await conn.execute("DROP TRIGGER test_refuse_commit ON queen_messages")
    out = await sw.run_once()
    assert (out.taken, out.fired, sw.fired) == (1, 1, 1)
    assert REGISTRY.get_sample_value("queen_timers_fired_total") == before + 1
    assert [m["txn"] for m in await log_rows(conn)] == ["tx-1"]
    await sw.stop()


async def test_nothing_due_reports_when_the_next_is(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["later"], delays=[3_000])
    sw = sweeper(dsn)
    out = await sw.run_once()
    assert out.taken == 0 and 2_000 < out.next_due_ms <= 3_000
    assert sw.config.clamp_sleep_ms(out.next_due_ms) == 200  # clamped to the max sleep
    assert sw.config.clamp_sleep_ms(-50) == 5 and sw.config.clamp_sleep_ms(None) == 200
    await sw.stop()


async def test_the_sleep_is_counted_from_the_cycles_start(db):
    """The database says how long until the next row is due, measured at the cycle's BEGIN; the wake-up
    is that instant, however long the rest of the cycle took."""
    dsn, conn = db
    sw = sweeper(dsn, min_sleep_ms=1, max_sleep_ms=10_000)
    assert sw.wake_at(CycleResult(began_at=100.0, next_due_ms=40)) == pytest.approx(100.04)
    assert sw.wake_at(CycleResult(began_at=100.0, next_due_ms=0)) == pytest.approx(100.0 + BLOCKED_SLEEP_MS / 1000)
    assert sw.wake_at(CycleResult(began_at=100.0, next_due_ms=None)) == pytest.approx(110.0)
    await schedule(conn, "t1", "q", ["later"], delays=[3_000])
    loop = asyncio.get_running_loop()
    before = loop.time()
    out = await sw.run_once()
    assert before <= out.began_at <= loop.time()
    assert sw.wake_at(out) == pytest.approx(out.began_at + out.next_due_ms / 1000)
    await sw.stop()


async def test_a_slow_cycle_does_not_push_the_next_due_timer_back(db):
    """The cycle that learns of a timer due in 2.5 s takes 2 s more (its pending count is slowed here):
    the timer still fires at its instant, not 2 s late (a sleep counted from the cycle's end)."""
    dsn, conn = db
    sw = sweeper(dsn, min_sleep_ms=1, max_sleep_ms=10_000)
    [res] = await schedule(conn, "t1", "q", ["k"], delays=[2_500], txns=["tx-k"])
    real = sw._maybe_count_pending
    slowed = []

    async def slow_once(c: asyncpg.Connection) -> None:
        if not slowed:
            slowed.append(True)
            await asyncio.sleep(2)
        await real(c)

    sw._maybe_count_pending = slow_once  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(sw.run())
    try:
        t0 = asyncio.get_running_loop().time()
        while not await log_rows(conn):
            await asyncio.sleep(0.02)
            assert asyncio.get_running_loop().time() - t0 < 8, "never fired"
        assert slowed
        [m] = await log_rows(conn)
        lag = (m["created_at"] - res["deliver_at"]).total_seconds()
        assert 0 <= lag < 1.5, lag  # counted from the cycle's end it would be >= 2 s
    finally:
        await sw.stop()
        task.cancel()


async def test_the_sweepers_commits_do_not_wait_for_the_wal_flush(db):
    """synchronous_commit off on the sweeper's own connection only (the fire deletes and pushes in one
    transaction, so a commit lost in a database crash fires again); everyone else keeps it on."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"])
    sw = sweeper(dsn)
    assert (await sw.run_once()).fired == 1
    assert sw.conn is not None and await sw.conn.fetchval("SHOW synchronous_commit") == "off"
    assert await conn.fetchval("SHOW synchronous_commit") == "on"
    await sw.stop()


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
async def test_deliver_at_order_within_a_partition_across_a_batch(db, ready):
    dsn, conn = db
    delays = [-10, -50, -30, -20, -40, -60]
    await schedule(conn, "t1", "q", [f"k{d}" for d in delays], delays=delays, payloads=[str(d).encode() for d in delays], ready=ready)
    sw = sweeper(dsn, faults=False)
    await sw.run_once()
    rows = await log_rows(conn)
    assert [int(r["payload"]) for r in rows] == sorted(delays)
    await sw.stop()


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
async def test_a_burst_of_one_tenant_does_not_starve_another(db, ready):
    dsn, conn = db
    await schedule(conn, "tenant-a", "q", [f"a{i:05}" for i in range(1500)], delays=[-1000] * 1500, ready=ready)
    await schedule(conn, "tenant-b", "q", [f"b{i}" for i in range(5)], delays=[0] * 5, ready=ready)
    sw = sweeper(dsn, faults=False, batch=100)
    out = await sw.run_once()
    assert out.taken <= 100 and out.more_due(100)
    assert len(await log_rows(conn, "tenant-b")) == 5  # B's due timers went out in the first cycle
    assert len(await log_rows(conn, "tenant-a")) == out.fired - 5
    # and the rest of A drains in later cycles
    while (await sw.run_once()).taken:
        pass
    assert len(await log_rows(conn, "tenant-a")) == 1500
    await sw.stop()


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
async def test_refire_after_a_lost_commit_is_a_duplicate_not_a_second_frame(db, ready):
    dsn, conn = db
    [res] = await schedule(conn, "t1", "q", ["k"], txns=["tx-dup"], ready=ready)
    # the message is already in the log (the earlier fire committed, its answer was lost)
    await conn.fetch(Q.log_push, *one_push("q", "Default", res["message_id"], "tx-dup").args())
    sw = sweeper(dsn, faults=False)
    out = await sw.run_once()
    assert (out.fired, out.duplicates) == (0, 1)
    assert len(await log_rows(conn)) == 1
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 0
    await sw.stop()


async def test_fire_answers_each_row_with_its_own_queue_key_and_lag(db):
    """The fire's answer names every row it pushed (queue, key, lag from its own deliverAt), over several
    queues and partitions and with a duplicate among them: each item is matched to its row by its index
    in the push, whatever order the push sorted them into."""
    dsn, conn = db
    await schedule(conn, "t1", "qb", [f"b{i}" for i in range(5)], delays=[-400 + 10 * i for i in range(5)], partition="P2")
    await schedule(conn, "t1", "qa", [f"a{i}" for i in range(5)], delays=[-200 - 10 * i for i in range(5)], partition="P1")
    # a3 already went out (a lost commit): a duplicate
    await conn.fetch(Q.log_push, *one_push("qa", "P1", uuid.uuid4(), "qa-a3").args())
    async with conn.transaction():
        rows = [r for r in await conn.fetch(Q.timers_take, *take_call(100).args()) if r["tenant"] is not None]
        out = await conn.fetch(Q.timers_fire, *fire_call(rows).args())
    got = {(r["queue"], r["timer_key"]): r for r in out}
    assert len(out) == 10 and set(got) == {("qa", f"a{i}") for i in range(5)} | {("qb", f"b{i}") for i in range(5)}
    assert [k for k, r in sorted(got.items()) if r["kind"] == "duplicate"] == [("qa", "a3")]
    for (q, k), r in got.items():
        i = int(k[1])
        due_ago = (200 + 10 * i) if q == "qa" else (400 - 10 * i)
        if r["kind"] == "fired":  # lag from this row's deliverAt: at least how long ago it was due
            assert due_ago / 1000 <= r["lag_s"] < due_ago / 1000 + 5, (q, k, r["lag_s"])


async def test_a_lost_claim_commits_nothing(db):
    """A sweeper whose lease expired and whose rows were re-claimed pushes nothing: only rows still
    holding its token are deleted and pushed (a reschedule after expiry must not get the old payload)."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"])
    tok_a, tok_b = uuid.uuid4(), uuid.uuid4()
    rows = await take_and_lease(conn, token=tok_a, lease_ms=10, batch=10, claimed_by="a")
    assert [r["timer_key"] for r in rows] == ["k"]
    await asyncio.sleep(0.05)  # lease of 10 ms expired
    rows = await take_and_lease(conn, token=tok_b, lease_ms=30_000, batch=10, claimed_by="b")
    assert [r["timer_key"] for r in rows] == ["k"]
    out = await conn.fetch(Q.timers_fire, *fire_call(rows, token=tok_a).args())
    assert out == [] and len(await log_rows(conn)) == 0
    out = await conn.fetch(Q.timers_fire, *fire_call(rows, token=tok_b).args())
    assert [r["kind"] for r in out] == ["fired"]


async def test_permanent_failures_back_off_then_go_to_the_dlq(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["bad"], payloads=[b"not json"], txns=["tx-bad"])
    sw = sweeper(dsn, max_attempts=3, backoff_base_ms=5_000)
    for attempt in (1, 2):
        out = await sw.run_once()
        assert out.backoff == 1
        row = await conn.fetchrow(Q.timers_peek, "t1", "q", "bad")
        assert row["attempts"] == attempt and "not valid JSON" in row["last_error"] and row["claimed"] is False
        due_in = await conn.fetchval("SELECT extract(epoch FROM due_at - now()) FROM queen_timers")
        assert due_in > 0  # backing off: not due, not claimed
        assert (await sw.run_once()).taken == 0
        await make_due(conn)
    out = await sw.run_once()
    assert out.dlq == 1
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 0
    dlq = await conn.fetchrow("SELECT * FROM queen_dlq")
    assert dlq["synthetic"] is True and dlq["consumer_group"] == "__timers__" and dlq["queue"] == "q"
    assert dlq["txn"] == "tx-bad" and dlq["retry_count"] == 3 and "not valid JSON" in dlq["error"]
    assert dlq["producer_sub"] == "sub-t1" and dlq["codec"] == 0 and dlq["key_id"] is None
    envelope = json.loads(dlq["payload"])  # the DLQ stores JSON; the bad bytes ride inside
    assert envelope["undeliverable"] is True and base64.b64decode(envelope["payloadBase64"]) == b"not json"
    assert "not valid JSON" in envelope["error"]
    await sw.stop()


async def test_backoff_grows_exponentially_and_transient_failures_cost_no_attempt(db):
    conn, sw = await faulty_timer(db, "transient", 3, 0, backoff_base_ms=1000)
    gaps = []
    for _ in range(3):
        out = await sw.run_once()
        assert out.backoff == 1
        gaps.append(await conn.fetchval("SELECT extract(epoch FROM due_at - now()) FROM queen_timers"))
        await make_due(conn)
    assert [round(g) for g in gaps] == [1, 2, 4]
    row = await conn.fetchrow(Q.timers_peek, "t1", "q", "k")
    assert row["attempts"] == 0 and "transient" in row["last_error"]
    assert (await sw.run_once()).fired == 1
    await sw.stop()


async def test_reschedule_resets_the_attempt_budget(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"], payloads=[b"oops"])
    sw = sweeper(dsn, max_attempts=3)
    await sw.run_once()
    await make_due(conn)
    await sw.run_once()
    assert (await conn.fetchrow(Q.timers_peek, "t1", "q", "k"))["attempts"] == 2
    [res] = await schedule(conn, "t1", "q", ["k"], payloads=[b'{"fixed": true}'], delays=[60_000])
    assert res["status"] == "rescheduled"
    row = await conn.fetchrow(Q.timers_peek, "t1", "q", "k")
    assert row["attempts"] == 0 and row["last_error"] is None
    await sw.stop()


async def claim(conn: asyncpg.Connection, *, batch: int = 100, lease_ms: int = 60_000) -> list:
    return await take_and_lease(conn, lease_ms=lease_ms, batch=batch, claimed_by="test-claim")


async def test_sweepers_fire_side_by_side_with_no_lock_and_claims_own_whole_partitions(db):
    """No leader: with a claim of partition P live (another sweeper firing it), a second sweeper fires
    every other partition at once, and none of P's rows, not even rows that became due later."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["p1", "p2"], delays=[-20, -10], partition="P")
    await schedule(conn, "t1", "q", ["o1", "o2"], partition="O")
    await schedule(conn, "t1", "q2", ["x"], partition="P")  # same partition name, other queue
    held = await claim(conn, batch=2)
    # the partition with the earliest due row comes first, whole
    assert [(r["queue"], r["partition"], r["timer_key"]) for r in held] == [("q", "P", "p1"), ("q", "P", "p2")]
    await conn.execute("UPDATE queen_timers SET claim_token = NULL, claimed_until = NULL, due_at = deliver_at")
    # a claim of P's earliest row only (a batch cut inside the partition)
    await conn.execute("UPDATE queen_timers SET due_at = now() + interval '1 hour' WHERE partition <> 'P' OR queue <> 'q'")
    [h] = await claim(conn, batch=1)
    assert (h["queue"], h["partition"], h["timer_key"]) == ("q", "P", "p1")
    await conn.execute("UPDATE queen_timers SET due_at = now() - interval '1 ms' WHERE claim_token IS NULL")
    a, b = sweeper(dsn), sweeper(dsn)
    out = await a.run_once()
    assert out.fired == 3  # O's two and q2/P's one; q/P's p2 waits behind the live claim of p1
    assert (await b.run_once()).fired == 0
    assert [r["timer_key"] for r in await conn.fetch("SELECT timer_key FROM queen_timers ORDER BY 1")] == ["p1", "p2"]
    # the claim is handed back (or expires): the partition is free again, fired in deliverAt order
    await conn.execute(Q.timers_release_hook_leases, "t1", None, None)
    assert (await b.run_once()).fired == 2
    assert [r["txn"] for r in await log_rows(conn) if r["queue"] == "q" and r["partition"] == "P"] == ["q-p1", "q-p2"]
    await a.stop()
    await b.stop()


async def test_an_expired_claim_frees_its_partition(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k1", "k2"], delays=[-20, -10])
    assert len(await claim(conn, batch=1, lease_ms=1)) == 1
    await asyncio.sleep(0.02)
    sw = sweeper(dsn)
    assert (await sw.run_once()).fired == 2  # the lease ended: claimable again, fired once each, in order
    assert [r["txn"] for r in await log_rows(conn)] == ["q-k1", "q-k2"]
    await sw.stop()


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
async def test_concurrent_sweepers_share_a_burst_and_keep_each_partitions_order(db, ready):
    """Four sweepers, each on its own connection, race over a burst across 24 partitions: every timer
    fires exactly once, more than one sweeper fires, and each partition's log order is deliverAt order."""
    dsn, conn = db
    parts, per = 24, 25
    for p in range(parts):
        delays = [-(1000 - 10 * i) for i in range(per)]  # i = 0 is due first
        await schedule(conn, "t1", "q", [f"p{p:02}-{i:03}" for i in range(per)], delays=delays,
                       partition=f"P{p:02}", payloads=[str(i).encode() for i in range(per)], ready=ready)
    sweepers = [sweeper(dsn, faults=False, batch=40) for _ in range(4)]

    async def drain(sw: Sweeper) -> None:
        idle = 0
        while idle < 3:
            res = await sw.run_once()
            idle = 0 if res.taken else idle + 1
            await asyncio.sleep(0.002 if res.taken else 0.02)

    await asyncio.gather(*(drain(sw) for sw in sweepers))
    assert sum(sw.fired for sw in sweepers) == parts * per
    assert sum(1 for sw in sweepers if sw.fired) >= 2
    rows = await log_rows(conn)
    assert len(rows) == parts * per and len({r["txn"] for r in rows}) == parts * per
    by_part: dict[str, list[int]] = {}
    for r in rows:  # ordered by partition, seq
        by_part.setdefault(r["partition"], []).append(int(r["payload"]))
    assert all(v == list(range(per)) for v in by_part.values())
    for sw in sweepers:
        await sw.stop()


async def test_a_partition_another_claimer_is_taking_right_now_is_skipped(db):
    """Two claim statements at the same moment: the partition lock of the first makes the second skip
    that partition (it must not wait, nor take rows the first is taking)."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["p"], partition="P")
    await schedule(conn, "t1", "q", ["o"], partition="O")
    other = await connect(dsn)
    tx = other.transaction()
    await tx.start()
    try:
        await other.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", lock_keys.TIMERS_PARTITION, "t1\x1fq\x1fP")
        assert [r["timer_key"] for r in await claim(conn)] == ["o"]
    finally:
        await tx.rollback()
        await other.close()
    assert [r["timer_key"] for r in await claim(conn)] == ["p"]


async def test_two_claims_at_the_same_moment_take_different_partitions(db):
    """A take locks only the partitions it needs, so a second claim running meanwhile (the first one's
    fire transaction still open, as the sweeper holds it) is not locked out: it takes the next partition
    instead of coming back empty."""
    dsn, conn = db
    for p in range(3):  # P0's rows are the earliest, then P1's, then P2's
        await schedule(conn, "t1", "q", [f"p{p}-{i:02}" for i in range(50)], partition=f"P{p}",
                       delays=[-3000 + 1000 * p + i for i in range(50)])
    first = await connect(dsn)
    tx = first.transaction()
    await tx.start()
    try:
        a = await first.fetch(Q.timers_take, *take_call(50).args())
        assert {r["partition"] for r in a if r["tenant"]} == {"P0"}
        b = await claim(conn, batch=50)  # while the first claim's transaction is still open
        assert {r["partition"] for r in b} == {"P1"} and len(b) == 50
    finally:
        await tx.rollback()
        await first.close()


async def test_a_take_whose_due_rows_vanish_before_its_lock_answers_the_next_due_instant_not_blocked(db):
    """Another sweeper's fire commits between the take's first read of the due front and its partition
    lock: the take gets the lock and finds the partition empty. It must answer when the next row is due
    (read again), not the instant of the rows now gone: that answer (<= 0 with nothing taken) reads as
    "blocked by another sweeper" and sleeps BLOCKED_SLEEP_MS, while the other sweeper, back after its
    commit, finds this take's lock held and sleeps too (both asleep: 50 ms of fire lag for every timer
    due meanwhile). The interleaving is made deterministic here: the lock this take calls is shadowed on
    its session by one that first deletes the due rows, as that other fire did."""
    _, conn = db
    await schedule(conn, "t1", "q", ["gone"], delays=[-10])
    await schedule(conn, "t1", "q", ["later"], delays=[3_000])
    await conn.execute("""
        CREATE FUNCTION public.pg_try_advisory_xact_lock(k1 integer, k2 integer) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM queen_timers WHERE due_at <= now();  -- the other sweeper's fire, committed
            RETURN pg_catalog.pg_try_advisory_xact_lock(k1, k2);
        END $$""")
    await conn.execute("SET search_path = public, pg_catalog")
    rows = await conn.fetch(Q.timers_take, *take_call(100).args())
    assert [r["timer_key"] for r in rows if r["tenant"]] == []
    [summary] = [r for r in rows if r["tenant"] is None]
    assert 2_000 < summary["next_due_ms"] <= 3_000  # before the fix: about -10, and a 50 ms "blocked" sleep
    assert [r["timer_key"] for r in await conn.fetch("SELECT timer_key FROM queen_timers")] == ["later"]


async def test_pending_gauge_reads_the_per_tenant_counters(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["a", "b"], delays=[60_000, 60_000])
    await schedule(conn, "t2", "q", ["c"], delays=[0])
    assert await conn.fetchval(Q.timers_pending_total) == 3
    sw = sweeper(dsn)
    assert (await sw.run_once()).fired == 1
    assert await conn.fetchval(Q.timers_pending_total) == 2
    from prometheus_client import REGISTRY
    assert REGISTRY.get_sample_value("queen_timers_pending") == 2  # the first cycle reads it
    await sw.stop()


async def test_notify_wakes_a_sleeping_sweeper(db):
    dsn, conn = db
    sw = sweeper(dsn, max_sleep_ms=10_000, min_sleep_ms=1)
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("queen_timers", lambda _c, _p, _ch, payload: sw.notify(payload))
    task = asyncio.get_running_loop().create_task(sw.run())
    try:
        await asyncio.sleep(0.3)  # the sweeper is now asleep for up to 10 s
        await schedule(conn, "t1", "q", ["soon"], delays=[150], txns=["tx-soon"])
        t0 = asyncio.get_running_loop().time()
        while not await log_rows(conn):
            await asyncio.sleep(0.01)
            assert asyncio.get_running_loop().time() - t0 < 3, "not woken by NOTIFY"
        lag = await conn.fetchval("SELECT extract(epoch FROM m.created_at - now()) FROM queen_messages m")
        assert lag is not None
    finally:
        await sw.stop()
        task.cancel()
        await listener.close()


async def test_drain_hands_back_held_claims(db):
    dsn, _ = db
    conn, sw = await faulty_timer(db, "stall", 1, 60_000, lease_ms=60_000)
    task = asyncio.get_running_loop().create_task(sw.run())
    for _ in range(200):
        if (await conn.fetchrow(Q.timers_peek, "t1", "q", "k"))["claimed"]:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("never claimed")
    await sw.stop(timeout_s=5)
    row = await conn.fetchrow("SELECT claim_token, claimed_until, due_at <= now() AS due FROM queen_timers")
    assert row["claim_token"] is None and row["claimed_until"] is None and row["due"] is True
    assert not sw.leases
    task.cancel()
    other = sweeper(dsn)
    assert (await other.run_once()).fired == 1  # fired at once, not after the 60 s lease
    await other.stop()


async def test_beside_another_tenant_a_burst_takes_at_most_its_slice(db):
    dsn, conn = db
    await schedule(conn, "tenant-a", "q", [f"a{i:04}" for i in range(300)], delays=[-1000] * 300)
    await schedule(conn, "tenant-b", "q", ["b0", "b1"])
    sw = sweeper(dsn, batch=1000, tenant_slice=20)
    out = await sw.run_once()
    assert out.fired == 22  # 20 of A's (the cap), both of B's
    assert len(await log_rows(conn, "tenant-b")) == 2
    out = await sw.run_once()  # A alone now: the whole batch
    assert out.fired == 280
    await sw.stop()


# ---- the fire transaction is the claim: a take writes nothing, the fire commits in the same transaction
async def take(conn: asyncpg.Connection, batch: int = 100) -> list:
    return [r for r in await conn.fetch(Q.timers_take, *take_call(batch).args()) if r["tenant"] is not None]


async def fire_taken(conn: asyncpg.Connection, rows: list) -> list:
    return await conn.fetch(Q.timers_fire, *fire_call(rows).args())


async def cancel(conn: asyncpg.Connection, tenant: str, queue: str, key: str) -> str:
    [r] = await conn.fetch(Q.timers_apply, *apply_call(tenant, [("cancel", queue, key)], check_switch=False,
                                                       txns=["c"]).args())
    return str(r["status"])


async def test_a_take_writes_nothing_and_a_cancel_or_reschedule_while_packing_wins(db):
    """Between take and fire the rows are untouched (not claimed: peek says so, a cancel succeeds);
    the fire then skips a row cancelled or rescheduled meanwhile and fires the others."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["a", "b", "c"], partition="P")
    before = await conn.fetch("SELECT ctid::text, xmin::text FROM queen_timers ORDER BY timer_key")
    sw = sweeper(dsn)
    settle = sw._settle

    async def meanwhile(c, token, packed):  # noqa: ANN001, ANN202
        # the take has run, its transaction is open: the rows are exactly as they were
        assert await conn.fetch("SELECT ctid::text, xmin::text FROM queen_timers ORDER BY timer_key") == before
        assert not (await conn.fetchrow(Q.timers_peek, "t1", "q", "a"))["claimed"]
        assert await cancel(conn, "t1", "q", "a") == "cancelled"
        [r] = await schedule(conn, "t1", "q", ["b"], delays=[60_000], payloads=[b'{"new": true}'], partition="P")
        assert r["status"] == "rescheduled"
        return await settle(c, token, packed)

    sw._settle = meanwhile  # type: ignore[method-assign]
    out = await sw.run_once()
    assert (out.taken, out.fired) == (3, 1)
    assert [r["txn"] for r in await log_rows(conn)] == ["q-c"]
    [b] = await conn.fetch("SELECT timer_key, payload FROM queen_timers")
    assert (b["timer_key"], b["payload"]) == ("b", b'{"new": true}')  # pending, with its new payload
    await sw.stop()


async def test_a_cancel_meeting_the_fire_waits_for_its_commit_then_finds_the_row_gone(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["gone", "kept"])
    other = await connect(dsn)
    try:
        for outcome, expected in (("commit", "absent"), ("rollback", "cancelled")):
            tx = other.transaction()
            await tx.start()
            key = "gone" if outcome == "commit" else "kept"
            rows = [r for r in await take(other) if r["timer_key"] == key]
            assert [r["kind"] for r in await fire_taken(other, rows)] == ["fired"]
            waiting = asyncio.get_running_loop().create_task(cancel(conn, "t1", "q", key))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # blocked on the fire's row lock
            await (tx.commit() if outcome == "commit" else tx.rollback())
            assert await asyncio.wait_for(waiting, 5) == expected
        assert [r["txn"] for r in await log_rows(conn)] == ["q-gone"]
    finally:
        await other.close()


async def test_a_partition_is_held_until_the_fire_commits_and_a_dead_sweeper_frees_it_at_once(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["p1", "p2"], partition="P")
    await schedule(conn, "t1", "q", ["o1"], partition="O")
    other = await connect(dsn)
    tx = other.transaction()
    await tx.start()
    assert {r["partition"] for r in await take(other)} == {"O", "P"}
    sw = sweeper(dsn)
    assert (await sw.run_once()).taken == 0  # both partitions are held by the open fire transaction
    other.terminate()  # the sweeper dies mid-cycle: the database rolls its transaction back
    for _ in range(100):
        out = await sw.run_once()
        if out.taken:
            break
        await asyncio.sleep(0.02)
    assert out.fired == 3  # at once: nothing was stamped, there is no lease to wait out
    await sw.stop()


async def test_a_hung_fire_transaction_is_ended_after_the_lease(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"])
    hung = sweeper(dsn, lease_ms=300)

    async def hang(c, token, packed):  # noqa: ANN001, ANN202
        await asyncio.sleep(1.5)  # the transaction sits idle past the lease
        return await Sweeper._settle(hung, c, token, packed)

    hung._settle = hang  # type: ignore[method-assign]
    with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
        await hung.run_once()
    sw = sweeper(dsn)
    assert (await sw.run_once()).fired == 1
    await sw.stop()
    await hung.stop()


@pytest.mark.parametrize("ready", [False, True], ids=["packed", "in-db"])
async def test_a_fire_the_database_refuses_finds_the_row_at_fault_in_the_same_transaction(db, ready):
    """The database refuses one row's message (here a trigger): the others fire in the same cycle and
    the one at fault backs off with one attempt spent, while the partitions stay held."""
    dsn, conn = db
    await conn.execute("""
        CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.txn = 'poison' THEN RAISE EXCEPTION 'refused for this row'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER test_refuse BEFORE INSERT ON queen_messages FOR EACH ROW EXECUTE FUNCTION test_refuse();
    """)
    await schedule(conn, "t1", "q", ["a", "b", "c"], txns=["ta", "poison", "tc"], partition="P", ready=ready)
    sw = sweeper(dsn, faults=False)
    out = await sw.run_once()
    assert (out.taken, out.fired, out.backoff) == (3, 2, 1)
    assert [r["txn"] for r in await log_rows(conn)] == ["ta", "tc"]
    row = await conn.fetchrow("SELECT timer_key, attempts, last_error, claim_token FROM queen_timers")
    assert (row["timer_key"], row["attempts"], row["claim_token"]) == ("b", 1, None)
    assert "refused for this row" in row["last_error"]
    await sw.stop()


def no_pack(sw: Sweeper) -> list[int]:
    """Record how many rows each call of the sweeper's pack (the pass through Python) was given."""
    calls: list[int] = []
    real = sw.pack

    def pack(rows: list) -> object:
        calls.append(len(rows))
        return real(rows)

    sw.pack = pack  # type: ignore[method-assign,assignment]
    return calls


async def test_a_ready_batch_fires_inside_the_take_statement_without_the_pack(db):
    """Every row taken is ready (payload_ready, as the broker's schedule stores a JSON payload): the sweep
    statement fires them itself; the cycle never packs, and the log is what the packed fire writes."""
    dsn, conn = db
    await schedule(conn, "t1", "q", [f"k{i}" for i in range(5)], delays=[-50, -10, -40, -20, -30],
                   payloads=[b'{"d": %d}' % d for d in (-50, -10, -40, -20, -30)], ready=True)
    sw = sweeper(dsn)
    packed = no_pack(sw)
    out = await sw.run_once()
    assert (out.taken, out.fired, packed) == (5, 5, [])
    assert len(out.lags) == 5 and all(0 <= lag < 5 for lag in out.lags)
    rows = await log_rows(conn)
    assert [json.loads(r["payload"])["d"] for r in rows] == [-50, -40, -30, -20, -10]
    assert {r["producer_sub"] for r in rows} == {"sub-t1"} and sw.cursor == "t1"
    assert await conn.fetchval("SELECT count(*) FROM queen_timers") == 0
    await sw.stop()


async def test_one_row_not_ready_sends_the_whole_batch_through_the_pack(db):
    """A batch with one row the database cannot vouch for (written without payload_ready, here not even
    JSON) is packed whole in Python, in one fire: the good rows fire in order, the bad one backs off."""
    dsn, conn = db
    await schedule(conn, "t1", "q", ["a", "c"], delays=[-30, -10], payloads=[b'"a"', b'"c"'], ready=True)
    await schedule(conn, "t1", "q", ["b"], delays=[-20], payloads=[b"\xff not json"])
    sw = sweeper(dsn)
    packed = no_pack(sw)
    out = await sw.run_once()
    assert (out.taken, out.fired, out.backoff, packed) == (3, 2, 1, [3])
    assert [r["payload"] for r in await log_rows(conn)] == [b'"a"', b'"c"']
    row = await conn.fetchrow("SELECT timer_key, attempts, last_error FROM queen_timers")
    assert (row["timer_key"], row["attempts"]) == ("b", 1) and "JSON" in row["last_error"]
    await sw.stop()


@pytest.mark.parametrize("fault", ["permanent", "stall"])
async def test_an_injected_fault_on_a_ready_row_still_goes_through_the_pack(db, fault):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["k"], ready=True)
    await conn.execute(Q.timers_fault_set, "t1", "q", fault, 1, 50)
    sw = sweeper(dsn)
    packed = no_pack(sw)
    out = await sw.run_once()
    assert packed == [1]
    assert (out.fired, out.backoff) == ((0, 1) if fault == "permanent" else (1, 0))
    await sw.stop()


async def test_a_sweep_that_takes_nothing_reports_the_next_due_instant_and_the_pause(db):
    dsn, conn = db
    await schedule(conn, "t1", "q", ["later"], delays=[3_000], ready=True)
    sw = sweeper(dsn)
    out = await sw.run_once()
    assert (out.taken, out.paused) == (0, False) and 2_000 < out.next_due_ms <= 3_000
    await conn.execute("UPDATE queen_timer_switches SET sweeper_paused = true WHERE tenant = '*'")
    out = await sw.run_once()
    assert (out.taken, out.paused) == (0, True)
    await sw.stop()
