"""KV: every op of POST /api/v1/kv, preconditions, versions, limits and error codes (docs/protocol.md §4),
against the shared broker."""

from __future__ import annotations

import time

import pytest
from conftest import uniq
from helpers import kv_put, refused


def err(http, ops, status, reason, code="kv_bad_request"):
    return refused(http.post("/api/v1/kv", json={"operations": ops} if isinstance(ops, list) else ops), status, code, reason)


def test_put_get_versions_and_index_alignment(api):
    ns = uniq("kv")
    res = api.kv_body(
        kv_put(ns, "a", {"n": 1}),
        {"op": "get", "ns": ns, "key": "a"},
        {"op": "get", "ns": ns, "key": "missing"},
        kv_put(ns, "b", None),
        {"op": "get", "ns": ns, "key": "b"},
    )["results"]
    assert [r["index"] for r in res] == [0, 1, 2, 3, 4]
    assert [r["op"] for r in res] == ["put", "get", "get", "put", "get"]
    assert res[0]["applied"] is True and res[0]["key"] == "a" and res[0]["value"] == {"n": 1}
    v1 = res[0]["version"]
    assert isinstance(v1, int) and v1 > 0
    # within one call, reads observe the call's own writes
    assert res[1]["found"] is True and res[1]["value"] == {"n": 1} and res[1]["version"] == v1
    assert res[1]["expiresAt"] is None and res[1]["updatedAt"].endswith("Z")
    assert res[2] == {"index": 2, "op": "get", "found": False, "key": "missing"}
    # found:true with value null is not found:false
    assert res[4]["found"] is True and res[4]["value"] is None
    # a new write gets a new, larger version; a deleted and recreated key never reuses one
    v2 = api.kv_one(kv_put(ns, "a", 2))["version"]
    assert v2 > v1
    assert api.kv_one({"op": "delete", "ns": ns, "key": "a"})["applied"] is True
    again = api.kv_one(kv_put(ns, "a", 3))
    assert again["version"] > v2


def test_put_expect_semantics(api):
    ns = uniq("kv")
    v = api.kv_one(kv_put(ns, "k", 1))["version"]
    lost = api.kv_one(kv_put(ns, "k", 2, expect=0))
    assert lost == {"index": 0, "op": "put", "applied": False, "reason": "exists", "key": "k", "value": 1, "version": v}
    stale = api.kv_one(kv_put(ns, "k", 2, expect=v + 1000))
    assert stale["applied"] is False and stale["reason"] == "version" and stale["value"] == 1 and stale["version"] == v
    ok = api.kv_one(kv_put(ns, "k", 2, expect=v))
    assert ok["applied"] is True and ok["version"] > v and ok["value"] == 2
    # expect N>0 creates nothing
    none = api.kv_one(kv_put(ns, "nokey", 1, expect=5))
    assert none == {"index": 0, "op": "put", "applied": False, "reason": "absent", "key": "nokey", "value": None, "version": 0}
    assert api.kv_one({"op": "get", "ns": ns, "key": "nokey"})["found"] is False
    # expect 0 on a missing key creates it
    assert api.kv_one(kv_put(ns, "fresh", "x", expect=0))["applied"] is True


def test_put_if_absent_exactly_one_winner_and_no_other_expect(http, api):
    ns = uniq("kv")
    first = api.kv_one({"op": "putIfAbsent", "ns": ns, "key": "gate", "value": "me", "ttlSeconds": 60})
    assert first["applied"] is True and first["op"] == "putIfAbsent"
    second = api.kv_one({"op": "putIfAbsent", "ns": ns, "key": "gate", "value": "you", "forever": True})
    assert second["applied"] is False and second["reason"] == "exists" and second["value"] == "me"
    assert second["version"] == first["version"]
    err(http, [{"op": "putIfAbsent", "ns": ns, "key": "g2", "value": 1, "forever": True, "expect": 3}], 400, "kv_bad_expect")


def test_put_if_absent_concurrent_callers_one_wins(http):
    import concurrent.futures

    import httpx

    ns = uniq("kv")

    def attempt(i):
        with httpx.Client(base_url=str(http.base_url), timeout=30) as c:
            r = c.post("/api/v1/kv", json={"operations": [
                {"op": "putIfAbsent", "ns": ns, "key": "race", "value": i, "forever": True}]})
            return r.json()["results"][0]["applied"]

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        outcomes = list(ex.map(attempt, range(8)))
    assert outcomes.count(True) == 1


def test_delete_semantics(api):
    ns = uniq("kv")
    missing = api.kv_one({"op": "delete", "ns": ns, "key": "nope"})
    assert missing == {"index": 0, "op": "delete", "applied": False, "reason": "absent", "key": "nope", "value": None, "version": 0}
    v = api.kv_one(kv_put(ns, "k", 1))["version"]
    assert api.kv_one({"op": "delete", "ns": ns, "key": "k", "expect": 0})["reason"] == "exists"
    assert api.kv_one({"op": "delete", "ns": ns, "key": "k", "expect": v + 7})["reason"] == "version"
    done = api.kv_one({"op": "delete", "ns": ns, "key": "k", "expect": v})
    assert done["applied"] is True and done["version"] == 0 and done["value"] is None
    assert api.kv_one({"op": "delete", "ns": ns, "key": "k", "expect": v})["reason"] == "absent"
    # "must not exist" holds for a missing key
    assert api.kv_one({"op": "delete", "ns": ns, "key": "k", "expect": 0})["applied"] is True


def test_incr(http, api):
    ns = uniq("kv")
    a = api.kv_one({"op": "incr", "ns": ns, "key": "c", "delta": 1, "ttlSeconds": 60})
    assert a["applied"] is True and a["value"] == 1 and a["version"] > 0
    b = api.kv_one({"op": "incr", "ns": ns, "key": "c", "delta": 2, "max": 3, "forever": True})
    assert b["applied"] is True and b["value"] == 3
    # no saturation: a refused increment is refused whole and spends nothing
    c = api.kv_one({"op": "incr", "ns": ns, "key": "c", "delta": 1, "max": 3, "forever": True})
    assert c["applied"] is False and c["reason"] == "limit" and c["value"] == 3 and c["version"] == b["version"]
    # TTL is create-only: the live row kept its 60 s expiry although the later incr said forever
    got = api.kv_one({"op": "get", "ns": ns, "key": "c"})
    assert got["expiresAt"] is not None
    # delta alone violating min on create
    d = api.kv_one({"op": "incr", "ns": ns, "key": "floor", "delta": -1, "min": 0, "forever": True})
    assert d == {"index": 0, "op": "incr", "applied": False, "reason": "limit", "key": "floor", "value": 0, "version": 0}
    # floats and the default delta of 1
    assert api.kv_one({"op": "incr", "ns": ns, "key": "f", "delta": 0.5, "forever": True})["value"] == 0.5
    assert api.kv_one({"op": "incr", "ns": ns, "key": "f", "forever": True})["value"] == 1.5
    # a live non-numeric value
    api.kv_one(kv_put(ns, "s", "text"))
    t = api.kv_one({"op": "incr", "ns": ns, "key": "s", "forever": True})
    assert t["applied"] is False and t["reason"] == "type" and t["value"] == "text"
    # a sum no JSON reader could take back is refused like a limit, never a 500
    api.kv_one({"op": "incr", "ns": ns, "key": "huge", "delta": 1e308, "forever": True})
    h = api.kv_one({"op": "incr", "ns": ns, "key": "huge", "delta": 1e308, "forever": True})
    assert h["applied"] is False and h["reason"] == "limit" and h["value"] == 1e308
    assert api.kv_one({"op": "incr", "ns": ns, "key": "big", "delta": 2**80, "forever": True})["applied"] is True
    err(http, [{"op": "incr", "ns": ns, "key": "c", "forever": True, "expect": 1}], 400, "kv_bad_expect")
    err(http, [{"op": "incr", "ns": ns, "key": "c", "forever": True, "delta": True}], 400, "kv_bad_body")


def test_check(http, api):
    ns = uniq("kv")
    v = api.kv_one(kv_put(ns, "k", {"owner": "a"}))["version"]
    ok = api.kv_one({"op": "check", "ns": ns, "key": "k", "expect": v})
    assert ok["applied"] is True and ok["version"] == v and ok["value"] == {"owner": "a"}
    assert api.kv_one({"op": "check", "ns": ns, "key": "k", "expect": v + 1})["reason"] == "version"
    assert api.kv_one({"op": "check", "ns": ns, "key": "k", "expect": 0})["reason"] == "exists"
    assert api.kv_one({"op": "check", "ns": ns, "key": "zz", "expect": 3})["reason"] == "absent"
    assert api.kv_one({"op": "check", "ns": ns, "key": "zz", "expect": 0})["applied"] is True
    err(http, [{"op": "check", "ns": ns, "key": "k"}], 400, "kv_bad_expect")


def test_required_loss_rolls_back_the_whole_call(api):
    ns = uniq("kv")
    v = api.kv_one(kv_put(ns, "lock", 1))["version"]
    body = api.kv_body(
        kv_put(ns, "x", "written?"),
        {"op": "incr", "ns": ns, "key": "n", "forever": True},
        {"op": "check", "ns": ns, "key": "lock", "expect": v + 1, "required": True},
        kv_put(ns, "y", 1),
    )
    assert body == {"ok": False, "reason": "kv_precondition", "failedIndex": 2, "kvReason": "version", "version": v, "value": 1}
    got = api.kv_body({"op": "getMany", "ns": ns, "keys": ["x", "n", "y"]})["results"][0]
    assert got["rows"] == [] and got["missing"] == ["x", "n", "y"]
    # a required op that holds changes nothing about the answer
    fine = api.kv_body(kv_put(ns, "x", 1, required=True), {"op": "check", "ns": ns, "key": "lock", "expect": v, "required": True})
    assert [r["applied"] for r in fine["results"]] == [True, True]
    # required on a write that loses
    lost = api.kv_body(kv_put(ns, "z", 1), kv_put(ns, "x", 2, expect=0, required=True))
    assert lost["failedIndex"] == 1 and lost["kvReason"] == "exists" and lost["value"] == 1


def test_get_many(api):
    ns = uniq("kv")
    api.kv_body(kv_put(ns, "a", 1), kv_put(ns, "b", 2))
    r = api.kv_one({"op": "getMany", "ns": ns, "keys": ["b", "nope", "a", "b"]})
    assert [row["key"] for row in r["rows"]] == ["b", "a"]
    assert r["missing"] == ["nope"] and r["truncated"] is False
    assert set(r["rows"][0]) == {"key", "value", "version", "expiresAt", "updatedAt"}


def test_get_many_read_budget_truncates(api):
    ns = uniq("kv")
    big = "x" * 60_000
    for batch in range(3):
        api.kv_body(*[kv_put(ns, f"k{batch * 30 + i:03d}", big) for i in range(30)])
    keys = [f"k{i:03d}" for i in range(90)] + ["absent"]
    r = api.kv_one({"op": "getMany", "ns": ns, "keys": keys})
    assert r["truncated"] is True
    assert 0 < len(r["rows"]) < 90
    # keys cut by the budget are in neither list; the real miss is still reported
    listed = {row["key"] for row in r["rows"]} | set(r["missing"])
    assert "absent" in r["missing"] and len(listed) < len(keys)


def test_get_prefix_paging_order_limit_and_keys_only(http, api):
    ns = uniq("kv")
    keys = ["p/b", "p/a", "p/c", "p/a/1", "q/x", "p", "o"]
    api.kv_body(*[kv_put(ns, k, k) for k in keys])
    page = api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "p/", "limit": 2})
    assert [r["key"] for r in page["rows"]] == ["p/a", "p/a/1"]
    assert page["truncated"] is True and page["nextAfter"] == "p/a/1"
    rest = api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "p/", "after": "p/a/1", "limit": 2})
    assert [r["key"] for r in rest["rows"]] == ["p/b", "p/c"]
    assert rest["truncated"] is False and rest["nextAfter"] is None
    ko = api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "p", "keysOnly": True})
    assert [r["key"] for r in ko["rows"]] == ["p", "p/a", "p/a/1", "p/b", "p/c"]
    assert all("value" not in r for r in ko["rows"])
    # limit is clamped, never rejected
    assert api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "p", "limit": 0})["rows"][0]["key"] == "p"
    assert len(api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "p", "limit": 10**6})["rows"]) == 5
    err(http, [{"op": "getPrefix", "ns": ns, "prefix": ""}], 400, "kv_prefix_required")


def test_get_prefix_byte_order_and_unicode_bounds(api):
    ns = uniq("kv")
    keys = ["é1", "é2", "éz", "ê", "e", "Z"]
    api.kv_body(*[kv_put(ns, k, 1) for k in keys])
    r = api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "é"})
    assert [x["key"] for x in r["rows"]] == ["é1", "é2", "éz"]
    # byte (C) order, not a locale's
    r = api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "\U0010ffff"})
    assert r["rows"] == []


def test_expiry_never_returned_before_pruning(api):
    ns = uniq("kv")
    api.kv_body(kv_put(ns, "short", "v", ttlSeconds=1), kv_put(ns, "long", "v", ttlSeconds=60))
    assert api.kv_one({"op": "get", "ns": ns, "key": "short"})["found"] is True
    time.sleep(1.3)
    assert api.kv_one({"op": "get", "ns": ns, "key": "short"}) == {"index": 0, "op": "get", "found": False, "key": "short"}
    many = api.kv_one({"op": "getMany", "ns": ns, "keys": ["short", "long"]})
    assert [r["key"] for r in many["rows"]] == ["long"] and many["missing"] == ["short"]
    assert [r["key"] for r in api.kv_one({"op": "getPrefix", "ns": ns, "prefix": "s"})["rows"]] == []
    # never counts as existing: expect 0 wins over the expired row, expect N loses with absent
    assert api.kv_one({"op": "check", "ns": ns, "key": "short", "expect": 0})["applied"] is True
    assert api.kv_one({"op": "delete", "ns": ns, "key": "short"})["reason"] == "absent"


def test_expired_row_replaced_by_expect_zero_and_incr_restarts(api):
    ns = uniq("kv")
    api.kv_body(kv_put(ns, "k", "old", ttlSeconds=1), {"op": "incr", "ns": ns, "key": "c", "delta": 5, "ttlSeconds": 1})
    time.sleep(1.3)
    won = api.kv_one(kv_put(ns, "k", "new", expect=0))
    assert won["applied"] is True
    assert api.kv_one({"op": "get", "ns": ns, "key": "k"})["expiresAt"] is None  # never inherits
    assert api.kv_one({"op": "incr", "ns": ns, "key": "c", "delta": 1, "forever": True})["value"] == 1


def test_expiry_rules(http, api):
    ns = uniq("kv")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1}], 400, "kv_expiry_not_specified")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1, "ttlSeconds": 5, "forever": True}], 400, "kv_expiry_not_specified")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1, "forever": False}], 400, "kv_expiry_not_specified")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1, "ttlSeconds": 0}], 400, "kv_bad_ttl")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1, "ttlSeconds": 1.5}], 400, "kv_bad_ttl")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1, "ttlSeconds": True}], 400, "kv_bad_ttl")
    err(http, [{"op": "put", "ns": ns, "key": "k", "value": 1, "expiresAt": "2030-01-01T00:00:00Z"}], 400, "kv_bad_ttl")
    err(http, [{"op": "delete", "ns": ns, "key": "k", "ttlSeconds": 5}], 400, "kv_bad_ttl")
    # a put never inherits the previous expiry
    api.kv_one(kv_put(ns, "k", 1, ttlSeconds=60))
    api.kv_one(kv_put(ns, "k", 2))
    assert api.kv_one({"op": "get", "ns": ns, "key": "k"})["expiresAt"] is None


@pytest.mark.parametrize(
    "ops,status,reason,code",
    [
        ([{"op": "nope", "ns": "a", "key": "k"}], 400, "kv_unknown_op", "kv_bad_request"),
        ([{"op": ["get"], "ns": "a", "key": "k"}], 400, "kv_unknown_op", "kv_bad_request"),
        ([{"op": {"a": 1}, "ns": "a", "key": "k"}], 400, "kv_unknown_op", "kv_bad_request"),
        ([{"op": "get", "ns": "Bad", "key": "k"}], 400, "kv_bad_namespace", "kv_bad_request"),
        ([{"op": "get", "ns": "-a", "key": "k"}], 400, "kv_bad_namespace", "kv_bad_request"),
        ([{"op": "get", "ns": "a" * 65, "key": "k"}], 400, "kv_bad_namespace", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": ""}], 400, "kv_bad_key", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": 5}], 400, "kv_bad_key", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": "a\u0000b"}], 400, "kv_bad_key", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": "é" * 257}], 413, "kv_key_too_large", "payload_too_large"),
        ([{"op": "put", "ns": "a", "key": "k", "value": "x" * 65_536, "forever": True}], 413, "kv_value_too_large", "payload_too_large"),
        ([{"op": "put", "ns": "a", "key": "k", "value": "a\u0000", "forever": True}], 400, "kv_bad_value", "kv_bad_request"),
        ([{"op": "put", "ns": "a", "key": "k", "forever": True}], 400, "kv_bad_body", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": "k", "tenant": "other"}], 400, "kv_tenant_not_an_input", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": "k", "extra": 1}], 400, "kv_unknown_field", "kv_bad_request"),
        ([{"op": "put", "ns": "a", "key": "k", "value": 1, "forever": True, "expect": -1}], 400, "kv_bad_expect", "kv_bad_request"),
        ([{"op": "put", "ns": "a", "key": "k", "value": 1, "forever": True, "expect": None}], 400, "kv_bad_expect", "kv_bad_request"),
        ([{"op": "getMany", "ns": "a", "keys": []}], 400, "kv_bad_key", "kv_bad_request"),
        ([{"op": "getPrefix", "ns": "a", "prefix": "p", "limit": "9"}], 400, "kv_bad_body", "kv_bad_request"),
        ([{"op": "put", "ns": "a", "key": "k", "value": 1, "forever": True},
          {"op": "delete", "ns": "a", "key": "k"}], 400, "kv_duplicate_key_in_call", "kv_bad_request"),
        ([{"op": "getMany", "ns": "a", "keys": [f"k{i}" for i in range(1025)]}], 400, "kv_too_many_keys", "kv_bad_request"),
        ([{"op": "get", "ns": "a", "key": "k"}] * 257, 400, "kv_too_many_ops", "kv_bad_request"),
        (["not an object"], 400, "kv_bad_body", "kv_bad_request"),
    ],
)
def test_refusals(http, ops, status, reason, code):
    err(http, ops, status, reason, code)


def test_body_shape_and_query_string_refusals(http, api):
    err(http, {"ops": []}, 400, "kv_bad_body")
    err(http, {"operations": {}}, 400, "kv_bad_body")
    err(http, {"operations": [], "tenant": "x"}, 400, "kv_tenant_not_an_input")
    r = http.post("/api/v1/kv?prefix=secret", json={"operations": []})
    assert r.status_code == 400 and r.json()["reason"] == "kv_no_query_string"
    r = http.post("/api/v1/kv", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "kv_bad_request"
    # refusals change nothing: the valid write before the bad op is not applied
    ns = uniq("kv")
    err(http, [kv_put(ns, "k", 1), {"op": "get", "ns": ns, "key": ""}], 400, "kv_bad_key")
    assert api.kv_one({"op": "get", "ns": ns, "key": "k"})["found"] is False
    # reads of the same key as a write are allowed, at most one WRITE per key
    res = api.kv_body(kv_put(ns, "k", 1), {"op": "get", "ns": ns, "key": "k"}, {"op": "check", "ns": ns, "key": "k", "expect": 0})
    assert res["results"][2]["reason"] == "exists"
    # 256 ops is fine
    assert len(api.kv_body(*[{"op": "get", "ns": ns, "key": f"k{i}"} for i in range(256)])["results"]) == 256


def test_path_routes(http, api):
    ns = uniq("kv")
    r = http.put(f"/api/v1/kv/{ns}/a/b/c?forever=true", content=b'{"hello": "world"}')
    assert r.status_code == 200, r.text
    v = r.json()["version"]
    assert r.headers["ETag"] == f'"{v}"' and r.json()["applied"] is True
    r = http.get(f"/api/v1/kv/{ns}/a/b/c")
    assert r.status_code == 200 and r.json()["value"] == {"hello": "world"} and r.headers["ETag"] == f'"{v}"'
    assert http.get(f"/api/v1/kv/{ns}/a/b/c", headers={"If-None-Match": f'"{v}"'}).status_code == 304
    # the POST route sees the same key
    assert api.kv_one({"op": "get", "ns": ns, "key": "a/b/c"})["version"] == v
    # If-Match fences, If-None-Match: * means "must not exist"
    r = http.put(f"/api/v1/kv/{ns}/a/b/c?ttlSeconds=60", content=b"2", headers={"If-Match": f'"{v + 99}"'})
    assert r.status_code == 412 and r.json()["error"] == "kv_precondition" and r.json()["kvReason"] == "version"
    assert r.json()["version"] == v
    r = http.put(f"/api/v1/kv/{ns}/a/b/c?forever=true", content=b"2", headers={"If-None-Match": "*"})
    assert r.status_code == 412 and r.json()["kvReason"] == "exists"
    r = http.put(f"/api/v1/kv/{ns}/a/b/c?ttlSeconds=60", content=b"2", headers={"If-Match": f'"{v}"'})
    assert r.status_code == 200 and r.json()["value"] == 2
    v2 = r.json()["version"]
    # expiry rules hold on the path route too
    r = http.put(f"/api/v1/kv/{ns}/x", content=b"1")
    assert r.status_code == 400 and r.json()["reason"] == "kv_expiry_not_specified"
    r = http.put(f"/api/v1/kv/{ns}/x?forever=true&ttlSeconds=3", content=b"1")
    assert r.status_code == 400 and r.json()["reason"] == "kv_expiry_not_specified"
    r = http.put(f"/api/v1/kv/{ns}/x?forever=true&ns=other", content=b"1")
    assert r.status_code == 400 and r.json()["reason"] == "kv_no_query_string"
    r = http.put(f"/api/v1/kv/{ns}/x?forever=true", content=b"{bad")
    assert r.status_code == 400 and r.json()["reason"] == "kv_bad_body"
    r = http.put("/api/v1/kv/BAD/x?forever=true", content=b"1")
    assert r.status_code == 400 and r.json()["reason"] == "kv_bad_namespace"
    # delete with a stale If-Match, then for real, then a miss
    assert http.delete(f"/api/v1/kv/{ns}/a/b/c", headers={"If-Match": f'"{v}"'}).status_code == 412
    r = http.delete(f"/api/v1/kv/{ns}/a/b/c", headers={"If-Match": f'"{v2}"'})
    assert r.status_code == 200 and r.json()["applied"] is True
    r = http.delete(f"/api/v1/kv/{ns}/a/b/c")
    assert r.status_code == 200 and r.json()["applied"] is False and r.json()["reason"] == "absent"
    r = http.get(f"/api/v1/kv/{ns}/a/b/c")
    assert r.status_code == 404 and r.json()["error"] == "kv_key_not_found"


async def test_database_trouble_is_the_shared_database_503():
    import asyncpg

    from broker.errors import Unavailable
    from broker.http.kv import apply_db

    async def failing(exc):
        raise exc

    for exc, reason in ((ConnectionError("gone"), "database_unavailable"), (TimeoutError(), "database_unavailable"),
                        (asyncpg.DeadlockDetectedError("deadlock"), "database_conflict")):
        with pytest.raises(Unavailable) as e:
            await apply_db(failing(exc))
        assert e.value.status == 503 and e.value.code == "unavailable" and e.value.reason == reason
        assert e.value.headers["Retry-After"] == "1"
