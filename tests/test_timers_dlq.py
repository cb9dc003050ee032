"""A timer that keeps failing, end to end through HTTP: injected failures, backoff, the attempt budget,
its queue's DLQ under the synthetic consumer group, and the replay refusal. Plus the meter: billed for
the promise (schedule and reschedule ops), not for the cancel or the fire."""

from __future__ import annotations

import base64
from functools import partial

import httpx
from conftest import uniq
from helpers import timer_op, wait_for

ENV = {"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_ATTEMPTS": "3", "QUEEN_SWEEPER_BACKOFF_BASE_MS": "20",
       "QUEEN_SWEEPER_MAX_SLEEP_MS": "100"}
sched = partial(timer_op, delay=0, payload=b'{"x": 1}')


def test_failing_timer_goes_to_the_dlq_and_replay_is_refused(start_broker):
    b = start_broker(env=ENV, workers=2)
    q, txn = uniq("dlq"), uniq("txn")
    with httpx.Client(base_url=b.url) as c:
        assert c.post("/api/v1/test/timers/fail", json={"queue": q, "count": 10, "class": "permanent"}).json()["remaining"] == 10
        [res] = c.post("/api/v1/timers", json={"operations": [sched(q, "k", txn)]}).json()["results"]
        dlq = wait_for(lambda: c.get("/api/v1/dlq", params={"queue": q}).json()["messages"])
        assert c.get(f"/api/v1/timers/{q}/k").json()["found"] is False
        [row] = dlq
        assert row["transactionId"] == txn and row["consumerGroup"] == "__timers__"
        assert "injected permanent failure" in (row.get("errorMessage") or "")
        assert row.get("retryCount") == 3
        r = c.post(f"/api/v1/dlq/{row['id']}/replay")
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "dlq_replay_refused" and r.json()["reason"] == "synthetic_consumer_group"
        assert c.get("/api/v1/messages/lookup", params={"queue": q, "txn": txn}).json()["found"] is False
        assert res["messageId"]


def test_transient_failures_cost_nothing_and_the_timer_fires(start_broker):
    # enough failures, each backing off (doubling, at most 100 ms here), for the timer to be seen between
    # two of them: with 4 the window was ~0.3 s, and a busy run once missed it
    b = start_broker(env={**ENV, "QUEEN_SWEEPER_BACKOFF_CAP_MS": "100"}, workers=1)
    q, txn = uniq("tr"), uniq("txn")
    with httpx.Client(base_url=b.url) as c:
        c.post("/api/v1/test/timers/fail", json={"queue": q, "count": 20, "class": "transient"})
        c.post("/api/v1/timers", json={"operations": [sched(q, "k", txn)]})
        seen = wait_for(lambda: (p := c.get(f"/api/v1/timers/{q}/k").json()).get("lastError") and p)
        assert seen["attempts"] == 0 and seen["claimed"] is False
        wait_for(lambda: c.get("/api/v1/messages/lookup", params={"queue": q, "txn": txn}).json()["found"])
        assert c.get("/api/v1/dlq", params={"queue": q}).json()["messages"] == []


def test_billed_for_the_promise_not_the_cancel_or_the_fire(start_broker):
    b = start_broker(env=ENV, workers=1)
    q = uniq("bill")
    with httpx.Client(base_url=b.url) as c:
        before = c.get("/api/v1/usage").json()["messages"]
        r = c.post("/api/v1/timers", json={"operations": [sched(q, "a", "t1", delay=60_000), sched(q, "b", "t2", delay=0),
                                                          sched(q, "c", "t3", delay=60_000)]})
        assert r.status_code == 200
        c.post("/api/v1/timers", json={"operations": [{**sched(q, "a", "t4", delay=60_000), "op": "reschedule"}]})
        c.delete(f"/api/v1/timers/{q}/c")
        c.post("/api/v1/timers", json={"operations": [{"op": "cancel", "queue": q, "timerKey": "a"}]})
        wait_for(lambda: c.get("/api/v1/messages/lookup", params={"queue": q, "txn": "t2"}).json()["found"])
        assert c.get("/api/v1/usage").json()["messages"] - before == 4


def test_an_undeliverable_payload_reaches_the_dlq_as_json(start_broker):
    b = start_broker(env=ENV, workers=1)
    q, txn = uniq("bad"), uniq("txn")
    with httpx.Client(base_url=b.url) as c:
        op = {**sched(q, "k", txn), "payload": base64.b64encode(b"\xff\x00 not json").decode()}
        assert c.post("/api/v1/timers", json={"operations": [op]}).status_code == 200
        rows = wait_for(lambda: (r := c.get("/api/v1/dlq", params={"queue": q})).status_code == 200
                        and r.json()["messages"])
        data = rows[0]["data"]
        assert data["undeliverable"] is True and "JSON" in data["error"]
        assert base64.b64decode(data["payloadBase64"]) == b"\xff\x00 not json"
