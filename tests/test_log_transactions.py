"""POST /api/v1/transaction through HTTP: push + ack atomically, the flat result space, rollback of
everything when one part fails, requiredLeases, rider-only bundles, deadlines on transaction pushes,
refusal of malformed bundles."""

from __future__ import annotations

import time
import uuid

from conftest import uniq
from helpers import ack_op


def test_ack_and_push_commit_together_with_flat_results(http, api):
    src, dst = uniq("src"), uniq("dst")
    api.push(src, ["in"])
    m = api.messages(src)[0]
    body = {"operations": [
        {"type": "push", "items": [{"queue": dst, "payload": 1, "transactionId": "o1"},
                                   {"queue": dst, "partition": "p", "payload": 2, "transactionId": "o2"}]},
        ack_op(m),
    ], "requiredLeases": [m["leaseId"]]}
    r = http.post("/api/v1/transaction", json=body)
    assert r.status_code == 200
    out = r.json()
    assert out["success"] is True and [x["index"] for x in out["results"]] == [0, 1, 2]
    assert [x["type"] for x in out["results"]] == ["push", "push", "ack"]
    assert out["results"][0]["status"] == "queued" and out["results"][2]["success"] is True
    assert api.found(dst, "o1") and api.found(dst, "o2")
    assert api.messages(src) == []
    # the lease ended with the ack, so naming it as required now fails and changes nothing...
    assert http.post("/api/v1/transaction", json=body).json()["success"] is False
    # ...while a re-sent bundle is idempotent for its pushes (same transactionIds) and its ack (already done)
    again = http.post("/api/v1/transaction", json=dict(body, requiredLeases=[])).json()
    assert again["success"] is True and again["results"][0]["status"] == "duplicate"


def test_a_failing_ack_rolls_back_the_whole_bundle(http, api):
    src, dst = uniq("src"), uniq("dst")
    api.push(src, ["a", "b"])
    m1, m2 = api.messages(src, batch=2)
    body = {"operations": [
        ack_op(m1),
        {"type": "push", "items": [{"queue": dst, "payload": "x", "transactionId": "must-not-exist"}]},
        ack_op(m2, leaseId=str(uuid.uuid4())),
    ], "requiredLeases": []}
    r = http.post("/api/v1/transaction", json=body)
    assert r.status_code == 200
    out = r.json()
    assert out["success"] is False and out["error"] == "Invalid or expired lease" and out["failedIndex"] == 2
    assert not api.found(dst, "must-not-exist")
    # m1's ack was rolled back too: m1 and m2 are still leased, and acking both now works
    res = http.post("/api/v1/ack/batch", json={"acknowledgments": [
        {k: m[k] for k in ("transactionId", "partitionId", "leaseId")} | {"status": "completed"} for m in (m1, m2)]}).json()
    assert [x["success"] for x in res] == [True, True]


def test_required_lease_that_is_not_live_refuses_the_bundle(http, api):
    dst = uniq("dst")
    body = {"operations": [{"type": "push", "items": [{"queue": dst, "payload": 1, "transactionId": "t"}]}],
            "requiredLeases": [str(uuid.uuid4())]}
    out = http.post("/api/v1/transaction", json=body).json()
    assert out["success"] is False and out["reason"] == "lease_invalid"
    assert not api.found(dst, "t")


def test_single_required_lease_is_lent_to_an_ack_without_one(http, api):
    src = uniq("lend")
    api.push(src, ["x"])
    m = api.messages(src)[0]
    op = ack_op(m)
    del op["leaseId"]
    out = http.post("/api/v1/transaction", json={"operations": [op], "requiredLeases": [m["leaseId"]]}).json()
    assert out["success"] is True


def test_empty_operations_are_legal(http):
    r = http.post("/api/v1/transaction", json={"operations": [], "requiredLeases": []})
    assert r.status_code == 200 and r.json()["success"] is True and r.json()["results"] == []


def test_transaction_push_items_carry_deadlines(http, broker, api):
    q = uniq("txdl")
    body = {"operations": [{"type": "push", "items": [{"queue": q, "payload": "late", "deadlineMs": 1},
                                                       {"queue": q, "payload": "fine", "deadlineMs": 60_000}]}]}
    assert http.post("/api/v1/transaction", json=body).json()["success"] is True
    time.sleep(0.05)
    assert [m["data"] for m in api.messages(q, batch=5)] == ["fine"]
    dlq = http.get("/api/v1/dlq", params={"queue": q}).json()
    assert dlq["total"] == 1 and dlq["messages"][0]["errorMessage"] == "deadline_exceeded"
    bad = {"operations": [{"type": "push", "items": [{"queue": q, "payload": 1, "deadlineMs": 0}]}]}
    assert http.post("/api/v1/transaction", json=bad).status_code == 400


def test_malformed_bundles_are_400_and_change_nothing(http, api):
    q = uniq("badtx")
    bodies = [
        {"operations": "x"},
        {"operations": [{"type": "teleport"}]},
        {"operations": [{"type": "push", "items": [{"queue": q, "payload": 1, "producerSub": "forged"}]}]},
        {"operations": [{"type": "ack", "transactionId": "t", "partitionId": "nope"}]},
        {"operations": [{"type": "push", "items": [{"queue": q, "payload": 1}]}, 7]},
        {"operations": [], "requiredLeases": "L"},
        {"operations": [], "mystery": True},
    ]
    for body in bodies:
        r = http.post("/api/v1/transaction", json=body)
        assert r.status_code == 400, body
        assert r.json()["reason"]
    assert api.messages(q) == []
