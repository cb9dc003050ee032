"""The ``timers`` rider of ``POST /api/v1/transaction``: timer ops in the same database transaction as
the bundle's pushes and acks, results of ``"type": "timer"`` in the flat index space after the ops."""

from __future__ import annotations

import time
from functools import partial

from conftest import uniq
from helpers import timer_op

sched = partial(timer_op, payload=b'{"r": 1}')


def test_rider_results_follow_the_flat_ops(http, api):
    q = uniq("rid")
    http.post("/api/v1/timers", json={"operations": [sched(q, "old", txn="old-txn")]})
    body = {
        "operations": [{"type": "push", "items": [{"queue": q, "payload": {"a": 1}, "transactionId": uniq("p")},
                                                  {"queue": q, "payload": {"a": 2}, "transactionId": uniq("p")}]}],
        "requiredLeases": [],
        "timers": [sched(q, "new", txn="new-txn"), {"op": "cancel", "queue": q, "timerKey": "old"},
                   {"op": "cancel", "queue": q, "timerKey": "ghost", "txn": "g"}],
    }
    r = http.post("/api/v1/transaction", json=body)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["success"] is True
    timers = [x for x in res["results"] if x.get("type") == "timer"]
    assert [x["index"] for x in timers] == [2, 3, 4]
    assert [x["status"] for x in timers] == ["scheduled", "cancelled", "absent"]
    assert timers[0]["txn"] == "new-txn" and timers[0]["messageId"] and timers[0]["deliverAt"].endswith("Z")
    assert timers[1]["txn"] == "old-txn" and timers[2] == {**timers[2], "ok": False, "txn": "g"}
    assert api.peek(q, "new").json()["found"] is True
    assert api.peek(q, "old").json()["found"] is False


def test_rider_only_bundle(http):
    q = uniq("rid")
    r = http.post("/api/v1/transaction", json={"operations": [], "requiredLeases": [], "timers": [sched(q, "k")]})
    assert r.status_code == 200 and r.json()["results"][0]["index"] == 0
    assert r.json()["results"][0]["type"] == "timer"


def test_a_bad_timer_op_refuses_the_whole_bundle(http, api):
    q = uniq("rid")
    ptxn = uniq("p")
    body = {"operations": [{"type": "push", "items": [{"queue": q, "payload": {}, "transactionId": ptxn}]}],
            "timers": [sched(q, "ok"), {**sched(q, "bad"), "producerSub": "forged"}]}
    r = http.post("/api/v1/transaction", json=body)
    assert r.status_code == 400 and r.json()["reason"] == "timers_server_owned_field"
    assert api.peek(q, "ok").json()["found"] is False
    assert http.get("/api/v1/messages/lookup", params={"queue": q, "txn": ptxn}).json()["found"] is False


def test_a_failed_ack_rolls_back_the_timers(http, api):
    q = uniq("rid")
    body = {"operations": [{"type": "ack", "transactionId": "nope", "partitionId": "00000000-0000-0000-0000-000000000000",
                            "status": "completed", "leaseId": "00000000-0000-0000-0000-000000000000"}],
            "timers": [sched(q, "k")]}
    r = http.post("/api/v1/transaction", json=body)
    assert r.status_code in (200, 400)
    assert r.json().get("success") is not True
    assert api.peek(q, "k").json()["found"] is False


def test_rider_timer_fires_like_any_other(http):
    q, txn = uniq("rid"), uniq("txn")
    http.post("/api/v1/transaction", json={"operations": [], "timers": [sched(q, "k", delay=0, txn=txn)]})
    deadline = time.monotonic() + 10
    while not http.get("/api/v1/messages/lookup", params={"queue": q, "txn": txn}).json()["found"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
