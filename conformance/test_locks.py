"""Locks and semaphores (docs/protocol.md §5, docs/decisions.md §8): POST /api/v1/locks, fencing tokens,
expiry, semaphore slots, and a permit's guard inside POST /api/v1/transaction."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance.client import expect, expect_error, uniq

contract = pytest.mark.contract


def acquire(name: str, owner: str | None = "o", ttl: int = 30, **kw) -> dict:
    op = {"op": "acquire", "name": name, "ttlSeconds": ttl, **kw}
    if owner is not None:
        op["owner"] = owner
    return op


def get(api, name: str) -> dict:
    return api.lock({"op": "get", "name": name})


def push(q: str, txn: str) -> dict:
    return {"type": "push", "items": [{"queue": q, "payload": {"t": txn}, "transactionId": txn}]}


def refused_whole(api, ops: list[dict], reason: str, *names: str) -> None:
    expect_error(api.locks(ops), 400, "locks_bad_request", reason)
    for n in names:
        assert get(api, n) == {"held": False, "holders": []}, n


@contract("LCK-RESULT-PER-OP", "LCK-ACQUIRE", "LCK-HELD", "LCK-ALREADY")
def test_acquire_held_already(api):
    name, free, other = uniq("lk"), uniq("lk"), uniq("lk")
    res = api.locks_ok([acquire(name, "alice"), {"op": "get", "name": free}, acquire(other, None)])
    got = res[0]
    assert got["acquired"] is True and got["slot"] == 0 and got["owner"] == "alice", got
    assert isinstance(got["token"], int) and got["token"] > 0
    assert got["guard"] == {"op": "check", "ns": "queen-locks", "key": f"{name}#0", "expect": got["token"],
                            "required": True}, got
    assert res[1] == {"held": False, "holders": []}, res[1]
    assert res[2]["acquired"] is True and isinstance(res[2]["owner"], str) and res[2]["owner"], res[2]

    resp = api.locks([acquire(name, "bob")])
    held = expect(resp, 200)["results"][0]
    assert held["acquired"] is False and held["reason"] == "held", held
    (h,) = held["holders"]
    assert {k: h[k] for k in ("slot", "owner", "token")} == {"slot": 0, "owner": "alice", "token": got["token"]}
    assert all(isinstance(h[k], str) for k in ("since", "expiresAt", "renewedAt")), h
    listed = get(api, name)
    assert listed["held"] is True and [x["token"] for x in listed["holders"]] == [got["token"]]

    again = api.lock(acquire(name, "alice"))
    assert again.get("already") is True and again["token"] == got["token"] and again["slot"] == 0, again


@contract("LCK-RENEW-NEW-TOKEN", "LCK-RELEASE")
def test_renew_and_release(api):
    name = uniq("lk")
    got = api.lock(acquire(name, "alice"))
    r = api.lock({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30})
    assert r["renewed"] is True and r["token"] > got["token"] and r["slot"] == 0, r
    assert r["guard"]["expect"] == r["token"] and r["guard"]["key"] == f"{name}#0", r
    stale = api.lock({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30})
    assert stale["renewed"] is False and stale["reason"] == "lost" and stale["holders"][0]["token"] == r["token"]
    assert api.lock({"op": "release", "name": name, "token": got["token"]}) == {"released": False, "reason": "lost"}
    again = api.lock({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30, "owner": "alice"})
    assert again["renewed"] is True and again["token"] > r["token"], again
    assert api.lock({"op": "release", "name": name, "token": again["token"], "slot": 0}) == {"released": True}
    assert get(api, name) == {"held": False, "holders": []}
    assert api.lock({"op": "release", "name": name, "token": again["token"]}) == {"released": False, "reason": "lost"}


@contract("LCK-EXPIRY")
def test_expiry(api):
    name = uniq("lk")
    got = api.lock(acquire(name, "alice", ttl=1))
    time.sleep(1.4)
    assert get(api, name) == {"held": False, "holders": []}
    assert api.lock({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 5})["reason"] == "lost"
    nxt = api.lock(acquire(name, "bob"))
    assert nxt["acquired"] is True and nxt["token"] > got["token"], nxt


@contract("LCK-TOKEN-RISES")
def test_tokens_rise(api):
    name = uniq("lk")
    seen: list[int] = []
    for owner in ("a", "b"):
        got = api.lock(acquire(name, owner))
        r = api.lock({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30})
        seen += [got["token"], r["token"]]
        assert api.lock({"op": "release", "name": name, "token": r["token"]})["released"] is True
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen


@contract("LCK-SEMAPHORE")
def test_semaphore(api):
    name = uniq("sem")
    got = [api.lock(acquire(name, f"o{i}", limit=3)) for i in range(3)]
    assert [g["slot"] for g in got] == [0, 1, 2] and all(g["acquired"] for g in got), got
    full = api.lock(acquire(name, "o3", limit=3))
    assert full["acquired"] is False and full["reason"] == "held" and len(full["holders"]) == 3, full
    assert api.lock({"op": "release", "name": name, "token": got[2]["token"], "slot": 2})["released"] is True
    nxt = api.lock(acquire(name, "o3", limit=3))
    assert nxt["acquired"] is True and nxt["slot"] == 2, nxt


@contract("LCK-CONCURRENT")
def test_concurrent_acquirers(api):
    name, n, k = uniq("race"), 12, 3
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda i: api.locks([acquire(name, f"w{i}", limit=k)]), range(n)))
    results = [expect(a, 200)["results"][0] for a in answers]
    won = [r for r in results if r["acquired"]]
    assert len(won) == k and sorted(r["slot"] for r in won) == list(range(k)), results
    assert len(get(api, name)["holders"]) == k


@contract("LCK-GUARD-TXN")
def test_guard_in_a_transaction(api):
    name, q = uniq("lk"), uniq("q")
    mine = api.lock(acquire(name, "alice"))
    ok = expect(api.http.post("/api/v1/transaction", json={"operations": [push(q, "t1")], "kv": [mine["guard"]]}), 200)
    assert ok.get("success") is True, ok
    assert api.lookup(q, "t1").get("found") is True
    assert api.lock({"op": "release", "name": name, "token": mine["token"]})["released"] is True
    theirs = api.lock(acquire(name, "bob"))
    lost = expect(api.http.post("/api/v1/transaction", json={"operations": [push(q, "t2")], "kv": [mine["guard"]]}), 200)
    assert lost.get("success") is False and lost.get("reason") == "kv_precondition", lost
    assert lost["failedIndex"] == 1 and lost["kvReason"] == "version", lost
    assert isinstance(lost.get("value"), dict) and lost["value"].get("owner") == "bob", lost
    assert lost.get("version") == theirs["token"], lost
    assert api.lookup(q, "t2").get("found") is False


@contract("LCK-PERMIT-KV-ROW")
def test_permit_is_a_kv_row(api):
    name = uniq("lk")
    got = api.lock(acquire(name, "alice"))
    row = api.kv_ok([{"op": "get", "ns": "queen-locks", "key": f"{name}#0"}])[0]
    assert row["found"] is True and row["version"] == got["token"] and row["value"]["owner"] == "alice", row
    expect_error(api.kv([{"op": "put", "ns": "queen-locks", "key": f"{name}#0", "value": {"owner": "m"},
                          "ttlSeconds": 60}]), 400, "kv_bad_request", "kv_reserved_namespace")
    expect_error(api.kv([{"op": "delete", "ns": "queen-locks", "key": f"{name}#0"}]), 400, "kv_bad_request",
                 "kv_reserved_namespace")
    assert get(api, name)["holders"][0]["token"] == got["token"]


@contract("LCK-REFUSALS")
def test_refusals(api):
    n = uniq("bad")
    for op, reason in (
        ({"op": "acquire", "name": "", "ttlSeconds": 5}, "locks_bad_name"),
        ({"op": "acquire", "name": n + "#1", "ttlSeconds": 5}, "locks_bad_name"),
        ({"op": "acquire", "name": n + "\x07", "ttlSeconds": 5}, "locks_bad_name"),
        (acquire(n, ""), "locks_bad_owner"),
        (acquire(n, "o", limit=0), "locks_bad_limit"),
        (acquire(n, "o", ttl=0), "locks_bad_ttl"),
        ({"op": "acquire", "name": n, "ttlSeconds": 5, "forever": True}, "locks_unknown_field"),
        ({"op": "acquire", "name": n, "ttlSeconds": 5, "tenant": "x"}, "locks_tenant_not_an_input"),
        ({"op": "renew", "name": n, "token": 0, "ttlSeconds": 5}, "locks_bad_token"),
        ({"op": "release", "name": n, "token": "1"}, "locks_bad_token"),
        ({"op": "steal", "name": n}, "locks_unknown_op"),
    ):
        refused_whole(api, [acquire(n + "-ok"), op], reason, n, n + "-ok")
    refused_whole(api, [acquire(n), {"op": "get", "name": n}], "locks_duplicate_name", n)


@contract("EDGE-LCK-OPS")
def test_edge_ops(api):
    names = [uniq("e") for _ in range(65)]
    assert len(api.locks_ok([acquire(x) for x in names[:64]])) == 64
    refused_whole(api, [acquire(x) for x in names[1:]] + [acquire(uniq("e"))], "locks_too_many_ops", names[64])


@contract("EDGE-LCK-NAME-BYTES")
def test_edge_name_bytes(api):
    base = uniq("e")
    name = base + "x" * (256 - len(base))
    got = api.lock(acquire(name, "o" * 256))
    assert got["acquired"] is True and got["owner"] == "o" * 256, got
    other = uniq("e")
    refused_whole(api, [acquire(other), acquire(name + "x")], "locks_bad_name", other)
    refused_whole(api, [acquire(other, "o" * 257)], "locks_bad_owner", other)


@contract("EDGE-LCK-LIMIT")
def test_edge_limit(api):
    names = [uniq("e") for _ in range(5)]
    refused_whole(api, [acquire(names[0], limit=1025)], "locks_bad_limit", names[0])
    four = api.locks_ok([acquire(x, limit=1024) for x in names[:4]])
    assert all(r["acquired"] for r in four), four
    refused_whole(api, [acquire(x, limit=1024) for x in names[1:]] + [{"op": "get", "name": names[0]}],
                  "locks_too_many_slots", names[4])


@contract("LCK-TENANT-ISOLATION")
def test_tenant_isolation(api, api_b):
    name = uniq("lk")
    mine = api.lock(acquire(name, "a"))
    assert get(api_b, name) == {"held": False, "holders": []}
    assert api_b.lock({"op": "release", "name": name, "token": mine["token"]})["released"] is False
    lost = expect(api_b.http.post("/api/v1/transaction", json={"operations": [], "kv": [mine["guard"]]}), 200)
    assert lost.get("reason") == "kv_precondition", lost
    theirs = api_b.lock(acquire(name, "b"))
    assert theirs["acquired"] is True and get(api, name)["holders"][0]["owner"] == "a"
