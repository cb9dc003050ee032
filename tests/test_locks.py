"""Locks and semaphores: every op of POST /api/v1/locks and every refusal (docs/protocol.md §5), expiry by
the database clock, fencing tokens, semaphore limits, concurrent acquirers, the permit as a KV row and
its guard inside a transaction (docs/decisions.md §8), against the shared broker; tenancy, grants and
the rungs on a broker of their own."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import httpx
import pytest
from conftest import uniq
from helpers import acquire_op, authed, db_fetch, dedicated_broker, push_op, refused, wait_for

TENANT = "default"  # the shared broker runs without authentication


def holders_of(api, name: str) -> list[dict]:
    got = api.lock_one({"op": "get", "name": name})
    assert got["held"] is bool(got["holders"]), got
    return got["holders"]


def test_acquire_get_renew_release_shapes(api):
    name = uniq("lk")
    got = api.lock_one(acquire_op(name, "alice", ttl=30))
    assert set(got) == {"acquired", "slot", "token", "owner", "guard"}, got
    assert got["acquired"] is True and got["slot"] == 0 and got["owner"] == "alice"
    token = got["token"]
    assert isinstance(token, int) and token > 0
    assert got["guard"] == {"op": "check", "ns": "queen-locks", "key": f"{name}#0", "expect": token, "required": True}

    (h,) = holders_of(api, name)
    assert set(h) == {"slot", "owner", "token", "since", "expiresAt", "renewedAt"}
    assert (h["slot"], h["owner"], h["token"]) == (0, "alice", token)
    assert h["since"].endswith("Z") and h["expiresAt"] > h["since"]

    # the same owner again: the permit it has, same token (an answer that was lost, sent again)
    again = api.lock_one(acquire_op(name, "alice"))
    assert again == {**got, "already": True}
    # another owner: held, and who holds it
    other = api.lock_one(acquire_op(name, "bob"))
    assert other["acquired"] is False and other["reason"] == "held"
    assert [(x["owner"], x["token"]) for x in other["holders"]] == [("alice", token)]

    renewed = api.lock_one({"op": "renew", "name": name, "token": token, "ttlSeconds": 30, "slot": 0})
    assert set(renewed) == {"renewed", "slot", "token", "guard"} and renewed["renewed"] is True
    assert renewed["token"] > token and renewed["slot"] == 0
    assert renewed["guard"]["expect"] == renewed["token"]
    (h2,) = holders_of(api, name)
    assert h2["since"] == h["since"] and h2["token"] == renewed["token"] and h2["renewedAt"] >= h["renewedAt"]

    # the old token is gone: renew and release with it are lost
    lost = api.lock_one({"op": "renew", "name": name, "token": token, "ttlSeconds": 30})
    assert lost["renewed"] is False and lost["reason"] == "lost" and lost["holders"][0]["token"] == renewed["token"]
    assert api.lock_one({"op": "release", "name": name, "token": token}) == {"released": False, "reason": "lost"}
    # ... but a renew sent again by its owner (its first answer lost) finds the permit
    retry = api.lock_one({"op": "renew", "name": name, "token": token, "ttlSeconds": 30, "owner": "alice"})
    assert retry["renewed"] is True and retry["token"] > renewed["token"]

    assert api.lock_one({"op": "release", "name": name, "token": retry["token"], "slot": 0}) == {"released": True}
    assert api.lock_one({"op": "get", "name": name}) == {"held": False, "holders": []}
    assert api.lock_one({"op": "release", "name": name, "token": retry["token"]}) == {"released": False, "reason": "lost"}


def test_an_owner_is_minted_when_none_is_given(api):
    name = uniq("lk")
    got = api.lock_one({"op": "acquire", "name": name, "ttlSeconds": 30})
    assert got["acquired"] is True and isinstance(got["owner"], str) and got["owner"]
    assert holders_of(api, name)[0]["owner"] == got["owner"]
    # another anonymous acquire is another owner
    assert api.lock_one({"op": "acquire", "name": name, "ttlSeconds": 30})["reason"] == "held"


def test_several_locks_in_one_call_are_independent(api):
    a, b, c, d = uniq("lk"), uniq("lk"), uniq("lk"), uniq("lk")
    api.lock_one(acquire_op(b, "x"))
    res = api.lock_results(acquire_op(a, "me"), acquire_op(b, "me"), {"op": "get", "name": c},
                           {"op": "release", "name": d, "token": 1})
    assert res[0]["acquired"] is True and res[1]["acquired"] is False and res[1]["reason"] == "held"
    assert res[2] == {"held": False, "holders": []} and res[3] == {"released": False, "reason": "lost"}


def test_expiry_by_the_database_clock(api, broker):
    name = uniq("lk")
    first = api.lock_one(acquire_op(name, "alice", ttl=2))
    (h,) = holders_of(api, name)
    rows = db_fetch(broker.dsn, "SELECT expires_at - updated_at AS ttl FROM queen_kv "
               "WHERE tenant = $1 AND ns = 'queen-locks' AND key = $2", TENANT, f"{name}#0")
    assert rows[0]["ttl"].total_seconds() == 2
    time.sleep(2.3)
    assert holders_of(api, name) == []
    assert api.lock_one({"op": "renew", "name": name, "token": first["token"], "ttlSeconds": 5})["reason"] == "lost"
    assert api.lock_one({"op": "release", "name": name, "token": first["token"], "slot": 0})["released"] is False
    second = api.lock_one(acquire_op(name, "bob"))
    assert second["acquired"] is True and second["slot"] == 0 and second["token"] > first["token"]
    # the expired holder's guard now loses against the new holder
    lost = api.kv_one({**first["guard"], "required": False})
    assert lost["applied"] is False and lost["reason"] == "version" and lost["value"]["owner"] == "bob"


def test_fencing_tokens_rise_on_every_write_of_a_permit_row(api):
    name = uniq("lk")
    tokens = []
    for owner in ("a", "b", "c"):
        got = api.lock_one(acquire_op(name, owner))
        tokens.append(got["token"])
        r = api.lock_one({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30})
        tokens.append(r["token"])
        assert api.lock_one({"op": "release", "name": name, "token": r["token"]})["released"] is True
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


def test_semaphore_slots_and_limit(api):
    name = uniq("sem")
    got = [api.lock_one(acquire_op(name, f"o{i}", limit=3)) for i in range(3)]
    assert [g["slot"] for g in got] == [0, 1, 2] and all(g["acquired"] for g in got)
    assert [g["guard"]["key"] for g in got] == [f"{name}#{i}" for i in range(3)]
    full = api.lock_one(acquire_op(name, "o3", limit=3))
    assert full["acquired"] is False and full["reason"] == "held" and [h["slot"] for h in full["holders"]] == [0, 1, 2]
    # a larger limit from another caller sees a free slot: while a limit changes, the larger one rules
    assert api.lock_one(acquire_op(name, "o4", limit=4))["slot"] == 3
    assert api.lock_one({"op": "release", "name": name, "token": got[1]["token"], "slot": 1})["released"] is True
    freed = api.lock_one(acquire_op(name, "o3", limit=3))
    assert freed["acquired"] is True and freed["slot"] == 1
    assert [h["owner"] for h in holders_of(api, name)] == ["o0", "o3", "o2", "o4"]


@pytest.mark.parametrize("n,k", [(16, 1), (16, 5)])
async def test_concurrent_acquirers_of_a_semaphore_exactly_k_hold(ahttp, n, k):
    name = uniq("race")
    body = [{"operations": [acquire_op(name, f"w{i}", limit=k) if k > 1 else acquire_op(name, f"w{i}")]}
            for i in range(n)]
    answers = await asyncio.gather(*(ahttp.post("/api/v1/locks", json=b) for b in body))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    results = [a.json()["results"][0] for a in answers]
    won = [r for r in results if r["acquired"]]
    assert len(won) == k and sorted(r["slot"] for r in won) == list(range(k))
    assert all(r["reason"] == "held" for r in results if not r["acquired"])
    got = (await ahttp.post("/api/v1/locks", json={"operations": [{"op": "get", "name": name}]})).json()["results"][0]
    assert sorted(h["owner"] for h in got["holders"]) == sorted(r["owner"] for r in won)


def test_permit_is_a_kv_row_readable_but_not_writable_through_kv(api):
    name = uniq("lk")
    got = api.lock_one(acquire_op(name, "alice"))
    row = api.kv_one({"op": "get", "ns": "queen-locks", "key": f"{name}#0"})
    assert row["found"] is True and row["version"] == got["token"] and row["expiresAt"]
    assert row["value"]["owner"] == "alice" and row["value"]["since"]
    assert api.kv_one(got["guard"])["applied"] is True
    for op in ({"op": "put", "ns": "queen-locks", "key": f"{name}#0", "value": {"owner": "mallory"}, "ttlSeconds": 60},
               {"op": "putIfAbsent", "ns": "queen-locks", "key": f"{name}#1", "value": {}, "ttlSeconds": 60},
               {"op": "delete", "ns": "queen-locks", "key": f"{name}#0"},
               {"op": "incr", "ns": "queen-locks", "key": f"{name}#2", "forever": True}):
        refused(api.kv(op), 400, "kv_bad_request", "kv_reserved_namespace")
        refused(api.transaction({"operations": [], "kv": [op]}), 400, "kv_bad_request", "kv_reserved_namespace")
    refused(api.put(f"/api/v1/kv/queen-locks/{name}%230?ttlSeconds=5", content=b"{}"), 400, "kv_bad_request",
            "kv_reserved_namespace")
    refused(api.delete(f"/api/v1/kv/queen-locks/{name}%230"), 400, "kv_bad_request", "kv_reserved_namespace")
    assert holders_of(api, name)[0]["token"] == got["token"]


def test_guard_in_a_transaction_commits_only_while_the_permit_is_held(api):
    name, q = uniq("lk"), uniq("q")
    mine = api.lock_one(acquire_op(name, "alice"))
    ok = api.tx({"operations": [push_op(q, "t1")], "kv": [mine["guard"]]})
    assert ok["success"] is True and api.found(q, "t1")
    # lost: released, then taken by another owner -> the whole bundle rolls back, the answer names the owner
    assert api.lock_one({"op": "release", "name": name, "token": mine["token"]})["released"] is True
    theirs = api.lock_one(acquire_op(name, "bob"))
    lost = api.tx({"operations": [push_op(q, "t2", "t3")], "kv": [mine["guard"]]})
    assert lost["success"] is False and lost["reason"] == "kv_precondition"
    assert lost["failedIndex"] == 2 and lost["kvReason"] == "version"
    assert lost["version"] == theirs["token"] and lost["value"]["owner"] == "bob"
    assert not api.found(q, "t2") and not api.found(q, "t3")
    # lost by expiry with nobody after it: absent
    assert api.lock_one({"op": "release", "name": name, "token": theirs["token"]})["released"] is True
    gone = api.tx({"operations": [push_op(q, "t4")], "kv": [theirs["guard"]]})
    assert gone["reason"] == "kv_precondition" and gone["kvReason"] == "absent" and not api.found(q, "t4")


class _HeldKey:
    """A transaction on the database that holds the KV key lock of one permit row, as a guard's check does
    while its transaction runs (on a thread of its own, until ``release``)."""

    def __init__(self, dsn: str, key: str) -> None:
        self.dsn, self.key = dsn, key
        self.held = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(queen_kv_lock_id($1, 'queen-locks', $2))", TENANT, self.key)
                self.held.set()
                while not self.done.is_set():
                    await asyncio.sleep(0.02)
        finally:
            await conn.close()

    def __enter__(self) -> _HeldKey:
        self.thread.start()
        assert self.held.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)


def test_a_free_slot_whose_row_a_transaction_holds_is_contended_not_waited_for(api, broker):
    name = uniq("lk")
    api.lock_one(acquire_op(name, "alice", ttl=1))
    time.sleep(1.2)
    with _HeldKey(broker.dsn, f"{name}#0"):
        t0 = time.monotonic()
        busy = api.lock_one(acquire_op(name, "bob"))
        assert time.monotonic() - t0 < 2
        assert busy == {"acquired": False, "reason": "contended", "holders": []}
        # a semaphore takes the next free slot instead
        assert api.lock_one(acquire_op(name, "carol", limit=2))["slot"] == 1
    assert api.lock_one(acquire_op(name, "bob", limit=2))["slot"] == 0


def test_a_renew_waits_for_the_transaction_that_holds_its_row(api, broker):
    name = uniq("lk")
    got = api.lock_one(acquire_op(name, "alice"))
    answered: list[dict] = []
    with _HeldKey(broker.dsn, f"{name}#0") as held:
        t = threading.Thread(target=lambda: answered.append(
            api.lock_one({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30})))
        t.start()
        time.sleep(0.6)
        assert answered == []  # the guard's transaction is still running: its token still holds
        held.done.set()
        t.join(10)
    assert answered and answered[0]["renewed"] is True and answered[0]["token"] > got["token"]


def test_each_op_is_metered_as_a_kv_op(api):
    before = api.get("/api/v1/usage").json()["kvOps"]
    name = uniq("lk")
    api.lock_results(acquire_op(name, "a"), {"op": "get", "name": uniq("lk")})
    assert api.get("/api/v1/usage").json()["kvOps"] - before == 2


_LONG = "x" * 257
REFUSALS = [
    ({"operations": "nope"}, "locks_bad_body"),
    ({"operations": [1]}, "locks_bad_body"),
    ({"ops": []}, "locks_bad_body"),
    ({}, "locks_bad_body"),
    ({"operations": [], "tenant": "other"}, "locks_tenant_not_an_input"),
    ({"operations": [{"op": "steal", "name": "n"}]}, "locks_unknown_op"),
    ({"operations": [{"op": "get", "name": "n", "tenant": "x"}]}, "locks_tenant_not_an_input"),
    ({"operations": [{"op": "get", "name": "n", "ttlSeconds": 5}]}, "locks_unknown_field"),
    ({"operations": [{"op": "release", "name": "n", "token": 1, "owner": "o"}]}, "locks_unknown_field"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "forever": True}]}, "locks_unknown_field"),
    ({"operations": [{"op": "get", "name": ""}]}, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "a#b"}]}, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "a\nb"}]}, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "a\u0085b"}]}, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": _LONG}]}, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "é" * 129}]}, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": 5}]}, "locks_bad_name"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "owner": ""}]}, "locks_bad_owner"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "owner": _LONG}]}, "locks_bad_owner"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "owner": "a\x00"}]}, "locks_bad_owner"),
    ({"operations": [{"op": "acquire", "name": "n"}]}, "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 0}]}, "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 1.5}]}, "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": True}]}, "locks_bad_ttl"),
    ({"operations": [{"op": "renew", "name": "n", "token": 1}]}, "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "limit": 0}]}, "locks_bad_limit"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "limit": 1025}]}, "locks_bad_limit"),
    ({"operations": [{"op": "acquire", "name": "n", "ttlSeconds": 5, "limit": "3"}]}, "locks_bad_limit"),
    ({"operations": [{"op": "renew", "name": "n", "ttlSeconds": 5}]}, "locks_bad_token"),
    ({"operations": [{"op": "release", "name": "n", "token": 0}]}, "locks_bad_token"),
    ({"operations": [{"op": "release", "name": "n", "token": False}]}, "locks_bad_token"),
    ({"operations": [{"op": "release", "name": "n", "token": 2**63}]}, "locks_bad_token"),
    ({"operations": [{"op": "release", "name": "n", "token": 1, "slot": -1}]}, "locks_bad_slot"),
    ({"operations": [{"op": "release", "name": "n", "token": 1, "slot": 1024}]}, "locks_bad_slot"),
    ({"operations": [{"op": "get", "name": "n"}, {"op": "release", "name": "n", "token": 1}]}, "locks_duplicate_name"),
    ({"operations": [{"op": "get", "name": f"n{i}"} for i in range(65)]}, "locks_too_many_ops"),
    ({"operations": [{"op": "acquire", "name": f"n{i}", "ttlSeconds": 5, "limit": 1024} for i in range(4)]
      + [{"op": "get", "name": "x"}]}, "locks_too_many_slots"),
]


@pytest.mark.parametrize("body,reason", REFUSALS)
def test_refusals(http, body, reason):
    refused(http.post("/api/v1/locks", json=body), 400, "locks_bad_request", reason)


def test_edges_accepted(api):
    # a 256-byte name (128 two-byte characters, tagged inside the bound), a 256-byte owner, limit 1024
    name = uniq("e")
    name += "é" * ((256 - len(name)) // 2) + "x" * ((256 - len(name)) % 2)
    assert len(name.encode()) == 256
    got = api.lock_one(acquire_op(name, "o" * 256, limit=1024))
    assert got["acquired"] is True and got["owner"] == "o" * 256 and got["guard"]["key"] == f"{name}#0"
    assert api.lock_one({"op": "release", "name": name, "token": got["token"], "slot": 1023}) == \
        {"released": False, "reason": "lost"}
    # 64 ops, and exactly 4096 slot rows (four acquires of limit 1024)
    assert len(api.lock_results(*[{"op": "get", "name": uniq("e")} for _ in range(64)])) == 64
    assert all(r["acquired"] for r in api.lock_results(*[acquire_op(uniq("e"), "o", limit=1024) for _ in range(4)]))


def test_body_refusals(http):
    refused(http.post("/api/v1/locks?x=1", json={"operations": []}), 400, "locks_bad_request", "locks_no_query_string")
    r = http.post("/api/v1/locks", content=b"{nope", headers={"content-type": "application/json"})
    refused(r, 400, "locks_bad_request")
    assert http.post("/api/v1/locks", json={"operations": []}).json() == {"results": []}


# ------------------------------------------------------------------------ tenancy, grants, rungs

SECRET = "locks-test-secret"


@pytest.fixture(scope="module")
def b(pg, tmp_path_factory):
    with dedicated_broker(pg, tmp_path_factory, "locks", {"QUEEN_JWT_SECRET": SECRET, "QUEEN_LIMITS_REFRESH_MS": "200"}) as lb:
        yield lb


def test_tenants_have_their_own_locks(b):
    with authed(SECRET, b, "acme") as a, authed(SECRET, b, "globex") as g:
        mine = a.lock_one(acquire_op("report", "a1"))
        assert g.lock_one({"op": "get", "name": "report"}) == {"held": False, "holders": []}
        theirs = g.lock_one(acquire_op("report", "g1"))
        assert theirs["acquired"] is True and theirs["token"] != mine["token"]
        assert g.lock_one({"op": "release", "name": "report", "token": mine["token"]})["released"] is False
        assert a.lock_one({"op": "get", "name": "report"})["holders"][0]["owner"] == "a1"
        # acme's guard means nothing in globex's transaction
        lost = g.tx({"operations": [], "kv": [mine["guard"]]})
        assert lost["reason"] == "kv_precondition" and lost["kvReason"] == "version"
    with httpx.Client(base_url=b.url, timeout=30) as anon:
        assert anon.post("/api/v1/locks", json={"operations": [{"op": "get", "name": "report"}]}).status_code == 401


def test_grants_like_kv(b):
    get = {"op": "get", "name": "g"}
    with authed(SECRET, b, "t", grants=("consume",)) as reader, authed(SECRET, b, "t", grants=("produce",)) as writer:
        for op in (acquire_op("g", "o"), {"op": "renew", "name": "g", "token": 1, "ttlSeconds": 5},
                   {"op": "release", "name": "g", "token": 1}):
            body = refused(reader.locks(op), 403, "forbidden", "missing_grant")
            assert body["grant"] == "produce"
        assert reader.lock_one(get) == {"held": False, "holders": []}
        assert writer.lock_one(acquire_op("g", "o"))["acquired"] is True
        assert reader.lock_one(get)["held"] is True


def test_suspended_cluster_refuses_acquire_and_renew_but_not_release(b):
    with authed(SECRET, b, "ops", grants=("admin",)) as admin, authed(SECRET, b, "susp") as t:
        got = t.lock_one(acquire_op("s", "o"))
        assert admin.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).status_code == 200
        try:
            refused(t.locks(acquire_op("s2", "o")), 403, "cluster_suspended")
            refused(t.locks({"op": "renew", "name": "s", "token": got["token"], "ttlSeconds": 5}), 403, "cluster_suspended")
            assert t.lock_one({"op": "get", "name": "s"})["held"] is True
            assert t.lock_one({"op": "release", "name": "s", "token": got["token"]})["released"] is True
        finally:
            assert admin.post("/api/v1/admin/cluster/suspended", json={"suspended": False}).status_code == 200


def test_kv_switch_turns_locks_off(b):
    with authed(SECRET, b, "ops", grants=("admin",)) as admin, authed(SECRET, b, "sw") as t:
        assert admin.post("/api/v1/admin/kv", json={"enabled": False}).status_code == 200
        try:
            r = t.locks({"op": "get", "name": "x"})
            refused(r, 503, "kv_disabled")
            assert r.headers.get("Retry-After")
        finally:
            assert admin.post("/api/v1/admin/kv", json={"enabled": True}).status_code == 200
        assert t.lock_one({"op": "get", "name": "x"})["held"] is False


def test_permits_are_kv_storage_and_the_pruner_removes_expired_ones(b):
    def gauge() -> int:
        return db_fetch(b.dsn, "SELECT coalesce(sum(storage_bytes), 0)::bigint AS n FROM queen_usage_gauges "
                        "WHERE tenant = 'gauge'")[0]["n"]

    def rows() -> int:
        """What the permit rows of the tenant weigh, measured the KV's way (key + value JSON text)."""
        return db_fetch(b.dsn, "SELECT coalesce(sum(octet_length(key) + octet_length(value::text)), 0)::bigint AS n "
                        "FROM queen_kv WHERE tenant = 'gauge' AND ns = 'queen-locks'")[0]["n"]

    with authed(SECRET, b, "gauge") as t:
        assert gauge() == rows() == 0
        got = t.lock_one(acquire_op("g1", "owner-1", ttl=1, limit=2))
        t.lock_one(acquire_op("g2", "owner-2"))
        assert gauge() == rows() > 0
        token = t.lock_one({"op": "get", "name": "g2"})["holders"][0]["token"]
        renewed = t.lock_one({"op": "renew", "name": "g2", "token": token, "ttlSeconds": 30})
        assert renewed["renewed"] and gauge() == rows()
        time.sleep(1.2)
        # an expired permit taken over by another owner is rewritten in place
        assert t.lock_one(acquire_op("g1", "someone-else-entirely", ttl=1))["token"] > got["token"]
        assert gauge() == rows()
        assert t.lock_one({"op": "release", "name": "g2", "token": renewed["token"]})["released"]
        assert gauge() == rows()
        time.sleep(1.2)
        # expired, unpruned: gone for the locks and the KV alike; the pruner deletes it and gives its bytes back
        assert t.lock_one({"op": "get", "name": "g1"})["held"] is False
        db_fetch(b.dsn, "SELECT queen_kv_prune(1000)")
        wait_for(lambda: rows() == 0, what="expired permit pruned")
        assert gauge() == 0


def test_rate_limit_refuses_acquires_not_releases(b):
    with authed(SECRET, b, "ops", grants=("admin",)) as admin, authed(SECRET, b, "slow") as t:
        assert admin.put("/api/v1/admin/tenants/slow/plan", json={"rateLimitPerS": 1}).status_code == 200
        try:
            got = t.lock_one(acquire_op("r1", "o"))
            # (every worker honours the plan within the refresh bound; acquire until the bucket is empty)
            r = wait_for(lambda: (x := t.locks(acquire_op("r2", "o"))).status_code == 429 and x, timeout=5,
                         what="an acquire refused by the rate limit")
            refused(r, 429, "rate_limited", "kv_rate_limited")
            assert r.headers.get("Retry-After")
            # the bucket is empty now, and a release still goes through
            assert t.lock_one({"op": "release", "name": "r1", "token": got["token"]})["released"] is True
        finally:
            assert admin.delete("/api/v1/admin/tenants/slow/plan").status_code == 200
