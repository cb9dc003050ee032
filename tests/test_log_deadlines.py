"""Deadlines on queued calls: a pop never hands out a message whose deadline passed (judged by the
database clock); it is filed in the DLQ as deadline_exceeded and counted in
queen_messages_expired_total. Messages without a deadline behave as before."""

from __future__ import annotations

import time

from conftest import uniq

from loadtest import prom


def push(http, q, items):
    r = http.post("/api/v1/push", json={"items": [{"queue": q, **it} for it in items]})
    assert r.status_code == 201, r.text
    return r.json()


def pop(http, q, **params):
    params.setdefault("wait", "false")
    r = http.get(f"/api/v1/pop/queue/{q}", params=params)
    return r.json()["messages"] if r.status_code == 200 else []


def expired_total(http) -> float:
    return prom.parse(http.get("/metrics").text).counter("queen_messages_expired_total")


def test_expired_messages_are_never_delivered_and_go_to_the_dlq(http):
    q = uniq("dl")
    before = expired_total(http)
    push(http, q, [{"payload": "keep-1"}, {"payload": "late", "deadlineMs": 1, "transactionId": "late"},
                   {"payload": "keep-2", "deadlineMs": 600_000}, {"payload": "late-2", "deadlineMs": 2}])
    time.sleep(0.05)
    msgs = pop(http, q, batch=10)
    assert [m["data"] for m in msgs] == ["keep-1", "keep-2"]
    res = http.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}
        for m in msgs]}).json()
    assert all(r["success"] for r in res)
    assert pop(http, q) == []  # nothing stuck behind the expired ones
    dlq = http.get("/api/v1/dlq", params={"queue": q}).json()
    assert dlq["total"] == 2
    assert {d["transactionId"] for d in dlq["messages"]} >= {"late"}
    assert all(d["errorMessage"] == "deadline_exceeded" and d["data"] in ("late", "late-2") for d in dlq["messages"])
    assert expired_total(http) >= before + 2


def test_a_queue_of_only_expired_messages_answers_204(http):
    q = uniq("dl-all")
    push(http, q, [{"payload": i, "deadlineMs": 1} for i in range(3)])
    time.sleep(0.05)
    assert http.get(f"/api/v1/pop/queue/{q}", params={"wait": "false"}).status_code == 204
    assert http.get("/api/v1/dlq", params={"queue": q}).json()["total"] == 3


def test_expired_with_auto_ack_and_for_each_group(http):
    q = uniq("dl-grp")
    push(http, q, [{"payload": "x", "deadlineMs": 1}, {"payload": "y"}])
    time.sleep(0.05)
    assert [m["data"] for m in pop(http, q, autoAck="true")] == ["y"]
    assert [m["data"] for m in pop(http, q, consumerGroup="g2", autoAck="true")] == ["y"]
    dlq = http.get("/api/v1/dlq", params={"queue": q}).json()["messages"]
    assert sorted(d["consumerGroup"] for d in dlq) == ["__QUEUE_MODE__", "g2"]


def test_a_deadline_in_the_future_is_delivered(http):
    q = uniq("dl-ok")
    push(http, q, [{"payload": "on time", "deadlineMs": 60_000}])
    assert [m["data"] for m in pop(http, q)] == ["on time"]
