"""broker.timers.service on its own: which schedules the broker stores as ready for the log; and the
schedule statement it sends (queen_timers_apply), by its two ways in."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
import zstandard
from helpers import apply_call, sql_apply

from broker.codec import Codec
from broker.store.pool import connect
from broker.store.queries import Q
from broker.timers.parse import TimerOp
from broker.timers.service import _call, log_ready


def _op(payload: bytes | None, zstd: bool = False, op: str = "schedule") -> TimerOp:
    return TimerOp(op=op, queue="q", key="k", txn="t", payload=payload, payload_zstd=zstd, delay_ms=0)


@pytest.mark.parametrize(("payload", "zstd", "threshold", "ready"), [
    (b'{"n": 1}', False, 1024, True),
    (b'"just a string"', False, 1024, True),
    (b"42", False, 0, True),  # no compression threshold at all
    (b"\xff not json", False, 1024, False),  # judged at the fire: a permanent failure, then the DLQ
    (b'{"n": 1', False, 1024, False),
    (zstandard.ZstdCompressor().compress(b'{"n": 1}'), True, 1024, False),  # the fire decompresses it
    (b'{"s": "' + b"x" * 2000 + b'"}', False, 1024, False),  # at or above the threshold: the fire may compress
    (None, False, 1024, False),
])
def test_only_what_the_fire_would_store_unchanged_is_ready(payload, zstd, threshold, ready):
    broker: Any = SimpleNamespace(codec=Codec(threshold))
    assert log_ready(broker, _op(payload, zstd)) is ready


# --- queen_timers_apply's two ways in (broker/sql/functions/timers.sql): a batch of new keys is one plain INSERT;
# an existing key, a claimed one or a concurrent schedule of the same key sends the batch to the general
# statement, with the same answers and nothing left behind by the attempt.

PENDING = "SELECT coalesce(sum(timers_pending), 0) FROM queen_usage_gauges WHERE tenant = $1"
ROWS = "SELECT timer_key, txn, partition, deliver_at = due_at AS due, payload_ready FROM queen_timers WHERE tenant = $1"


@pytest.fixture
async def conn(pg):
    c = await connect(pg.new_db())
    yield c
    await c.close()


async def stored(conn: asyncpg.Connection, tenant: str) -> dict[str, tuple]:
    return {r["timer_key"]: tuple(r)[1:] for r in await conn.fetch(ROWS, tenant)}


async def test_a_batch_of_new_keys_is_stored_as_sent_and_counted(conn):
    assert await sql_apply(conn, "ta", [("schedule", "q", f"k{i}") for i in range(3)]) == ["scheduled"] * 3
    assert await stored(conn, "ta") == {f"k{i}": (f"t-k{i}", "Default", True, True) for i in range(3)}
    assert await conn.fetchval(PENDING, "ta") == 3


async def test_an_existing_key_in_a_batch_of_schedules_is_rescheduled_and_the_attempt_leaves_nothing(conn):
    await sql_apply(conn, "tb", [("schedule", "q", "k1")], delay_ms=60_000)
    before = await conn.fetchval("SELECT message_id FROM queen_timers WHERE tenant = 'tb' AND timer_key = 'k1'")
    ops = [("schedule", "q", "k0"), ("schedule", "q", "k1"), ("schedule", "q", "k2")]
    assert await sql_apply(conn, "tb", ops) == ["scheduled", "rescheduled", "scheduled"]
    assert sorted(await stored(conn, "tb")) == ["k0", "k1", "k2"]
    assert await conn.fetchval("SELECT message_id FROM queen_timers WHERE tenant = 'tb' AND timer_key = 'k1'") != before
    assert await conn.fetchval(PENDING, "tb") == 3  # the rolled-back attempt's rows are not counted


async def test_a_claimed_key_in_a_batch_of_schedules_is_too_late_and_the_others_go_in(conn):
    await sql_apply(conn, "tc", [("schedule", "q", "held")])
    assert await conn.fetchval(Q.timers_hold, "tc", "q", "held", 60_000) is not None
    assert await sql_apply(conn, "tc", [("schedule", "q", "a"), ("schedule", "q", "held")]) == ["scheduled", "too_late"]
    assert sorted(await stored(conn, "tc")) == ["a", "held"]
    assert await conn.fetchval(PENDING, "tc") == 2


@pytest.mark.parametrize("first_commits", [True, False])
async def test_a_concurrent_schedule_of_the_same_key_waits_then_answers_by_what_committed(pg, first_commits):
    """A inserts b (uncommitted); B's batch [b, c] waits on it. A commits: B reschedules b (the attempt
    failed on b and the general statement decided); A rolls back: B's attempt goes through, both new."""
    dsn = pg.new_db()
    a, b = await connect(dsn), await connect(dsn)
    try:
        tx = a.transaction()
        await tx.start()
        assert await sql_apply(a, "td", [("schedule", "q", "a"), ("schedule", "q", "b")]) == ["scheduled"] * 2
        second = asyncio.ensure_future(sql_apply(b, "td", [("schedule", "q", "b"), ("schedule", "q", "c")]))
        await asyncio.sleep(0.3)
        assert not second.done()  # waiting for A's row b
        await (tx.commit() if first_commits else tx.rollback())
        got = await asyncio.wait_for(second, 10)
        assert got == (["rescheduled", "scheduled"] if first_commits else ["scheduled", "scheduled"])
        assert sorted(await stored(b, "td")) == (["a", "b", "c"] if first_commits else ["b", "c"])
        assert await b.fetchval(PENDING, "td") == (3 if first_commits else 2)
    finally:
        await a.close()
        await b.close()


async def _cancels(conn: asyncpg.Connection, tenant: str, keys: list[str]) -> list[tuple]:
    """Cancels of ``keys`` in queue q in one call, each with txn ``echo-<key>`` (one key: the one-cancel
    path; several: the general statement); (status, txn, message id, deliverAt) per key."""
    call = apply_call(tenant, [("cancel", "q", k) for k in keys], txns=[f"echo-{k}" for k in keys])
    return [tuple(r)[1:] for r in await conn.fetch(Q.timers_apply, *call.args())]


@pytest.mark.parametrize("one_at_a_time", [True, False])
async def test_a_single_cancel_answers_as_the_general_statement_does(conn, one_at_a_time):
    """One cancel takes its own path (lock by key, delete by ctid): cancelled with the stored txn, too_late
    for a leased row (kept), absent with the caller's txn; the pending gauge follows. The same keys in
    one call go through the general statement: the same answers."""
    t = f"one-{one_at_a_time}"
    await sql_apply(conn, t, [("schedule", "q", "live"), ("schedule", "q", "held")])
    assert await conn.fetchval(Q.timers_hold, t, "q", "held", 60_000) is not None
    keys = ["live", "held", "none"]
    if one_at_a_time:
        got = [row for k in keys for row in await _cancels(conn, t, [k])]
    else:
        got = await _cancels(conn, t, keys)
    assert got == [("cancelled", "t-live", None, None), ("too_late", "echo-held", None, None),
                   ("absent", "echo-none", None, None)]
    assert sorted(await stored(conn, t)) == ["held"]
    assert await conn.fetchval(PENDING, t) == 1


async def test_a_single_cancel_waits_for_a_reschedule_in_flight_and_deletes_what_it_committed(pg):
    """A reschedules k (uncommitted); B's one cancel of k waits on the row lock, then deletes the row as A
    left it: cancelled, with A's txn."""
    dsn = pg.new_db()
    a, b = await connect(dsn), await connect(dsn)
    try:
        await sql_apply(a, "tw", [("schedule", "q", "k")])
        tx = a.transaction()
        await tx.start()
        call = apply_call("tw", [("reschedule", "q", "k")], txns=["moved"])
        assert [r["status"] for r in await a.fetch(Q.timers_apply, *call.args())] == ["rescheduled"]
        cancel = asyncio.ensure_future(_cancels(b, "tw", ["k"]))
        await asyncio.sleep(0.3)
        assert not cancel.done()  # waiting for A's row lock
        await tx.commit()
        assert await asyncio.wait_for(cancel, 10) == [("cancelled", "moved", None, None)]
        assert await stored(b, "tw") == {}
        assert await b.fetchval(PENDING, "tw") == 0
    finally:
        await a.close()
        await b.close()


async def test_a_timer_needs_its_tenant_and_a_tenant_with_timers_stays(conn):
    """What the foreign key held, kept per statement (broker/sql/migrations/0021_timer_tenant_check.sql): a timer
    of a tenant missing from queen_tenants is refused, whoever writes it; a tenant with timers cannot be
    deleted; one without can."""
    insert = ("INSERT INTO queen_timers (tenant, queue, timer_key, txn, message_id, payload, deliver_at, due_at) "
              "SELECT $1, 'q', k, k, gen_random_uuid(), '{}', now(), now() FROM unnest($2::text[]) k")
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="nobody of new timers is not in queen_tenants"):
        await conn.execute(insert, "nobody", ["a", "b"])
    await conn.execute("INSERT INTO queen_tenants (tenant) VALUES ('te'), ('empty')")
    await conn.execute(insert, "te", ["a", "b"])
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="te still has timers"):
        await conn.execute("DELETE FROM queen_tenants WHERE tenant IN ('te', 'empty')")
    assert await conn.fetchval("SELECT count(*) FROM queen_timers WHERE tenant = 'te'") == 2
    await conn.execute("DELETE FROM queen_tenants WHERE tenant = 'empty'")
    assert await conn.fetchval("SELECT count(*) FROM queen_tenants WHERE tenant IN ('te', 'empty')") == 1


def test_columns_with_nothing_to_say_are_sent_as_null():
    """_call sends the partition, zstd and key-id columns as NULL when no op sets them (the statement
    reads that as all NULLs), and as arrays as soon as one op does."""
    broker: Any = SimpleNamespace(codec=Codec(1024), settings=SimpleNamespace(sweeper_max_sleep_ms=1000))
    who: Any = SimpleNamespace(tenant="t", sub="s")
    plain = [_op(b"{}"), TimerOp("cancel", "q", "k2", None)]
    call = _call(broker, who, plain, set(), check_switch=True, notify=True, meter_period_s=None)
    assert (call.partitions, call.zstd, call.key_ids) == (None, None, None)
    assert uuid.UUID(str(call.ids[0])).version == 7 and call.ids[1] is None  # an id minted for the schedule only
    mixed = [_op(b"{}"), TimerOp("schedule", "q", "k3", "t", "p1", b"x", True, 0)]
    call = _call(broker, who, mixed, set(), check_switch=True, notify=True, meter_period_s=None)
    assert call.partitions == [None, "p1"] and call.zstd == [False, True] and call.key_ids is None


async def test_null_columns_are_the_defaults(conn):
    call = apply_call("tn", [("schedule", "q", "a"), ("schedule", "q", "b")], payloads=[b"{}"] * 2, delay_ms=60_000)
    rows = await conn.fetch(Q.timers_apply, *call.args())
    assert [r["status"] for r in rows] == ["scheduled", "scheduled"]
    got = await conn.fetch("SELECT partition, payload_zstd, key_id FROM queen_timers WHERE tenant = 'tn'")
    assert [tuple(r) for r in got] == [("Default", False, None)] * 2
    # the general statement too (a cancel in the batch)
    call = apply_call("tn", [("schedule", "q", "c"), ("cancel", "q", "a")], payloads=[b"{}"] * 2, delay_ms=60_000)
    rows = await conn.fetch(Q.timers_apply, *call.args())
    assert [r["status"] for r in rows] == ["scheduled", "cancelled"]
    got = await conn.fetchrow("SELECT partition, payload_zstd, key_id FROM queen_timers WHERE tenant = 'tn' AND timer_key = 'c'")
    assert tuple(got) == ("Default", False, None)
