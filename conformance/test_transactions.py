"""Transactions with riders (docs/protocol.md §2.6): kv and timers in the same bundle as pushes and acks."""

from __future__ import annotations

import time
import uuid

import pytest

from conformance.client import expect, expect_error, poll, uniq
from conformance.plugin import cluster_wide

contract = pytest.mark.contract


def _push_op(q: str, txn: str, payload, **extra) -> dict:
    return {"type": "push", "items": [{"queue": q, "payload": payload, "transactionId": txn, **extra}]}


def _tx(api, body: dict):
    return api.http.post("/api/v1/transaction", json=body)


@contract("TXN-RIDERS-FLAT")
def test_flat_results_with_riders(api):
    q, ns, k = uniq("q"), f"cf-{uuid.uuid4().hex[:8]}", uniq("k")
    t1, t2 = uuid.uuid4().hex, uuid.uuid4().hex
    body = {
        "operations": [{"type": "push", "items": [{"queue": q, "payload": {"n": 1}, "transactionId": t1},
                                                  {"queue": q, "payload": {"n": 2}, "transactionId": t2}]}],
        "requiredLeases": [],
        "kv": [{"op": "put", "ns": ns, "key": "state", "value": "open", "forever": True}],
        "timers": [api.schedule_op(q, k, delay_ms=600_000)],
    }
    data = expect(_tx(api, body), 200)
    assert data.get("success") is True, data
    res = data["results"]
    assert [r.get("index") for r in res] == [0, 1, 2, 3], res
    assert res[2].get("type") == "kv" and res[2].get("applied") is True, res[2]
    assert res[3].get("type") == "timer" and res[3].get("status") == "scheduled" and res[3].get("messageId"), res[3]
    assert api.lookup(q, t1)["found"] and api.lookup(q, t2)["found"]
    assert api.peek_ok(q, k)["found"] is True
    assert api.kv_ok([{"op": "get", "ns": ns, "key": "state"}])[0]["value"] == "open"
    expect(api.cancel(q, k), 200)


@contract("TXN-RIDERS-ONLY")
def test_riders_only_bundle(api):
    q, k = uniq("q"), uniq("k")
    data = expect(_tx(api, {"operations": [], "requiredLeases": [], "timers": [api.schedule_op(q, k, delay_ms=600_000)]}),
                  200)
    assert data.get("success") is True and data["results"][0]["index"] == 0, data
    assert api.peek_ok(q, k)["found"] is True
    data = expect(_tx(api, {"operations": [], "timers": [{"op": "cancel", "queue": q, "timerKey": k}]}), 200)
    assert data["results"][0]["status"] == "cancelled", data


@contract("TXN-ATOMIC", "TMR-BAD-BATCH-CHANGES-NOTHING")
def test_refused_bundle_applies_nothing(api):
    q, ns, k = uniq("q"), f"cf-{uuid.uuid4().hex[:8]}", uniq("k")
    txn = uuid.uuid4().hex
    body = {"operations": [_push_op(q, txn, {"n": 1})], "requiredLeases": [str(uuid.uuid4())],
            "kv": [{"op": "put", "ns": ns, "key": "x", "value": 1, "forever": True}],
            "timers": [api.schedule_op(q, k, delay_ms=0)]}
    resp = _tx(api, body)
    if resp.status_code == 200:
        assert resp.json().get("success") is False, resp.text
    else:
        expect_error(resp, resp.status_code)
        assert 400 <= resp.status_code < 500
    time.sleep(0.2)
    assert api.lookup(q, txn)["found"] is False
    assert api.peek_ok(q, k)["found"] is False
    assert api.kv_ok([{"op": "get", "ns": ns, "key": "x"}])[0]["found"] is False


@contract("TXN-KV-PRECONDITION")
def test_lost_required_precondition(api):
    q, ns, k = uniq("q"), f"cf-{uuid.uuid4().hex[:8]}", uniq("k")
    api.kv_ok([{"op": "put", "ns": ns, "key": "lock", "value": {"owner": "someone"}, "forever": True}])
    txn = uuid.uuid4().hex
    body = {"operations": [_push_op(q, txn, {"n": 1})], "requiredLeases": [],
            "kv": [{"op": "put", "ns": ns, "key": "other", "value": 1, "forever": True},
                   {"op": "putIfAbsent", "ns": ns, "key": "lock", "value": {"owner": "me"}, "forever": True,
                    "required": True}],
            "timers": [api.schedule_op(q, k, delay_ms=0)]}
    data = expect(_tx(api, body), 200)
    assert data.get("success") is False and data.get("reason") == "kv_precondition", data
    assert data.get("failedIndex") == 2, f"failedIndex is flat (1 pushed item + kv index 1): {data}"
    assert data.get("kvReason") == "exists" and data.get("value") == {"owner": "someone"}, data
    time.sleep(0.2)
    assert api.lookup(q, txn)["found"] is False
    assert api.peek_ok(q, k)["found"] is False
    assert api.kv_ok([{"op": "get", "ns": ns, "key": "other"}])[0]["found"] is False


@cluster_wide
@contract("TXN-TIMERS-DISABLED", "TMR-BATCH-CANCEL-AUTH")
def test_timers_rider_under_switches(api, admin, tenant_a):
    q, k = uniq("q"), uniq("k")
    api.schedule(q, k, delay_ms=600_000)
    admin.scheduling(False)
    try:
        resp = poll(lambda: (lambda r: r if r.status_code == 403 else None)(
            _tx(api, {"operations": [], "timers": [api.schedule_op(q, uniq("k"), delay_ms=600_000)]})),
            timeout=6, what="timers rider refused while scheduling is off")
        expect_error(resp, 403, "timers_disabled")
    finally:
        admin.scheduling(True)
    admin.timers_paused(tenant_a, True)
    try:
        probe_q = uniq("probe")

        def probe():
            pk = uniq("k")
            r = api.timers([api.schedule_op(probe_q, pk, delay_ms=600_000)])
            if r.status_code == 200:
                api.cancel(probe_q, pk)
            return r if r.status_code == 403 else None

        poll(probe, timeout=6, what="the paused schedule in force")
        resp = _tx(api, {"operations": [], "timers": [{"op": "cancel", "queue": q, "timerKey": k}]})
        expect_error(resp, 403)
        assert api.peek_ok(q, k)["found"] is True
        assert expect(api.cancel(q, k), 200)["status"] == "cancelled", "the DELETE route still works"
    finally:
        admin.timers_paused(tenant_a, False)


@contract("DL-TXN")
def test_transaction_push_deadline(api):
    q = uniq("q")
    dead, live = uuid.uuid4().hex, uuid.uuid4().hex
    data = expect(_tx(api, {"operations": [_push_op(q, dead, {"n": 1}, deadlineMs=100),
                                           _push_op(q, live, {"n": 2}, deadlineMs=60_000)], "requiredLeases": []}), 200)
    assert data.get("success") is True, data
    time.sleep(0.3)
    assert [m["transactionId"] for m in api.drain(q)] == [live]
    rows = poll(lambda: [m for m in api.dlq(q) if m.get("transactionId") == dead], timeout=5,
                what="the expired transaction push in the DLQ")
    assert "deadline_exceeded" in str(rows[0].get("errorMessage") or rows[0].get("error")), rows[0]
    expect_error(_tx(api, {"operations": [_push_op(q, uuid.uuid4().hex, {"n": 3}, deadlineMs=0)]}), 400)
