"""Deadlines on queued calls: a pop never hands out a message whose deadline passed (judged by the
database clock); it is filed in the DLQ as deadline_exceeded and counted in
queen_messages_expired_total. Messages without a deadline behave as before."""

from __future__ import annotations

import asyncio
import time

from conftest import uniq
from helpers import db_fetch

from loadtest import prom
from loadtest.timefmt import parse_iso


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


def _ms(text: str) -> int:
    return round(parse_iso(text) * 1000)


def test_a_popped_message_carries_its_absolute_deadline(http, api, broker):
    """``deadlineAt`` is the instant fixed at push by the database clock: createdAt + deadlineMs exactly (both
    are the push transaction's now()), null for a message pushed without one; also in a group's pop."""
    q = uniq("dl-at")
    api.push_each(q, [{"payload": "timed", "deadlineMs": 45_000}, {"payload": "plain"}])
    db_now = db_fetch(broker.dsn, "SELECT now() AS t")[0]["t"].timestamp()
    for params in ({}, {"consumerGroup": "g-at"}):
        timed, plain = api.messages(q, batch=10, **params)
        assert (timed["data"], plain["data"]) == ("timed", "plain")
        assert _ms(timed["deadlineAt"]) - _ms(timed["createdAt"]) == 45_000
        assert timed["deadlineAt"].endswith("Z")  # ISO-8601 UTC, like every instant on the wire
        assert 44.0 < parse_iso(timed["deadlineAt"]) - db_now <= 45.0  # judged against the database clock
        assert "deadlineAt" in plain and plain["deadlineAt"] is None


def test_a_transaction_push_deadline_reaches_the_consumer(api):
    q = uniq("dl-at-tx")
    api.tx({"operations": [{"type": "push", "items": [{"queue": q, "partition": "Default", "payload": 1,
                                                        "deadlineMs": 30_000}]}]})
    (m,) = api.messages(q)
    assert _ms(m["deadlineAt"]) - _ms(m["createdAt"]) == 30_000


async def test_the_official_client_hands_the_deadline_to_a_consume_handler(broker, queen_client, ahttp):
    """The client passes a popped message's fields through as a dict: a handler reads ``deadlineAt`` and can
    check it right before its side effect (docs/queued-call-deadlines.md §4)."""
    q = uniq("dl-at-cl")
    r = await ahttp.post("/api/v1/push", json={"items": [
        {"queue": q, "partition": "Default", "payload": {"order": "o-1"}, "deadlineMs": 60_000},
        {"queue": q, "partition": "Default", "payload": {"order": "o-2"}}]})
    assert r.status_code == 201
    seen: list[tuple[str, str | None, str]] = []

    async def handler(msg):
        for m in msg if isinstance(msg, list) else [msg]:
            seen.append((m["data"]["order"], m.get("deadlineAt"), m["createdAt"]))

    await asyncio.wait_for(queen_client.queue(q).limit(2).idle_millis(3000).consume(handler), 20)
    assert [(o, d is None) for o, d, _ in seen] == [("o-1", False), ("o-2", True)]
    order, deadline_at, created_at = seen[0]
    assert deadline_at is not None and _ms(deadline_at) - _ms(created_at) == 60_000
