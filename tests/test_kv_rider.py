"""The kv rider of POST /api/v1/transaction: flat results, reads observing the bundle's writes, the
whole bundle rolled back by a lost required precondition (HTTP 200), and the rider's refusals."""

from __future__ import annotations

import uuid

from conftest import uniq
from helpers import kv_put, push_op


def test_kv_rider_results_are_flat_and_typed(http, api):
    ns, q = uniq("tx"), uniq("q")
    body = api.tx({
        "operations": [push_op(q, "a", "b")],
        "requiredLeases": [],
        "kv": [kv_put(ns, "state", {"step": 1}), {"op": "get", "ns": ns, "key": "state"},
               {"op": "incr", "ns": ns, "key": "n", "delta": 2, "ttlSeconds": 60}],
    })
    assert body["success"] is True
    res = body["results"]
    assert [r["index"] for r in res] == [0, 1, 2, 3, 4]
    assert [r["type"] for r in res] == ["push", "push", "kv", "kv", "kv"]
    assert res[2]["op"] == "put" and res[2]["applied"] is True
    # reads inside the bundle observe its writes
    assert res[3]["found"] is True and res[3]["value"] == {"step": 1} and res[3]["version"] == res[2]["version"]
    assert res[4]["value"] == 2
    got = http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": ns, "key": "state"}]}).json()
    assert got["results"][0]["version"] == res[2]["version"]


def test_kv_only_bundle(api):
    ns = uniq("tx")
    body = api.tx({"operations": [], "requiredLeases": [], "kv": [kv_put(ns, "k", 1)]})
    assert body["success"] is True and body["results"][0]["index"] == 0 and body["results"][0]["type"] == "kv"


def test_lost_required_precondition_rolls_back_the_whole_bundle(http, api):
    ns, q = uniq("tx"), uniq("q")
    v = http.post("/api/v1/kv", json={"operations": [kv_put(ns, "guard", {"owner": "me"})]}).json()["results"][0]["version"]
    t1, t2 = uuid.uuid4().hex, uuid.uuid4().hex
    body = api.tx({
        "operations": [push_op(q, t1, t2)],
        "requiredLeases": [],
        "kv": [{"op": "check", "ns": ns, "key": "guard", "expect": v + 1, "required": True}, kv_put(ns, "written", 1)],
    })
    assert body == {"success": False, "reason": "kv_precondition", "failedIndex": 2, "kvReason": "version",
                    "version": v, "value": {"owner": "me"}}
    # nothing of the bundle happened: the pushes are not in the log, the KV write is not there
    r = http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "Default", "payload": 1, "transactionId": t1}]})
    assert r.json()[0]["status"] == "queued"
    got = http.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": ns, "key": "written"}]}).json()
    assert got["results"][0]["found"] is False
    # a later op's loss: failedIndex is flat (2 pushes, then the kv index)
    body = api.tx({"operations": [push_op(q, uuid.uuid4().hex, uuid.uuid4().hex)], "requiredLeases": [],
                     "kv": [kv_put(ns, "a", 1), kv_put(ns, "guard", 2, expect=0, required=True)]})
    assert body["failedIndex"] == 3 and body["kvReason"] == "exists"
    # a loss without required is a verdict in the results, not an abort
    body = api.tx({"operations": [], "kv": [kv_put(ns, "guard", 2, expect=0)]})
    assert body["success"] is True and body["results"][0]["applied"] is False


def test_rider_refusals(http, api):
    ns = uniq("tx")
    for kv_ops, reason in (
        ([{"op": "getPrefix", "ns": ns, "prefix": "a"}], "kv_get_prefix_not_allowed_in_transaction"),
        ([{"op": "get", "ns": ns, "key": f"k{i}"} for i in range(65)], "kv_too_many_ops"),
        ([{"op": "getMany", "ns": ns, "keys": [f"k{i}" for i in range(257)]}], "kv_too_many_keys"),
        ([kv_put(ns, "k", 1), {"op": "delete", "ns": ns, "key": "k"}], "kv_duplicate_key_in_call"),
        ([{"op": "put", "ns": ns, "key": "k", "value": 1}], "kv_expiry_not_specified"),
        ("nope", "kv_bad_body"),
    ):
        r = http.post("/api/v1/transaction", json={"operations": [], "kv": kv_ops})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "kv_bad_request" and r.json()["reason"] == reason
    # 64 ops are fine
    body = api.tx({"operations": [], "kv": [{"op": "get", "ns": ns, "key": f"k{i}"} for i in range(64)]})
    assert len(body["results"]) == 64
