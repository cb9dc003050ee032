"""KV (docs/protocol.md §4): POST /api/v1/kv."""

from __future__ import annotations

import uuid

import pytest

from conformance.client import expect, expect_error, parse_ts, poll

contract = pytest.mark.contract


def ns() -> str:
    return f"cf-{uuid.uuid4().hex[:10]}"


def put(key: str, value, n: str, **kw) -> dict:
    op = {"op": "put", "ns": n, "key": key, "value": value}
    op.update(kw if ("ttlSeconds" in kw or "forever" in kw) else {"forever": True, **kw})
    return op


@contract("KV-INDEX-ALIGNED", "KV-FOUND-SEPARATE")
def test_index_aligned_and_found(api):
    n = ns()
    res = api.kv_ok([put("a", None, n), {"op": "get", "ns": n, "key": "a"}, {"op": "get", "ns": n, "key": "zz"},
                     put("b", {"v": 1}, n)])
    assert [r.get("index") for r in res] == [0, 1, 2, 3], res
    assert [r.get("op") for r in res] == ["put", "get", "get", "put"], res
    assert res[1]["found"] is True and res[1]["value"] is None and "version" in res[1], res[1]
    assert res[2]["found"] is False, res[2]
    again = api.kv_ok([{"op": "get", "ns": n, "key": "b"}, {"op": "get", "ns": n, "key": "a"}])
    assert again[0]["value"] == {"v": 1} and again[1] == {**again[1], "found": True, "value": None}


@contract("KV-EXPIRY-REQUIRED")
def test_expiry_exactly_one(api):
    n = ns()
    for op in ({"op": "put", "ns": n, "key": "k", "value": 1},
               {"op": "put", "ns": n, "key": "k", "value": 1, "ttlSeconds": 5, "forever": True},
               {"op": "putIfAbsent", "ns": n, "key": "k", "value": 1},
               {"op": "incr", "ns": n, "key": "k", "delta": 1},
               {"op": "put", "ns": n, "key": "k", "value": 1, "ttlSeconds": 0},
               {"op": "put", "ns": n, "key": "k", "value": 1, "ttlSeconds": 1.5},
               {"op": "put", "ns": n, "key": "k", "value": 1, "expiresAt": "2030-01-01T00:00:00Z", "forever": True}):
        expect_error(api.kv([op]), 400, "kv_bad_request")
    assert api.kv_ok([{"op": "get", "ns": n, "key": "k"}])[0]["found"] is False


@contract("KV-TTL-SECONDS", "KV-EXPIRED-NEVER-RETURNED")
def test_ttl_seconds_and_expiry(api):
    n = ns()
    w = api.kv_ok([put("t", {"v": 1}, n, ttlSeconds=1), put("f", {"v": 2}, n, forever=True)])
    assert w[0]["applied"] is True
    got = api.kv_ok([{"op": "get", "ns": n, "key": "t"}])[0]
    assert got["found"] is True and got["expiresAt"], got
    ttl = parse_ts(got["expiresAt"]) - parse_ts(got["updatedAt"])
    assert 0.9 <= ttl <= 1.1, f"ttlSeconds: 1 means one second, got {ttl:.3f}s"
    poll(lambda: api.kv_ok([{"op": "get", "ns": n, "key": "t"}])[0]["found"] is False, timeout=4,
         what="expired key no longer returned")
    res = api.kv_ok([{"op": "getMany", "ns": n, "keys": ["t", "f"]},
                     {"op": "getPrefix", "ns": n, "prefix": "t"},
                     {"op": "check", "ns": n, "key": "t", "expect": 0}])
    assert [r["key"] for r in res[0]["rows"]] == ["f"] and res[0]["missing"] == ["t"], res[0]
    assert res[1]["rows"] == [], res[1]
    assert res[2]["applied"] is True, f"an expired key does not exist: check expect 0 holds: {res[2]}"
    pia = api.kv_ok([{"op": "putIfAbsent", "ns": n, "key": "t", "value": 3, "forever": True}])[0]
    assert pia["applied"] is True, f"putIfAbsent wins over an expired row: {pia}"


@contract("KV-PUT-IF-ABSENT")
def test_put_if_absent(api):
    n = ns()
    first = api.kv_ok([{"op": "putIfAbsent", "ns": n, "key": "k", "value": "one", "forever": True}])[0]
    assert first["applied"] is True
    second = api.kv_ok([{"op": "putIfAbsent", "ns": n, "key": "k", "value": "two", "forever": True}])[0]
    assert second["applied"] is False and second["reason"] == "exists", second
    assert second["value"] == "one" and second["version"] == first["version"], second


@contract("KV-EXPECT")
def test_expect(api):
    n = ns()
    missing = api.kv_ok([put("k", 1, n, forever=True, expect=5)])[0]
    assert missing["applied"] is False and missing["reason"] == "absent" and missing["version"] == 0, missing
    assert api.kv_ok([{"op": "get", "ns": n, "key": "k"}])[0]["found"] is False, "expect N>0 creates nothing"
    v1 = api.kv_ok([put("k", 1, n, expect=0)])[0]
    assert v1["applied"] is True
    stale = api.kv_ok([put("k", 2, n, expect=v1["version"] + 1000)])[0]
    assert stale["applied"] is False and stale["reason"] == "version", stale
    assert stale["value"] == 1 and stale["version"] == v1["version"], stale
    ok = api.kv_ok([put("k", 3, n, expect=v1["version"])])[0]
    assert ok["applied"] is True and ok["version"] != v1["version"], ok


@contract("KV-DELETE-ABSENT-200", "KV-VERSION-NEVER-REUSED")
def test_delete_and_versions(api):
    n = ns()
    resp = api.kv([{"op": "delete", "ns": n, "key": "nope"}])
    r = expect(resp, 200)["results"][0]
    assert r["applied"] is False and r["reason"] == "absent", r
    v1 = api.kv_ok([put("k", 1, n)])[0]["version"]
    d = api.kv_ok([{"op": "delete", "ns": n, "key": "k"}])[0]
    assert d["applied"] is True, d
    gone = api.kv_ok([{"op": "check", "ns": n, "key": "k", "expect": v1}])[0]
    assert gone["applied"] is False and gone["reason"] == "absent" and gone["version"] == 0, gone
    v2 = api.kv_ok([put("k", 1, n)])[0]["version"]
    assert v2 != v1, "a recreated key gets a new version"


@contract("KV-INCR")
def test_incr(api):
    n = ns()
    a = api.kv_ok([{"op": "incr", "ns": n, "key": "c", "delta": 2, "forever": True}])[0]
    assert a["applied"] is True and a["value"] == 2, a
    b = api.kv_ok([{"op": "incr", "ns": n, "key": "c", "delta": 5, "max": 5, "forever": True}])[0]
    assert b["applied"] is False and b["reason"] == "limit" and b["value"] == 2, f"no saturation: {b}"
    c = api.kv_ok([{"op": "incr", "ns": n, "key": "c", "delta": 3, "max": 5, "forever": True}])[0]
    assert c["applied"] is True and c["value"] == 5, c
    api.kv_ok([put("s", "text", n)])
    t = api.kv_ok([{"op": "incr", "ns": n, "key": "s", "delta": 1, "forever": True}])[0]
    assert t["applied"] is False and t["reason"] == "type", t


@contract("KV-CHECK")
def test_check(api):
    n = ns()
    v = api.kv_ok([put("k", 1, n)])[0]["version"]
    res = api.kv_ok([{"op": "check", "ns": n, "key": "k", "expect": v},
                     {"op": "check", "ns": n, "key": "k", "expect": v + 1000},
                     {"op": "check", "ns": n, "key": "k", "expect": 0},
                     {"op": "check", "ns": n, "key": "missing", "expect": 3}])
    assert res[0]["applied"] is True, res[0]
    assert res[1]["applied"] is False and res[1]["reason"] == "version", res[1]
    assert res[2]["applied"] is False and res[2]["reason"] == "exists", res[2]
    assert res[3]["applied"] is False and res[3]["reason"] == "absent", res[3]


@contract("KV-REQUIRED-ABORTS")
def test_required_aborts_call(api):
    n = ns()
    api.kv_ok([put("held", "x", n)])
    resp = api.kv([put("other", "y", n),
                   {"op": "putIfAbsent", "ns": n, "key": "held", "value": "z", "forever": True, "required": True}])
    data = expect(resp, 200)
    assert data.get("ok") is False or data.get("success") is False, data
    assert data.get("reason") == "kv_precondition" and data.get("failedIndex") == 1, data
    got = api.kv_ok([{"op": "get", "ns": n, "key": "other"}, {"op": "get", "ns": n, "key": "held"}])
    assert got[0]["found"] is False, "nothing of an aborted call is applied"
    assert got[1]["value"] == "x"


@contract("KV-READ-OWN-WRITES")
def test_reads_see_own_writes(api):
    n = ns()
    res = api.kv_ok([put("a", 1, n), {"op": "get", "ns": n, "key": "a"},
                     {"op": "incr", "ns": n, "key": "c", "delta": 4, "forever": True},
                     {"op": "getMany", "ns": n, "keys": ["a", "c"]}])
    assert res[1]["found"] is True and res[1]["value"] == 1, res[1]
    assert sorted(r["key"] for r in res[3]["rows"]) == ["a", "c"], res[3]


@contract("KV-DUPLICATE-KEY")
def test_duplicate_write_key(api):
    n = ns()
    err = expect_error(api.kv([put("a", 1, n), put("a", 2, n)]), 400, "kv_bad_request")
    assert err["reason"] == "kv_duplicate_key_in_call", err
    assert api.kv_ok([{"op": "get", "ns": n, "key": "a"}])[0]["found"] is False


@contract("KV-GETPREFIX")
def test_get_prefix(api):
    n = ns()
    keys = ["p/a", "p/B", "p/_", "p/b", "q/x"]
    api.kv_ok([put(k, k, n) for k in keys])
    res = api.kv_ok([{"op": "getPrefix", "ns": n, "prefix": "p/"}])[0]
    want = sorted([k for k in keys if k.startswith("p/")], key=str.encode)
    assert [r["key"] for r in res["rows"]] == want and res["truncated"] is False, res
    page = api.kv_ok([{"op": "getPrefix", "ns": n, "prefix": "p/", "limit": 2}])[0]
    assert [r["key"] for r in page["rows"]] == want[:2] and page["truncated"] is True and page["nextAfter"] == want[1]
    nxt = api.kv_ok([{"op": "getPrefix", "ns": n, "prefix": "p/", "after": page["nextAfter"], "limit": 2}])[0]
    assert [r["key"] for r in nxt["rows"]] == want[2:4] and nxt["truncated"] is False, nxt
    big = api.kv_ok([{"op": "getPrefix", "ns": n, "prefix": "p/", "limit": 100000}])[0]
    assert len(big["rows"]) == 4, "limit is clamped, never rejected"
    expect_error(api.kv([{"op": "getPrefix", "ns": n, "prefix": ""}]), 400)


@contract("KV-LIMITS")
def test_kv_limits(api):
    n = ns()
    expect_error(api.kv([{"op": "get", "ns": n, "key": f"k{i}"} for i in range(257)]), 400)
    expect_error(api.kv([put("big", "x" * (64 * 1024 + 10), n)]), 413, "payload_too_large")
    expect_error(api.kv([put("k", 1, "Bad Namespace!")]), 400)
    expect_error(api.kv([{**put("k", 1, n), "tenant": "someone-else"}]), 400)
    expect_error(api.kv([put("", 1, n)]), 400)
    assert api.kv_ok([{"op": "get", "ns": n, "key": "k"}])[0]["found"] is False


@contract("KV-TENANT-ISOLATION")
def test_kv_tenant_isolation(api, api_b):
    n = ns()
    api.kv_ok([put("secret", "a-only", n)])
    assert api_b.kv_ok([{"op": "get", "ns": n, "key": "secret"}])[0]["found"] is False
    api_b.kv_ok([put("secret", "b-value", n)])
    api_b.kv_ok([{"op": "delete", "ns": n, "key": "secret"}])
    assert api.kv_ok([{"op": "get", "ns": n, "key": "secret"}])[0]["value"] == "a-only"


@contract("KV-EXPIRY-NOT-INHERITED")
def test_expiry_not_inherited(api):
    n = ns()
    api.kv_ok([put("p", 1, n, ttlSeconds=100)])
    api.kv_ok([put("p", 2, n, forever=True)])
    got = api.kv_ok([{"op": "get", "ns": n, "key": "p"}])[0]
    assert got["expiresAt"] is None, f"a put never inherits the previous expiry: {got}"
    first = api.kv_ok([{"op": "incr", "ns": n, "key": "c", "delta": 1, "ttlSeconds": 100}])[0]
    assert first["applied"] is True
    e1 = api.kv_ok([{"op": "get", "ns": n, "key": "c"}])[0]["expiresAt"]
    api.kv_ok([{"op": "incr", "ns": n, "key": "c", "delta": 1, "ttlSeconds": 5}])
    e2 = api.kv_ok([{"op": "get", "ns": n, "key": "c"}])[0]
    assert e2["value"] == 2 and e2["expiresAt"] == e1, f"an incr's TTL is create-only: {e1} then {e2}"
    expect_error(api.kv([{"op": "putIfAbsent", "ns": n, "key": "x", "value": 1, "forever": True, "expect": 3}]), 400)


@contract("KV-PATH-ROUTES")
def test_path_routes(api):
    n = ns()
    resp = api.http.put(f"/api/v1/kv/{n}/a/b", params={"forever": "true"}, json={"via": "path"})
    assert resp.status_code in (200, 201), resp.text[:200]
    row = api.kv_ok([{"op": "get", "ns": n, "key": "a/b"}])[0]
    assert row["found"] is True and row["value"] == {"via": "path"}, row
    got = api.http.get(f"/api/v1/kv/{n}/a/b")
    assert got.status_code == 200, got.text[:200]
    assert str(row["version"]) in got.headers.get("etag", ""), f"ETag carries the version: {got.headers}"
    expect(api.http.delete(f"/api/v1/kv/{n}/a/b"), (200, 204))
    assert api.kv_ok([{"op": "get", "ns": n, "key": "a/b"}])[0]["found"] is False
