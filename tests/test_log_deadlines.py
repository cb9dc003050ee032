"""Deadlines on queued calls: a pop never hands out a message whose deadline passed (judged by the
database clock); it is filed in the DLQ as deadline_exceeded and counted in
queen_messages_expired_total. Messages without a deadline behave as before."""

from __future__ import annotations

import time

from conftest import uniq

from loadtest import prom


def expired_total(http) -> float:
    return prom.parse(http.get("/metrics").text).counter("queen_messages_expired_total")


def test_expired_messages_are_never_delivered_and_go_to_the_dlq(http, api):
    q = uniq("dl")
    before = expired_total(http)
    api.push_each(q, [{"payload": "keep-1"}, {"payload": "late", "deadlineMs": 1, "transactionId": "late"},
                   {"payload": "keep-2", "deadlineMs": 600_000}, {"payload": "late-2", "deadlineMs": 2}])
    time.sleep(0.05)
    msgs = api.messages(q, batch=10)
    assert [m["data"] for m in msgs] == ["keep-1", "keep-2"]
    res = http.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}
        for m in msgs]}).json()
    assert all(r["success"] for r in res)
    assert api.messages(q) == []  # nothing stuck behind the expired ones
    dlq = http.get("/api/v1/dlq", params={"queue": q}).json()
    assert dlq["total"] == 2
    assert {d["transactionId"] for d in dlq["messages"]} >= {"late"}
    assert all(d["errorMessage"] == "deadline_exceeded" and d["data"] in ("late", "late-2") for d in dlq["messages"])
    assert expired_total(http) >= before + 2


def test_a_queue_of_only_expired_messages_answers_204(http, api):
    q = uniq("dl-all")
    api.push_each(q, [{"payload": i, "deadlineMs": 1} for i in range(3)])
    time.sleep(0.05)
    assert http.get(f"/api/v1/pop/queue/{q}", params={"wait": "false"}).status_code == 204
    assert http.get("/api/v1/dlq", params={"queue": q}).json()["total"] == 3


def test_expired_with_auto_ack_and_for_each_group(http, api):
    q = uniq("dl-grp")
    api.push_each(q, [{"payload": "x", "deadlineMs": 1}, {"payload": "y"}])
    time.sleep(0.05)
    assert [m["data"] for m in api.messages(q, autoAck="true")] == ["y"]
    assert [m["data"] for m in api.messages(q, consumerGroup="g2", autoAck="true")] == ["y"]
    dlq = http.get("/api/v1/dlq", params={"queue": q}).json()["messages"]
    assert sorted(d["consumerGroup"] for d in dlq) == ["__QUEUE_MODE__", "g2"]


def test_a_deadline_in_the_future_is_delivered(api):
    q = uniq("dl-ok")
    api.push_each(q, [{"payload": "on time", "deadlineMs": 60_000}])
    assert [m["data"] for m in api.messages(q)] == ["on time"]
