"""Deleting one message (``DELETE /api/v1/messages/{pid}/{txn}``, docs/decisions.md §9): a tombstone at
its offset. Groups with a cursor pass over it at once, groups that come later pass over it in the pop,
a lease holding it acks the rest, its dead letters and its stored bytes go, and the deletion is counted
and traced. Black-box over HTTP on the shared broker, plus the database for what only it shows."""

from __future__ import annotations

import uuid

import httpx
from conftest import uniq
from helpers import Api, db_fetch, refused
from test_metrics import sample


def _path(m: dict) -> str:
    return f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}"


def _listed(api, q: str, **params) -> list[dict]:  # type: ignore[no-untyped-def]
    r = api.http.get("/api/v1/messages", params={"queue": q, **params})
    assert r.status_code == 200, r.text
    return list(reversed(r.json()["messages"]))


def _delete(api, m: dict) -> dict:  # type: ignore[no-untyped-def]
    r = api.http.delete(_path(m))
    assert r.status_code == 200, r.text
    return r.json()


def test_groups_with_cursors_pass_over_it_at_once_and_later_groups_in_the_pop(api):
    q = uniq("del-groups")
    api.push(q, [0, 1, 2, 3])
    # two groups read the first message, so both hold a cursor at offset 1
    for g in ("ga", "gb"):
        [m] = api.messages(q, consumerGroup=g, batch="1")
        assert m["data"] == 0 and api.ack(m, consumerGroup=g)[0]["success"]
    msgs = _listed(api, q)
    _delete(api, msgs[1])
    # the cursors moved over it in the delete itself: depth counts only what is left
    depth = api.http.get(f"/api/v1/resources/queues/{q}/depth", params={"group": "ga"}).json()
    assert depth["pending"] == 2, depth
    for g in ("ga", "gb"):
        got = api.messages(q, consumerGroup=g, batch="10")
        assert [m["data"] for m in got] == [2, 3], (g, got)
        assert all(r["success"] for r in api.ack_all(got, group=g))
    # a group that starts now never sees it; autoAck (commit at delivery) neither
    got = api.messages(q, consumerGroup="late", batch="10")
    assert [m["data"] for m in got] == [0, 2, 3]
    assert [m["data"] for m in api.messages(q, consumerGroup="auto", batch="10", autoAck="true")] == [0, 2, 3]
    # a deleted tail: nothing left to deliver, and the partition is not held by it
    _delete(api, msgs[3])
    assert api.messages(q, consumerGroup="tail", batch="1") and api.messages(q, consumerGroup="tail", batch="5") == []


def test_a_lease_holding_it_acks_the_rest_and_is_released(api):
    q = uniq("del-lease")
    api.push(q, ["a", "b", "c"])
    a, b, c = api.messages(q, batch="3")
    _delete(api, b)
    # the listing shows the lease still over the others, the tombstone deleted
    assert [m["status"] for m in _listed(api, q)] == ["leased", "deleted", "leased"]
    assert api.ack(a)[0]["success"] and api.ack(c)[0]["success"]
    assert api.ack(b)[0]["success"]  # already done: acks are idempotent
    api.push(q, ["d"])
    [d] = api.messages(q, batch="5")
    assert d["data"] == "d" and api.ack(d)[0]["success"]
    # the lease ending instead of being acked: what it covered comes back, without the tombstone
    api.push(q, ["e", "f", "g"])
    e, f, g = api.messages(q, batch="3")
    _delete(api, f)
    assert api.ack(e, status="failed")[0]["success"]  # a nack releases the lease: f and g are redelivered
    assert [m["data"] for m in api.messages(q, batch="5")] == ["e", "g"]


def test_payload_storage_dead_letters_trace_and_counter(start_broker):
    """On a broker and database of its own: the tenant's storage gauge is compared before and after, and
    on the shared broker an earlier test's timer firing into the same tenant moved it in between."""
    broker = start_broker(workers=1)
    with Api(httpx.Client(base_url=broker.url, timeout=30)) as api:
        _storage_freed_dead_letters_trace_and_counter(api, broker)


def _storage_freed_dead_letters_trace_and_counter(api, broker):  # type: ignore[no-untyped-def]
    q = uniq("del-acct")
    api.configure(q, retryLimit=0, dlqAfterMaxRetries=True)
    [pushed] = api.push(q, [{"secret": "x" * 4000}])
    [m] = api.messages(q, batch="1")
    assert api.ack(m, status="failed", error="boom")[0]["success"]
    dlq = api.http.get("/api/v1/dlq", params={"queue": q}).json()
    assert dlq["total"] == 1, dlq
    tenant_bytes = "SELECT coalesce(sum(storage_bytes), 0) AS b FROM queen_usage_gauges WHERE tenant = $1"
    [[tenant]] = db_fetch(broker.dsn, "SELECT tenant FROM queen_partitions WHERE id = $1", uuid.UUID(m["partitionId"]))
    before = db_fetch(broker.dsn, tenant_bytes, tenant)[0]["b"]
    deleted_before = sample(broker, "queen_messages_deleted_total", {"result": "deleted"})
    gone = _delete(api, m)
    assert gone["freedBytes"] > 0 and gone["deadLettersRemoved"] == 1 and gone["messageId"] == pushed["message_id"]
    assert db_fetch(broker.dsn, tenant_bytes, tenant)[0]["b"] == before - gone["freedBytes"]
    [row] = db_fetch(broker.dsn, "SELECT payload, key_id, deleted_at FROM queen_messages WHERE partition_id = $1 "
                                 "AND txn = $2", uuid.UUID(m["partitionId"]), m["transactionId"])
    assert row["payload"] == b"" and row["key_id"] is None and row["deleted_at"] is not None
    assert api.http.get("/api/v1/dlq", params={"queue": q}).json()["total"] == 0
    traces = api.http.get(f"/api/v1/traces/{m['partitionId']}/{m['transactionId']}").json()["traces"]
    assert [t["eventType"] for t in traces] == ["deleted"] and traces[0]["data"]["offset"] == m.get("offset", 1)
    assert sample(broker, "queen_messages_deleted_total", {"result": "deleted"}) == deleted_before + 1
    # deleting again changes nothing and says so
    again = _delete(api, m)
    assert again["alreadyDeleted"] and again["freedBytes"] == 0 and again["deletedAt"] == gone["deletedAt"]
    assert db_fetch(broker.dsn, tenant_bytes, tenant)[0]["b"] == before - gone["freedBytes"]


def test_lookups_and_fetch_answer_the_tombstone(api):
    q = uniq("del-look")
    api.push(q, ["a", "b"])
    a, b = _listed(api, q)
    _delete(api, a)
    one = api.http.get(_path(a)).json()
    assert one["deleted"] is True and one["data"] is None and one["offset"] == a["offset"]
    assert api.lookup(q, a["transactionId"])["deleted"] is True
    assert api.lookup(q, b["transactionId"])["deleted"] is False
    assert [m["transactionId"] for m in _listed(api, q, status="deleted")] == [a["transactionId"]]
    r = api.http.post("/api/v1/fetch", json={"entries": [{"queue": q, "partition": "Default", "offset": 0}]})
    assert r.status_code == 200, r.text
    records = r.json()["entries"][0]["records"]
    assert [(x["offset"], x["payload"], x.get("deleted", False)) for x in records] == [(0, None, True), (1, "b", False)]
    # its transaction id stays taken: pushing it again is a duplicate, nothing is written
    again = api.push_each(q, [{"partition": "Default", "payload": "a2", "transactionId": a["transactionId"]}])
    assert again[0]["status"] == "duplicate", again
    assert len(_listed(api, q)) == 2


def test_bad_and_missing_addresses(api):
    q = uniq("del-bad")
    api.push(q, ["a"])
    [m] = _listed(api, q)
    refused(api.http.delete(f"/api/v1/messages/{m['partitionId']}/nope"), 404, "message_not_found")
    refused(api.http.delete(f"/api/v1/messages/{uuid.uuid4()}/{m['transactionId']}"), 404, "message_not_found")
    assert api.http.delete(f"/api/v1/messages/zzz/{m['transactionId']}").status_code == 400
    assert api.http.get(_path(m)).json()["data"] == "a"
