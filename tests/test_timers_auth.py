"""Who may do what on the timer surface, and what the operator switches and limit rungs refuse.

One dedicated broker with authentication on (HS256) and fast limit refresh. Covers: the produce grant
on POST, the DELETE cancel's own authorization class (any principal of the tenant; no grant, no
limits, no kill switch), tenant isolation, producerSub from the credential, a blocked cluster refusing a
POST batch whole with the hint header, the scheduling kill switch (503 / 403 in a transaction) and the
sweeper pause.
"""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import uniq
from helpers import authed, dedicated_broker, timer_op, wait_for

from broker.errors import TIMERS_HINT_HEADER, TIMERS_HINT_VALUE

SECRET = "timers-auth-test-secret"


@pytest.fixture(scope="module")
def srv(pg, tmp_path_factory):
    env = {"QUEEN_JWT_SECRET": SECRET, "QUEEN_TEST_HOOKS": "1", "QUEEN_LIMITS_REFRESH_MS": "50",
           "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}
    with dedicated_broker(pg, tmp_path_factory, "timers-auth", env) as b:
        yield b


def test_post_needs_the_produce_grant_and_delete_needs_no_grant(srv):
    q = uniq("ta")
    producer = authed(SECRET, srv, "acme", "svc-producer", ["produce"])
    reader = authed(SECRET, srv, "acme", "svc-reader", ["consume"])
    r = reader.timers(timer_op(q, "k"))
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert producer.timers(timer_op(q, "k", txn="t1")).json()["results"][0]["status"] == "scheduled"
    nobody = authed(SECRET, srv, "acme", "svc-nothing", [])
    r = nobody.delete(f"/api/v1/timers/{q}/k")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["txn"] == "t1"


def test_delete_still_needs_a_credential(srv):
    r = httpx.delete(f"{srv.url}/api/v1/timers/q/k")
    assert r.status_code == 401


def test_tenants_are_isolated(srv):
    q = uniq("ta")
    a = authed(SECRET, srv, "tenant-a", "a", ["produce"])
    b = authed(SECRET, srv, "tenant-b", "b", ["produce", "consume"])
    a.timers(timer_op(q, "shared-key", txn="a-txn"))
    assert b.get(f"/api/v1/timers/{q}/shared-key").json()["found"] is False
    assert b.get(f"/api/v1/timers/{q}").json()["rows"] == []
    r = b.delete(f"/api/v1/timers/{q}/shared-key", params={"txn": "b-guess"})
    assert r.json() == {"ok": False, "status": "absent", "queue": q, "timerKey": "shared-key", "txn": "b-guess"}
    assert a.get(f"/api/v1/timers/{q}/shared-key").json()["found"] is True
    # the same key in tenant b is a different timer
    assert b.timers(timer_op(q, "shared-key")).json()["results"][0]["status"] == "scheduled"


def test_producer_sub_comes_from_the_credential(srv):
    q, txn = uniq("ta"), uniq("txn")
    c = authed(SECRET, srv, "acme", "billing-service", ["produce", "consume"])
    res = c.timers(timer_op(q, "k", delay=0, txn=txn)).json()["results"][0]
    assert c.get(f"/api/v1/timers/{q}/k").json().get("producerSub") in ("billing-service", None)
    found = wait_for(lambda: (b := c.get("/api/v1/messages/lookup", params={"queue": q, "txn": txn}).json())
                       .get("found") and b)
    assert found["producerSub"] == "billing-service" and found["messageId"] == res["messageId"]


def test_blocked_cluster_refuses_the_post_batch_whole_but_delete_cancels(srv):
    q = uniq("ta")
    admin = authed(SECRET, srv, "ops", "operator", ["admin"])
    c = authed(SECRET, srv, "acme", "svc", ["produce"])
    c.timers(timer_op(q, "pending", txn="p1"))
    assert admin.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).status_code == 200
    try:
        r = wait_for(lambda: (x := c.timers({"op": "cancel", "queue": q, "timerKey": "pending"}, timer_op(q, "new")))
                       .status_code == 403 and x)
        assert r.json()["error"] == "cluster_suspended"
        assert r.headers[TIMERS_HINT_HEADER] == TIMERS_HINT_VALUE
        assert c.get(f"/api/v1/timers/{q}/new").json()["found"] is False  # nothing of the batch applied
        assert c.get(f"/api/v1/timers/{q}/pending").json()["found"] is True
        r = c.delete(f"/api/v1/timers/{q}/pending")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
    finally:
        admin.post("/api/v1/admin/cluster/suspended", json={"suspended": False})
    wait_for(lambda: c.timers(timer_op(q, "after")).status_code == 200)


def test_scheduling_kill_switch(srv):
    q = uniq("ta")
    admin = authed(SECRET, srv, "ops", "operator", ["admin"])
    c = authed(SECRET, srv, "acme", "svc", ["produce", "consume"])
    c.timers(timer_op(q, "pending", txn="p1"))
    assert c.post("/api/v1/admin/timers/scheduling", json={"enabled": False}).status_code == 403  # admin only
    r = admin.post("/api/v1/admin/timers/scheduling", json={"enabled": False})
    assert r.status_code == 200 and r.json()["schedulingEnabled"] is False
    try:
        assert admin.get("/api/v1/admin/timers/scheduling").json()["schedulingEnabled"] is False
        r = c.timers(timer_op(q, "new"))  # cluster-wide, at once, on every worker: the state is in the database
        assert r.status_code == 503
        assert r.json()["error"] == "timers_disabled" and r.json()["reason"] == "timers_disabled"
        assert r.headers[TIMERS_HINT_HEADER] == TIMERS_HINT_VALUE and int(r.headers["Retry-After"]) >= 1
        r = c.post("/api/v1/transaction", json={"operations": [], "timers": [timer_op(q, "tx")]})
        assert r.status_code == 403 and r.json()["error"] == "timers_disabled"
        assert c.delete(f"/api/v1/timers/{q}/pending").json()["status"] == "cancelled"
        assert c.get(f"/api/v1/timers/{q}/new").json()["found"] is False
    finally:
        admin.post("/api/v1/admin/timers/scheduling", json={"enabled": True})
    assert c.timers(timer_op(q, "new")).status_code == 200


def test_sweeper_pause_and_resume(srv):
    q, txn = uniq("ta"), uniq("txn")
    admin = authed(SECRET, srv, "ops", "operator", ["admin"])
    c = authed(SECRET, srv, "acme", "svc", ["produce", "consume"])
    r = admin.post("/api/v1/admin/timers/sweeper", json={"paused": True})
    assert r.status_code == 200 and r.json()["paused"] is True
    try:
        c.timers(timer_op(q, "k", delay=0, txn=txn))
        time.sleep(0.8)  # several sweep cycles (max sleep 200 ms)
        peek = c.get(f"/api/v1/timers/{q}/k").json()
        assert peek["found"] is True and peek["claimed"] is False
        assert admin.get("/api/v1/admin/timers/sweeper").json()["paused"] is True
    finally:
        admin.post("/api/v1/admin/timers/sweeper", json={"paused": False})
    wait_for(lambda: c.get("/api/v1/messages/lookup", params={"queue": q, "txn": txn}).json().get("found"), 5)


def test_admin_switch_bodies_are_validated(srv):
    admin = authed(SECRET, srv, "ops", "operator", ["admin"])
    assert admin.post("/api/v1/admin/timers/sweeper", json={"paused": "yes"}).status_code == 400
    assert admin.post("/api/v1/admin/timers/scheduling", json={"enabled": True, "x": 1}).status_code == 400


def test_test_hooks_are_refused_without_the_flag(start_broker):
    b = start_broker(workers=1)
    for path, body in [("fail", {"queue": "q", "count": 1, "class": "permanent"}),
                       ("hold", {"queue": "q", "timerKey": "k", "ms": 100}), ("release", {})]:
        r = httpx.post(f"{b.url}/api/v1/test/timers/{path}", json=body)
        assert r.status_code == 403 and r.json()["error"] == "test_hooks_disabled", r.text
