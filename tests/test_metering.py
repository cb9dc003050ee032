"""Metering: usage per tenant per period, per operation and never per call (docs/timer-routes.md
§13 "Metering", docs/decisions.md §5): a pushed message 1, a schedule 1, a reschedule 1, a cancel 0 (no refund), a fire 0, KV ops 1
each; nothing for a rolled-back call. One dedicated broker with auth on, so each test owns a tenant."""

from __future__ import annotations

import time
from functools import partial

import asyncpg
import pytest
from conftest import run_sync, uniq
from helpers import authed, dedicated_broker, timer_op

from broker import metering

SECRET = "metering-test-secret"
sched = partial(timer_op, delay=600_000, payload=b'{"x": 1}')


@pytest.fixture(scope="module")
def lb(pg, tmp_path_factory):
    env = {"QUEEN_JWT_SECRET": SECRET, "QUEEN_SWEEPER_MAX_SLEEP_MS": "100", "QUEEN_PERIOD_SECONDS": "86400"}
    with dedicated_broker(pg, tmp_path_factory, "metering", env) as b:
        yield b


def usage(c):
    r = c.get("/api/v1/usage")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_256_op_timer_batch_meters_exactly_256(lb):
    t = uniq("m")
    with authed(SECRET, lb, t) as c:
        assert usage(c)["messages"] == 0
        r = c.post("/api/v1/timers", json={"operations": [sched("q", f"k{i}") for i in range(256)]})
        assert r.status_code == 200, r.text
        assert all(x["status"] == "scheduled" for x in r.json()["results"])
        u = usage(c)
        assert u["messages"] == 256 and u["timersPending"] == 256 and u["tenant"] == t


def test_reschedule_counts_cancel_and_fire_do_not(lb):
    t = uniq("m")
    with authed(SECRET, lb, t) as c:
        c.post("/api/v1/timers", json={"operations": [sched("q", "a"), sched("q", "b")]})
        assert usage(c)["messages"] == 2
        r = c.post("/api/v1/timers", json={"operations": [sched("q", "a", op="reschedule"), sched("q", "b"),
                                                           {"op": "cancel", "queue": "q", "timerKey": "zz"}]})
        assert [x["status"] for x in r.json()["results"]] == ["rescheduled", "rescheduled", "absent"]
        assert usage(c)["messages"] == 4
        # cancel: 0, and no refund
        assert c.delete("/api/v1/timers/q/a").json()["status"] == "cancelled"
        assert c.post("/api/v1/timers", json={"operations": [{"op": "cancel", "queue": "q", "timerKey": "b"}]}).status_code == 200
        u = usage(c)
        assert u["messages"] == 4 and u["timersPending"] == 0
        # a fire: 0 (billed at schedule)
        c.post("/api/v1/timers", json={"operations": [sched("fq", "now", delay=0)]})
        assert usage(c)["messages"] == 5
        deadline = time.monotonic() + 10
        while c.get("/api/v1/timers/fq/now").json().get("found") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.get("/api/v1/timers/fq/now").json()["found"] is False
        u = usage(c)
        assert u["messages"] == 5 and u["timersPending"] == 0
        assert u["storageBytes"] > 0  # the fired message is now stored in the log


def test_push_meters_each_message_not_duplicates(lb):
    t, q = uniq("m"), uniq("q")
    with authed(SECRET, lb, t) as c:
        items = [{"queue": q, "partition": "p", "payload": {"i": i}, "transactionId": f"t{i}"} for i in range(7)]
        r = c.post("/api/v1/push", json={"items": items})
        assert r.status_code in (200, 201)
        assert usage(c)["messages"] == 7
        r = c.post("/api/v1/push", json={"items": items[:3]})
        assert [x["status"] for x in r.json()] == ["duplicate"] * 3
        assert usage(c)["messages"] == 7


def test_kv_ops_meter_per_op_and_aborted_calls_meter_nothing(lb):
    t = uniq("m")
    with authed(SECRET, lb, t) as c:
        ops = [{"op": "put", "ns": "n", "key": f"k{i}", "value": i, "forever": True} for i in range(5)]
        ops.append({"op": "getMany", "ns": "n", "keys": ["k0", "k1", "k2"]})
        assert c.post("/api/v1/kv", json={"operations": ops}).status_code == 200
        u = usage(c)
        assert u["kvOps"] == 6 and u["messages"] == 0
        lost = c.post("/api/v1/kv", json={"operations": [
            {"op": "put", "ns": "n", "key": "x", "value": 1, "forever": True},
            {"op": "check", "ns": "n", "key": "k0", "expect": 0, "required": True}]}).json()
        assert lost["reason"] == "kv_precondition"
        assert usage(c)["kvOps"] == 6
        # a transaction rolled back by its kv rider meters neither its pushes nor its kv ops
        body = c.post("/api/v1/transaction", json={
            "operations": [{"type": "push", "items": [{"queue": uniq("q"), "payload": 1, "transactionId": "x1"}]}],
            "kv": [{"op": "check", "ns": "n", "key": "k0", "expect": 0, "required": True}]}).json()
        assert body["success"] is False
        u = usage(c)
        assert u["kvOps"] == 6 and u["messages"] == 0


def test_usage_is_per_tenant_and_admin_sees_all(lb):
    a, b = uniq("ma"), uniq("mb")
    with authed(SECRET, lb, a) as ca, authed(SECRET, lb, b) as cb, authed(SECRET, lb, "ops", grants=("admin",)) as admin:
        ca.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k"}]})
        cb.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k"}] * 3})
        assert usage(ca)["kvOps"] == 1 and usage(cb)["kvOps"] == 3
        r = admin.get("/api/v1/admin/usage")
        assert r.status_code == 200
        rows = {x["tenant"]: x for x in r.json()["tenants"]}
        assert rows[a]["kvOps"] == 1 and rows[b]["kvOps"] == 3
        assert r.json()["periodStart"] < r.json()["periodEnd"]
        one = admin.get("/api/v1/admin/usage", params={"tenant": b}).json()["tenants"]
        assert [x["tenant"] for x in one] == [b]
        assert ca.get("/api/v1/admin/usage").status_code == 403


def test_record_is_transactional(pg):
    dsn = pg.new_db()

    async def go():
        from broker.store.pool import connect

        conn = await connect(dsn)
        try:
            tr = conn.transaction()
            await tr.start()
            await metering.record(conn, "t", messages=3, kv_ops=2)
            await tr.rollback()
            await metering.record(conn, "t", messages=2)
            await metering.record(conn, "t")  # nothing to meter: no statement
            async with conn.transaction():
                await metering.record(conn, "t", messages=1, kv_ops=4)
            rows = await metering.usage(conn, "t")
            with pytest.raises(ValueError):
                await metering.record(conn, "t", messages=-1)
            return rows
        finally:
            await conn.close()

    rows = run_sync(go())
    assert rows[0]["messages"] == 3 and rows[0]["kvOps"] == 4


def test_counters_never_scan_the_data(pg):
    """The meters and gauges are a handful of slot rows per tenant however much was written."""
    dsn = pg.new_db()

    async def go():
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "SELECT queen_push('t', array_fill('q'::text, ARRAY[500]), array_fill('p'::text, ARRAY[500]),"
                " (SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 500)),"
                " (SELECT array_agg(g::text) FROM generate_series(1, 500) g),"
                " array_fill(NULL::uuid, ARRAY[500]), array_fill('\\x7b7d'::bytea, ARRAY[500]),"
                " array_fill(0::smallint, ARRAY[500]), array_fill(NULL::text, ARRAY[500]),"
                " array_fill(NULL::text, ARRAY[500]), array_fill(NULL::bigint, ARRAY[500]))")
            n = await conn.fetchval("SELECT count(*) FROM queen_usage_gauges WHERE tenant = 't'")
            bytes_ = await conn.fetchval("SELECT sum(storage_bytes) FROM queen_usage_gauges WHERE tenant = 't'")
            await conn.execute("DELETE FROM queen_messages WHERE tenant = 't' AND seq <= 100")
            after = await conn.fetchval("SELECT sum(storage_bytes) FROM queen_usage_gauges WHERE tenant = 't'")
            return n, bytes_, after
        finally:
            await conn.close()

    n, bytes_, after = run_sync(go())
    assert n <= 16 and bytes_ == 1000 and after == 800
