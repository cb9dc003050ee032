"""Push and queue resources through HTTP on the shared broker: shapes, dedupe, server-owned fields,
payload limits, zstd at rest, configure options, list/get/delete, lookups, refusals of garbage."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from conftest import run_sync, uniq
from helpers import db_fetch

DEFAULTS = {"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0, "maxSize": 0,
            "retentionSeconds": 0, "completedRetentionSeconds": 0, "encryptionEnabled": False}


def test_push_answers_201_one_object_per_item_in_order(api):
    q = uniq("push")
    r = api.push_items([{"queue": q, "partition": "p1", "payload": {"n": i}, "transactionId": f"t{i}"} for i in range(3)])
    assert r.status_code == 201
    body = r.json()
    assert [x["index"] for x in body] == [0, 1, 2]
    assert [x["transaction_id"] for x in body] == ["t0", "t1", "t2"]
    assert all(x["status"] == "queued" and x["queueName"] == q for x in body)
    assert set(body[0]) == {"index", "message_id", "transaction_id", "partition_id", "queueName", "status"}
    ids = [uuid.UUID(x["message_id"]) for x in body]
    assert all(i.version == 7 for i in ids) and len(set(ids)) == 3
    assert len({x["partition_id"] for x in body}) == 1


def test_duplicates_inside_one_request_and_across_requests(http, api):
    q = uniq("dup")
    first = api.push_items([{"queue": q, "payload": 1, "transactionId": "a"}, {"queue": q, "payload": 2, "transactionId": "a"},
                        {"queue": q, "payload": 3, "transactionId": "b"}]).json()
    assert [x["status"] for x in first] == ["queued", "duplicate", "queued"]
    assert first[1]["message_id"] == first[0]["message_id"]
    again = api.push_items([{"queue": q, "payload": 9, "transactionId": "b"}, {"queue": q, "payload": 9, "transactionId": "c"}]).json()
    assert [x["status"] for x in again] == ["duplicate", "queued"]
    assert again[0]["message_id"] == first[2]["message_id"]
    # same txn in another partition is a different message
    other = api.push_items([{"queue": q, "partition": "other", "payload": 1, "transactionId": "a"}]).json()
    assert other[0]["status"] == "queued"
    # the duplicate did not overwrite: pop sees 1, 3, 9 in order
    msgs = http.get(f"/api/v1/pop/queue/{q}/partition/Default?batch=10&wait=false").json()["messages"]
    assert [m["data"] for m in msgs] == [1, 3, 9]
    assert [m["offset"] for m in msgs] == [1, 2, 3]


def test_broker_mints_transaction_id_and_stamps_producer_sub(http, api):
    q = uniq("mint")
    r = api.push_items([{"queue": q, "payload": None}]).json()[0]
    assert r["transaction_id"] == r["message_id"]
    found = http.get("/api/v1/messages/lookup", params={"queue": q, "txn": r["transaction_id"]}).json()
    assert found["found"] is True and found["producerSub"] == "anonymous"
    assert found["messageId"] == r["message_id"] and found["partition"] == "Default"
    msg = http.get(f"/api/v1/pop/queue/{q}?wait=false").json()["messages"][0]
    assert msg["data"] is None and msg["producerSub"] == "anonymous"


@pytest.mark.parametrize("field", ["producerSub", "messageId", "tenant", "_secret", "_"])
def test_server_owned_fields_are_refused(http, field, api):
    q = uniq("owned")
    r = api.push_items([{"queue": q, "payload": 1}, {"queue": q, "payload": 2, field: "x"}])
    assert r.status_code == 400
    body = r.json()
    assert body["error"] == "bad_request" and body["reason"] == "server_owned_field" and body["field"] == field
    # nothing was written, not even the valid first item
    assert http.get("/api/v1/messages/lookup", params={"queue": q, "txn": "x"}).json()["found"] is False
    assert http.get(f"/api/v1/pop/queue/{q}?wait=false").status_code == 204


@pytest.mark.parametrize(("item", "path"), [
    ({"queue": "", "payload": 1}, "items[2].queue"),
    ({"queue": "q", "partition": 7, "payload": 1}, "items[2].partition"),
    ({"queue": "q"}, "items[2].payload"),
    ({"queue": "q", "payload": 1, "transactionId": ""}, "items[2].transactionId"),
    ({"queue": "q", "payload": 1, "traceId": "nope"}, "items[2].traceId"),
    ({"queue": "q", "payload": 1, "deadlineMs": 0}, "items[2].deadlineMs"),
    ({"queue": "q", "payload": 1, "colour": "red"}, "items[2].colour"),
    ("an item", "items[2]"),
])
def test_a_refused_item_is_named_by_its_path(http, item, path):
    ok = {"queue": "q", "payload": 1}
    r = http.post("/api/v1/push", json={"items": [ok, ok, item]})
    detail = r.json()["detail"]
    assert r.status_code == 400 and detail.startswith(path) and detail[len(path)] in " =", r.text


def test_optional_fields_are_kept_with_or_without_a_partition(http, api):
    """Items with only a queue and a payload take a shorter path through validation; an item that names
    no partition but sets a transaction id or a deadline must not be taken for one of them."""
    q = uniq("opt")
    api.push_items([{"queue": q, "payload": 1}, {"queue": q, "payload": 2, "transactionId": "t2"},
                    {"queue": q, "payload": 3, "deadlineMs": 600_000}])
    msgs = http.get(f"/api/v1/pop/queue/{q}?batch=10&wait=false").json()["messages"]
    assert [m["data"] for m in msgs] == [1, 2, 3]
    assert msgs[0]["deadlineAt"] is None and msgs[1]["transactionId"] == "t2" and msgs[1]["deadlineAt"] is None
    assert msgs[2]["deadlineAt"] is not None and msgs[2]["transactionId"] != "t2"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"items": {}}',
        b'{"items": [1]}',
        b'{"items": [{"payload": 1}]}',
        b'{"items": [{"queue": "", "payload": 1}]}',
        b'{"items": [{"queue": 5, "payload": 1}]}',
        b'{"items": [{"queue": "q", "partition": "", "payload": 1}]}',
        b'{"items": [{"queue": "q"}]}',
        b'{"items": [{"queue": "q", "payload": 1, "transactionId": 7}]}',
        b'{"items": [{"queue": "q", "payload": 1, "traceId": "nope"}]}',
        b'{"items": [{"queue": "q", "payload": 1, "deadlineMs": 0}]}',
        b'{"items": [{"queue": "q", "payload": 1, "deadlineMs": -5}]}',
        b'{"items": [{"queue": "q", "payload": 1, "deadlineMs": "100"}]}',
        b'{"items": [{"queue": "q", "payload": 1, "deadlineMs": 1.5}]}',
        b'{"items": [{"queue": "q", "payload": 1, "deadlineMs": true}]}',
        b'{"items": [{"queue": "q", "payload": 1, "colour": "red"}]}',
        b'{"items": [], "extra": 1}',
        b'{"items": [{"queue": "q", "payload": 1, "transactionId": "t\\u0000"}]}',
        b'{"items": [{"queue": "q\\u0000", "payload": 1}]}',
        b'{"items": [{"queue": "q", "payload": 1, "deadlineMs": 99999999999999999999999}]}',
    ],
)
def test_garbage_push_is_400_with_envelope(http, body):
    r = http.post("/api/v1/push", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    env = r.json()
    assert set(env) >= {"error", "reason", "detail"}


def test_empty_items_is_201_empty_array(api):
    r = api.push_items([])
    assert r.status_code == 201 and r.json() == []


def test_payload_over_plan_limit_is_413_and_writes_nothing(http, api):
    q = uniq("big")
    r = api.push_items([{"queue": q, "payload": "x" * (1024 * 1024 + 10)}])
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large"
    assert http.get(f"/api/v1/pop/queue/{q}?wait=false").status_code == 204


def test_large_payload_stored_zstd_and_round_trips(http, broker, api):
    q = uniq("zstd")
    doc = {"rows": [{"id": i, "name": "customer", "tags": ["a", "b"]} for i in range(300)]}
    r = api.push_items([{"queue": q, "payload": doc}, {"queue": q, "payload": {"small": True}}]).json()
    rows = db_fetch(broker.dsn, "SELECT codec, length(payload) AS n FROM queen_messages WHERE id = ANY($1::uuid[]) ORDER BY seq",
                    [uuid.UUID(x["message_id"]) for x in r])
    assert rows[0]["codec"] == 1 and rows[0]["n"] < 2000
    assert rows[1]["codec"] == 0
    msgs = http.get(f"/api/v1/pop/queue/{q}?batch=5&wait=false").json()["messages"]
    assert msgs[0]["data"] == doc and msgs[1]["data"] == {"small": True}


def test_configure_accepts_client_defaults_and_extras(http):
    q = uniq("cfg")
    opts = dict(DEFAULTS, dlqAfterMaxRetries=True, retryDelay=0, deadLetterQueue=True, maxWaitTimeSeconds=0,
                leaseTime=30, retryLimit=5)
    r = http.post("/api/v1/configure", json={"queue": q, "namespace": "ns", "task": "tk", "options": opts})
    assert r.status_code == 200
    body = r.json()
    assert body["configured"] is True and body["options"]["leaseTime"] == 30 and body["options"]["retryLimit"] == 5
    got = http.get(f"/api/v1/resources/queues/{q}").json()
    assert got["namespace"] == "ns" and got["options"]["deadLetterQueue"] is True
    listed = http.get("/api/v1/resources/queues", params={"namespace": "ns"}).json()["queues"]
    assert q in [x["name"] for x in listed]


@pytest.mark.parametrize(
    "options,key",
    [({"visibilityTimeout": 5}, "visibilityTimeout"), ({"leaseTime": "30"}, "leaseTime"), ({"leaseTime": 0}, "leaseTime"),
     ({"retryLimit": -1}, "retryLimit"), ({"encryptionEnabled": "yes"}, "encryptionEnabled")],
)
def test_configure_refuses_unknown_or_bad_options_naming_the_key(http, options, key):
    r = http.post("/api/v1/configure", json={"queue": uniq("cfg"), "options": dict(DEFAULTS, **options)})
    assert r.status_code == 400
    assert r.json()["option"] == key and key in r.json()["detail"]


@pytest.mark.parametrize("key", ["priority", "delayedProcessing", "windowBuffer", "maxSize", "retryDelay",
                                 "maxWaitTimeSeconds"])
def test_configure_keeps_the_gating_options_and_reads_them_back(http, broker, key):
    """Each is stored in queen_queues.options and read by push/pop through its generated column (their
    effects: tests/test_client_queue_options.py)."""
    q = uniq("cfg")
    r = http.post("/api/v1/configure", json={"queue": q, "options": dict(DEFAULTS, **{key: 5})})
    assert r.status_code in (200, 201) and r.json()["options"][key] == 5
    assert http.get(f"/api/v1/resources/queues/{q}").json()["options"][key] == 5
    [row] = db_fetch(broker.dsn, "SELECT priority, delay_s, window_s, max_size, retry_delay_ms, max_wait_s"
                          " FROM queen_queues WHERE name = $1", q)
    column = {"priority": "priority", "delayedProcessing": "delay_s", "windowBuffer": "window_s",
              "maxSize": "max_size", "retryDelay": "retry_delay_ms", "maxWaitTimeSeconds": "max_wait_s"}[key]
    assert {k: v for k, v in dict(row).items() if v} == {column: 5}


def test_configure_encryption_without_keys_is_refused(http):
    r = http.post("/api/v1/configure", json={"queue": uniq("enc"), "options": dict(DEFAULTS, encryptionEnabled=True)})
    assert r.status_code == 400 and r.json()["reason"] == "encryption_unavailable"


def test_delete_queue_and_delete_of_missing_queue_answers_deleted_false(http, api):
    q = uniq("del")
    api.push_items([{"queue": q, "payload": 1}])
    assert http.get(f"/api/v1/resources/queues/{q}").json()["partitions"][0]["messages"] == 1
    r = http.delete(f"/api/v1/resources/queues/{q}")
    assert r.status_code == 200 and r.json() == {"deleted": True, "queue": q}
    assert http.get(f"/api/v1/pop/queue/{q}?wait=false").status_code == 204
    r = http.delete(f"/api/v1/resources/queues/{q}")
    assert r.status_code == 200 and r.json() == {"deleted": False, "queue": q}
    assert http.get(f"/api/v1/resources/queues/{q}").status_code == 404


def test_lookup_and_message_get(http, api):
    q = uniq("look")
    r = api.push_items([{"queue": q, "partition": "pp", "payload": {"k": 1}, "transactionId": "tx-1",
                     "traceId": "5b0c9f4e-2f7c-4a52-9a3e-0f6c1d2e3f40"}]).json()[0]
    miss = http.get("/api/v1/messages/lookup", params={"queue": q, "txn": "nope"}).json()
    assert miss == {"found": False, "queue": q, "transactionId": "nope"}
    hit = http.get("/api/v1/messages/lookup", params={"queue": q, "txn": "tx-1"}).json()
    assert set(hit) == {"found", "queue", "partition", "partitionId", "messageId", "transactionId", "producerSub", "createdAt",
                        "deleted", "deletedAt"}
    assert hit["partitionId"] == r["partition_id"] and hit["createdAt"].endswith("Z")
    assert hit["deleted"] is False and hit["deletedAt"] is None  # a tombstone says so (docs/decisions.md §9)
    # another queue with the same txn is not found
    assert http.get("/api/v1/messages/lookup", params={"queue": uniq("x"), "txn": "tx-1"}).json()["found"] is False
    m = http.get(f"/api/v1/messages/{r['partition_id']}/tx-1").json()
    assert m["data"] == {"k": 1} and m["traceId"] == "5b0c9f4e-2f7c-4a52-9a3e-0f6c1d2e3f40" and m["offset"] == 1
    assert http.get(f"/api/v1/messages/{r['partition_id']}/nope").status_code == 404
    assert http.get("/api/v1/messages/not-a-uuid/tx-1").status_code == 400
    assert http.get("/api/v1/messages/lookup", params={"queue": q}).status_code == 400


def test_concurrent_pushes_to_one_partition_get_gapless_offsets(broker):
    import httpx

    q = uniq("conc")

    async def go():
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as c:
            await asyncio.gather(*[
                c.post("/api/v1/push", json={"items": [{"queue": q, "payload": [w, i]} for i in range(20)]}) for w in range(10)
            ])

    run_sync(go())
    rows = db_fetch(broker.dsn, "SELECT m.seq FROM queen_messages m JOIN queen_partitions p ON p.id = m.partition_id "
                            "WHERE p.queue = $1 ORDER BY m.seq", q)
    assert [r["seq"] for r in rows] == list(range(1, 201))
