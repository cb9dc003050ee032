"""The sweeper inside real ``queen serve`` processes: a worker killed with SIGKILL in the middle of a fire,
a broker drained with SIGTERM while holding a claim, and two brokers sharing one database."""

from __future__ import annotations

import os
import signal
import time
import uuid
from functools import partial

import httpx
from conftest import uniq
from helpers import db_fetch, frames, timer_op, wait_for

HOOKS = {"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}
sched = partial(timer_op, delay=0, payload=b'{"crash": "test"}')


def claim_of(dsn: str, queue: str) -> dict | None:
    rows = db_fetch(dsn, "SELECT claimed_by, claimed_until, claim_token FROM queen_timers WHERE queue = $1 "
                    "AND claim_token IS NOT NULL AND claimed_until > now()", queue)
    return dict(rows[0]) if rows else None


def test_kill_9_of_a_worker_mid_fire_loses_nothing_and_duplicates_nothing(start_broker):
    b = start_broker(env={**HOOKS, "QUEEN_SWEEPER_LEASE_MS": "1500"}, workers=2)
    q, txn = uniq("crash"), uniq("txn")
    with httpx.Client(base_url=b.url) as c:
        # the next fire of q stalls for 30 s between claim and commit: the worker dies in there
        assert c.post("/api/v1/test/timers/fail", json={"queue": q, "count": 1, "class": "stall", "ms": 30_000}).status_code == 200
        [res] = c.post("/api/v1/timers", json={"operations": [sched(q, "k", txn)]}).json()["results"]
        claim = wait_for(lambda: claim_of(b.dsn, q), 10, "claimed by a sweeper")
        pid = int(claim["claimed_by"].rsplit(":", 1)[1])
        assert pid in b.worker_pids()
        assert c.delete(f"/api/v1/timers/{q}/k").json()["status"] == "too_late"  # in somebody's hands
        os.kill(pid, signal.SIGKILL)
        found = wait_for(lambda: frames(b.dsn, txn), 15, "fired by another sweeper after the lease")
        assert len(found) == 1 and str(found[0]["id"]) == res["messageId"]
        assert found[0]["created_at"] >= claim["claimed_until"]  # not before the dead claim expired
        time.sleep(0.5)
        assert len(frames(b.dsn, txn)) == 1
        assert c.get(f"/api/v1/timers/{q}/k").json()["found"] is False
        msg = c.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": "2000"}).json()["messages"]
        assert [m["transactionId"] for m in msg] == [txn]


def test_sigterm_hands_back_held_claims(start_broker):
    a = start_broker(env={**HOOKS, "QUEEN_SWEEPER_LEASE_MS": "60000"}, workers=1)
    q, txn = uniq("drain"), uniq("txn")
    with httpx.Client(base_url=a.url) as c:
        c.post("/api/v1/test/timers/fail", json={"queue": q, "count": 1, "class": "stall", "ms": 60_000})
        c.post("/api/v1/timers", json={"operations": [sched(q, "k", txn)]})
        wait_for(lambda: claim_of(a.dsn, q), 10, "claimed")
    assert a.stop() == 0
    [row] = db_fetch(a.dsn, "SELECT claim_token, due_at <= now() AS due FROM queen_timers WHERE queue = $1", q)
    assert row["claim_token"] is None and row["due"] is True  # released at drain, due again at once
    assert frames(a.dsn, txn) == []
    b = start_broker(env=HOOKS, workers=1, dsn=a.dsn)
    t0 = time.monotonic()
    wait_for(lambda: frames(b.dsn, txn), 10, "fired by the next broker")
    assert time.monotonic() - t0 < 10  # far sooner than the 60 s lease


def test_two_brokers_on_one_database_fire_each_timer_once(start_broker):
    env = {"QUEEN_SWEEPER_MAX_SLEEP_MS": "5000"}  # a wake-up must come from NOTIFY, not from polling
    a = start_broker(env=env, workers=1)
    b = start_broker(env=env, workers=1, dsn=a.dsn)
    q = uniq("two")
    txns = [uniq("txn") for _ in range(6)]
    time.sleep(0.3)
    t0 = time.monotonic()
    for i, txn in enumerate(txns):
        url = (a if i % 2 else b).url
        r = httpx.post(f"{url}/api/v1/timers", json={"operations": [sched(q, f"k{i}", txn, delay=300)]})
        assert r.status_code == 200
    for txn in txns:
        wait_for(lambda txn=txn: frames(a.dsn, txn), 4, f"{txn} fired")
    assert time.monotonic() - t0 < 4.5
    for txn in txns:
        assert len(frames(a.dsn, txn)) == 1
    lag = db_fetch(a.dsn, "SELECT max(extract(epoch FROM created_at)) AS t FROM queen_messages")
    assert lag[0]["t"] is not None
    assert uuid.UUID(str(frames(a.dsn, txns[0])[0]["id"])).version == 7
