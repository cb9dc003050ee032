"""Deadlines on queued messages (docs/decisions.md §2, docs/queued-call-deadlines.md): a pop never hands
out an expired message; it lands in the DLQ with error deadline_exceeded."""

from __future__ import annotations

import time
import uuid

import pytest

from conformance.client import expect, expect_error, parse_ts, poll, pushed, uniq

contract = pytest.mark.contract


def _push(api, q: str, payload, deadline_ms=None, txn=None):
    item = {"queue": q, "partition": "Default", "payload": payload, "transactionId": txn or uuid.uuid4().hex}
    if deadline_ms is not None:
        item["deadlineMs"] = deadline_ms
    return api.http.post("/api/v1/push", json={"items": [item]})


@contract("DL-NOT-DELIVERED", "DL-TO-DLQ")
def test_expired_message_never_popped(api):
    q = uniq("q")
    dead, live = uuid.uuid4().hex, uuid.uuid4().hex
    pushed(_push(api, q, {"call": "charge"}, deadline_ms=100, txn=dead))
    pushed(_push(api, q, {"call": "later"}, txn=live))
    time.sleep(0.3)
    msgs = api.drain(q)
    assert [m["transactionId"] for m in msgs] == [live], f"an expired message was handed out: {msgs}"
    rows = poll(lambda: [m for m in api.dlq(q) if m.get("transactionId") == dead], timeout=5,
                what="the expired message in the DLQ")
    err = rows[0].get("errorMessage") or rows[0].get("error") or ""
    assert "deadline_exceeded" in str(err), f"DLQ row should carry error deadline_exceeded: {rows[0]}"


@contract("DL-LIVE-DELIVERED")
def test_message_within_deadline_delivered(api):
    q = uniq("q")
    txn, plain = uuid.uuid4().hex, uuid.uuid4().hex
    pushed(_push(api, q, {"n": 1}, deadline_ms=60_000, txn=txn))
    pushed(_push(api, q, {"n": 2}, txn=plain))
    msgs = api.drain(q)
    assert [m["transactionId"] for m in msgs] == [txn, plain], msgs
    assert [m["data"] for m in msgs] == [{"n": 1}, {"n": 2}]
    assert not [m for m in api.dlq(q) if m.get("transactionId") in (txn, plain)]


def _ms(text) -> int:
    assert isinstance(text, str) and text.endswith("Z"), f"deadlineAt should be an ISO-8601 UTC instant: {text!r}"
    return round(parse_ts(text) * 1000)


@contract("DL-POP-DEADLINE")
def test_popped_message_carries_the_deadline_fixed_at_push(api):
    q = uniq("q")
    timed, plain, in_tx = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    pushed(_push(api, q, {"n": 1}, deadline_ms=45_000, txn=timed))
    pushed(_push(api, q, {"n": 2}, txn=plain))
    tx = {"operations": [{"type": "push", "items": [{"queue": q, "partition": "Default", "payload": {"n": 3},
                                                     "transactionId": in_tx, "deadlineMs": 30_000}]}]}
    assert expect(api.http.post("/api/v1/transaction", json=tx), 200).get("success") is True
    # a leased pop (queue mode) and an auto-acked pop of another group both carry it
    leased = expect(api.http.get(f"/api/v1/pop/queue/{q}", params={"batch": "10", "wait": "false"}), 200)["messages"]
    grouped = expect(api.http.get(f"/api/v1/pop/queue/{q}", params={"batch": "10", "wait": "false", "autoAck": "true",
                                                                    "consumerGroup": uniq("g")}), 200)["messages"]
    for msgs in (leased, grouped):
        by_txn = {m["transactionId"]: m for m in msgs}
        assert set(by_txn) == {timed, plain, in_tx}, msgs
        for txn, budget in ((timed, 45_000), (in_tx, 30_000)):
            m = by_txn[txn]
            assert _ms(m.get("deadlineAt")) - _ms(m["createdAt"]) == budget, (
                f"deadlineAt should be the instant fixed at push, createdAt + deadlineMs: {m}")
        assert "deadlineAt" in by_txn[plain] and by_txn[plain]["deadlineAt"] is None, by_txn[plain]


@contract("DL-BAD-DEADLINE")
def test_bad_deadline_refused(api):
    q = uniq("q")
    for bad in (0, -5, "soon", 1.5, True, {"ms": 1}):
        txn = uuid.uuid4().hex
        expect_error(_push(api, q, {"x": 1}, deadline_ms=bad, txn=txn), 400)
        assert api.lookup(q, txn)["found"] is False


@contract("LOG-OWNED-FIELDS")
def test_push_server_owned_fields_refused(api):
    q = uniq("q")
    for field, value in (("producerSub", "billing-service"), ("messageId", str(uuid.uuid4())), ("tenant", "other"),
                         ("_internal", 1)):
        txn = uuid.uuid4().hex
        item = {"queue": q, "partition": "Default", "payload": {"x": 1}, "transactionId": txn, field: value}
        expect_error(api.http.post("/api/v1/push", json={"items": [item]}), 400)
        assert api.lookup(q, txn)["found"] is False, f"{field}: nothing pushed"
