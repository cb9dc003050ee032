"""The two read-only figures added for the console: ``GET /api/v1/timers-overview`` and
``oldestUnackedAt`` per consumer group in ``GET /api/v1/resources/queues/{queue}``."""

from __future__ import annotations

from datetime import datetime

from conftest import uniq
from helpers import timer_op


def ts(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_timers_overview_counts_per_queue_and_lists_next_due(http, api):
    q1, q2 = uniq("ov"), uniq("ov")
    ops = [timer_op(q1, "a", delay=60_000), timer_op(q1, "b", delay=30_000), timer_op(q1, "c", delay=90_000),
           timer_op(q2, "z", delay=45_000)]
    assert all(r["ok"] for r in api.timer_results(*ops))
    o = http.get("/api/v1/timers-overview").json()
    by_queue = {q["queue"]: q for q in o["queues"]}
    assert by_queue[q1]["pending"] == 3 and by_queue[q2]["pending"] == 1
    assert by_queue[q1]["claimed"] == 0 and by_queue[q1]["retrying"] == 0
    peek_b = http.get(f"/api/v1/timers/{q1}/b").json()
    assert by_queue[q1]["nextDueAt"] == peek_b["deliverAt"]  # the earliest of the queue
    assert o["pending"] >= 4 and o["truncated"] is False
    dues = [ts(n["dueAt"]) for n in o["next"]]
    assert dues == sorted(dues) and len(o["next"]) <= 20
    assert ts(o["now"]) < ts(by_queue[q1]["nextDueAt"])
    http.delete(f"/api/v1/timers/{q1}/b")
    assert {q["queue"]: q for q in http.get("/api/v1/timers-overview").json()["queues"]}[q1]["pending"] == 2


def test_oldest_unacked_message_per_consumer_group(http):
    q = uniq("ou")
    assert http.post("/api/v1/push", json={"items": [{"queue": q, "payload": i} for i in range(3)]}).status_code == 201
    popped = http.get(f"/api/v1/pop/queue/{q}", params={"batch": 1, "consumerGroup": "g"}).json()
    m = popped["messages"][0]
    groups = http.get(f"/api/v1/resources/queues/{q}").json()["consumerGroups"]
    assert groups[0]["name"] == "g" and groups[0]["pending"] == 3
    first = groups[0]["oldestUnackedAt"]
    assert first is not None
    ack = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": popped["leaseId"],
           "status": "completed", "consumerGroup": "g"}
    assert http.post("/api/v1/ack", json=ack).json()[0]["success"] is True
    g = http.get(f"/api/v1/resources/queues/{q}").json()["consumerGroups"][0]
    assert g["pending"] == 2 and ts(g["oldestUnackedAt"]) >= ts(first)
    # everything acked: nothing is unacked
    rest = http.get(f"/api/v1/pop/queue/{q}", params={"batch": 10, "consumerGroup": "g"}).json()
    acks = [{"transactionId": x["transactionId"], "partitionId": x["partitionId"], "leaseId": rest["leaseId"],
             "status": "completed"} for x in rest["messages"]]
    assert all(r["success"] for r in http.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": "g"}).json())
    g = http.get(f"/api/v1/resources/queues/{q}").json()["consumerGroups"][0]
    assert g["pending"] == 0 and g["oldestUnackedAt"] is None
