"""Acks and the DLQ through HTTP: single and batch acks, nack redelivery, retry exhaustion to the DLQ,
explicit dlq, refusals answered 200 per item, out-of-order acks, DLQ listing, replay and the refusal
to replay a synthetic (timer) dead letter."""

from __future__ import annotations

import uuid

from conftest import uniq
from helpers import db_fetch

# A dead letter the sweeper files for a timer that kept failing (consumer group __timers__, synthetic).
SYNTHETIC_DLQ_ROW = ("INSERT INTO queen_dlq (tenant, id, queue, partition, consumer_group, synthetic, message_id, txn,"
                     " payload, error, retry_count) VALUES ('default', $1, $2, 'Default', '__timers__', true, $3, $4,"
                     " $5, $6, 5)")


def test_single_ack_answers_one_element_array(api):
    q = uniq("ack")
    api.push(q, ["a", "b"])
    m = api.messages(q, batch=1)[0]
    res = api.ack(m)
    assert isinstance(res, list) and len(res) == 1
    assert res[0]["success"] is True and res[0]["error"] is None and res[0]["transactionId"] == m["transactionId"]
    # the lease covered one message, fully acked: the partition is free again at once
    assert [x["data"] for x in api.messages(q)] == ["b"]
    # acking twice is idempotent
    assert api.ack(m)[0]["success"] is True


def test_refusals_are_200_with_per_item_errors(api):
    q = uniq("refuse")
    api.push(q, ["a"])
    m = api.messages(q)[0]
    bad_lease = api.ack(m, leaseId=str(uuid.uuid4()))[0]
    assert bad_lease["success"] is False and bad_lease["error"] == "Invalid or expired lease"
    garbage_lease = api.ack(m, leaseId="garbage")[0]
    assert garbage_lease["success"] is False
    unknown = api.ack(dict(m, transactionId="never-pushed"))[0]
    assert unknown["success"] is False and unknown["error"] == "Message not found"
    no_lease = api.ack(dict(m, leaseId=None))[0]
    assert no_lease["success"] is False and "leaseId" in no_lease["error"]
    assert api.ack(m)[0]["success"] is True


def test_bad_ack_bodies_are_400(http):
    pid = str(uuid.uuid4())
    for body in ({}, {"transactionId": "t"}, {"transactionId": "t", "partitionId": "nope"},
                 {"transactionId": "t", "partitionId": pid, "status": "maybe"}, {"transactionId": 5, "partitionId": pid}):
        r = http.post("/api/v1/ack", json=body)
        assert r.status_code == 400, body
    assert http.post("/api/v1/ack/batch", json={"acknowledgments": "x"}).status_code == 400
    for params in ({"offset": str(10**30)}, {"limit": "-3"}, {"from": "yesterday"}, {"queue": "\x00"}):
        assert http.get("/api/v1/dlq", params=params).status_code in (200, 400), params
    assert http.post("/api/v1/ack/batch", content=b"{", headers={"content-type": "application/json"}).status_code == 400


def test_out_of_order_acks_move_the_cursor_only_over_done_messages(api):
    q = uniq("ooo")
    api.push(q, [1, 2, 3, 4])
    msgs = api.messages(q, batch=3)
    assert api.ack(msgs[1])[0]["success"] and api.ack(msgs[2])[0]["success"]
    assert api.messages(q) == []  # lease still holds message 1
    assert api.ack(msgs[0])[0]["success"]
    assert [m["data"] for m in api.messages(q, batch=10)] == [4]


def test_nack_redelivers_then_exhausted_retries_go_to_the_dlq(http, api):
    q = uniq("retry")
    api.configure(q, retryLimit=1, leaseTime=60)
    api.push(q, ["poison", "next"])
    m = api.messages(q, batch=10)
    first = api.ack(m[0], status="failed", error="boom 1")[0]
    assert first["success"] is True and first["dlq"] is False
    again = api.messages(q, batch=10)
    assert [x["data"] for x in again] == ["poison", "next"] and again[0]["deliveryAttempt"] == 2
    last = api.ack(again[0], status="failed", error="boom 2")[0]
    assert last["dlq"] is True
    # the poison message is gone; the next one is delivered (again, its lease was released)
    rest = api.messages(q, batch=10)
    assert [x["data"] for x in rest] == ["next"]
    dlq = http.get("/api/v1/dlq", params={"queue": q, "limit": 10, "offset": 0}).json()
    assert dlq["total"] == 1
    d = dlq["messages"][0]
    assert d["data"] == "poison" and d["errorMessage"] == "boom 2" and d["retryCount"] == 2
    assert d["consumerGroup"] == "__QUEUE_MODE__" and d["synthetic"] is False and d["queueName"] == q


def test_status_dlq_files_a_dead_letter_at_once(http, api):
    q = uniq("dlqnow")
    api.push(q, [{"bad": True}])
    m = api.messages(q, consumerGroup="g1")[0]
    r = http.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "dlq", "error": "unparseable",
         "leaseId": m["leaseId"]}], "consumerGroup": "g1"}).json()
    assert r[0]["success"] is True and r[0]["dlq"] is True
    got = http.get("/api/v1/dlq", params={"queue": q, "consumerGroup": "g1"}).json()
    assert got["total"] == 1 and got["messages"][0]["errorMessage"] == "unparseable"
    assert http.get("/api/v1/dlq", params={"queue": q, "consumerGroup": "other"}).json() == {
        "messages": [], "total": 0, "limit": 100, "offset": 0}


def test_replay_requeues_a_new_message_and_refuses_synthetic_rows(http, broker, api):
    q = uniq("replay")
    api.push(q, ["again"], partition="px")
    m = api.messages(q)[0]
    api.ack(m, status="dlq", error="later")
    row = http.get("/api/v1/dlq", params={"queue": q}).json()["messages"][0]
    r = http.post(f"/api/v1/dlq/{row['id']}/replay")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["replayed"] is True and body["queue"] == q and body["partition"] == "px"
    assert body["messageId"] != m["id"] and body["transactionId"].startswith(m["transactionId"])
    again = api.messages(q)
    assert [x["data"] for x in again] == ["again"] and again[0]["producerSub"] == m["producerSub"]
    assert http.get("/api/v1/dlq", params={"queue": q}).json()["total"] == 0
    assert http.post(f"/api/v1/dlq/{row['id']}/replay").status_code == 404
    assert http.post("/api/v1/dlq/not-a-uuid/replay").status_code == 400

    synthetic_id = uuid.uuid4()

    db_fetch(broker.dsn, SYNTHETIC_DLQ_ROW, synthetic_id, q, uuid.uuid4(), "timer-txn", b'"x"', "fire failed")

    db_fetch(broker.dsn, SYNTHETIC_DLQ_ROW, uuid.uuid4(), q, uuid.uuid4(), "timer-raw", b"\xff\x00\xfe", "payload is not JSON")
    rows = {d["transactionId"]: d for d in http.get("/api/v1/dlq", params={"queue": q}).json()["messages"]}
    assert rows["timer-txn"]["data"] == "x"
    assert rows["timer-raw"]["data"] is None and rows["timer-raw"]["payloadBase64"] == "/wD+"
    r = http.post(f"/api/v1/dlq/{synthetic_id}/replay")
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "dlq_replay_refused" and body["reason"] == "synthetic_consumer_group" and body["detail"]
    listed = http.get("/api/v1/dlq", params={"queue": q}).json()["messages"]
    assert all(d["synthetic"] is True and d["consumerGroup"] == "__timers__" for d in listed)
    assert api.messages(q) == []


def test_the_same_message_twice_in_one_batch(http, api):
    q = uniq("twice")
    api.push(q, [1, 2, 3])
    msgs = api.messages(q, batch=3)
    body = {"acknowledgments": [{k: m[k] for k in ("transactionId", "partitionId", "leaseId")} | {"status": "completed"}
                                for m in (msgs[2], msgs[2], msgs[0], msgs[0])]}
    r = http.post("/api/v1/ack/batch", json=body)
    assert r.status_code == 200 and all(x["success"] for x in r.json())
    assert api.messages(q) == []  # message 2 still leased
    assert api.ack(msgs[1])[0]["success"]
    assert api.messages(q) == [] and http.get(f"/api/v1/resources/queues/{q}").json()["consumerGroups"][0]["pending"] == 0
