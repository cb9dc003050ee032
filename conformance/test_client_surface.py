"""The rest of the official client's surface (docs/protocol.md §2.2, §2.7–§2.14, §5; docs/decisions.md §7):
the routes its admin API, consumer-group management, traces, reads by offset and locks call, as HTTP."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from conformance.client import expect, expect_error, poll, uniq

contract = pytest.mark.contract


def _pop_leased(api, q: str, *, group: str | None = None, batch: int = 10) -> dict:
    params = {"batch": str(batch), "wait": "false"}
    if group:
        params["consumerGroup"] = group
    data = expect(api.http.get(f"/api/v1/pop/queue/{quote(q, safe='')}", params=params), 200)
    assert data.get("messages") and data.get("leaseId"), data
    return data


# ------------------------------------------------------------------------------ deviations (item 10)

@contract("CLI-DELETE-MISSING-QUEUE")
def test_delete_of_missing_queue_answers_deleted_false(admin):
    q = uniq("gone")
    data = expect(admin.api.http.delete(f"/api/v1/resources/queues/{q}"), 200)
    assert data.get("deleted") is False and not data.get("error"), data
    expect(admin.api.push(q, [1]), (200, 201))
    assert expect(admin.api.http.delete(f"/api/v1/resources/queues/{q}"), 200).get("deleted") is True
    assert expect(admin.api.http.delete(f"/api/v1/resources/queues/{q}"), 200).get("deleted") is False


@contract("CLI-RENEW-EXPIRED-LEASE")
def test_renewing_an_expired_lease_answers_false(api):
    q = uniq("lease")
    expect(api.configure(q, leaseTime=1), (200, 201))
    expect(api.push(q, ["x"]), (200, 201))
    lease = _pop_leased(api, q)["leaseId"]
    live = expect(api.http.post(f"/api/v1/lease/{lease}/extend"), 200)
    assert live.get("success") is True, live
    # The renewal pushed the end out: wait for a fresh short lease instead.
    q2 = uniq("lease")
    expect(api.configure(q2, leaseTime=1), (200, 201))
    expect(api.push(q2, ["y"]), (200, 201))
    lease2 = _pop_leased(api, q2)["leaseId"]
    time.sleep(1.5)
    dead = expect(api.http.post(f"/api/v1/lease/{lease2}/extend"), 200)
    assert dead.get("success") is False, dead


# ------------------------------------------------------------------------------ DLQ replay by address (item 4)

def _dead_letter(api, q: str, payload) -> dict:
    expect(api.configure(q, retryLimit=0), (200, 201))
    expect(api.push(q, [payload]), (200, 201))
    data = _pop_leased(api, q, batch=1)
    m = data["messages"][0]
    acked = expect(api.http.post("/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": data["leaseId"],
        "status": "failed", "error": "boom"}), 200)
    assert (acked[0] if isinstance(acked, list) else acked).get("success") is True, acked
    assert [r.get("transactionId") for r in api.dlq(q)] == [m["transactionId"]]
    return m


@contract("CLI-RETRY-MESSAGE")
def test_retry_by_address_replays_the_dead_letter(api):
    q = uniq("retry")
    m = _dead_letter(api, q, {"n": 1})
    path = f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}/retry"
    out = expect(api.http.post(path), 200)
    assert out.get("replayed") is True, out
    assert api.dlq(q) == []
    got = api.pop(q)
    assert [g["data"] for g in got] == [{"n": 1}], got
    expect_error(api.http.post(path), 404, "dlq_not_found")


@contract("CLI-RETRY-SYNTHETIC-REFUSED")
def test_retry_by_address_refuses_a_timer_dead_letter(api, hooks):
    q, k, txn = uniq("retry-t"), uniq("k"), uniq("txn")
    expect(api.push(q, ["partition exists"]), (200, 201))
    hooks.fail(q, 10_000, "permanent")
    try:
        api.schedule(q, k, delay_ms=0, txn=txn)
        rows = poll(lambda: [m for m in api.dlq(q) if m.get("transactionId") == txn],
                    timeout=api.target.fire_timeout * 2, what="the timer in its queue's DLQ")
    finally:
        hooks.release(q)
    pid = rows[0].get("partitionId")
    assert pid, rows[0]
    expect_error(api.http.post(f"/api/v1/messages/{pid}/{txn}/retry"), 409, "dlq_replay_refused",
                 "synthetic_consumer_group")
    assert [m.get("transactionId") for m in api.dlq(q)].count(txn) == 1
