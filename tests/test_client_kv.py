"""The official ``queen-mq`` 2.6.0 client's KV API end to end against the shared broker: ``client.kv``
(get, get_many, get_prefix, list_all, put with expect, put_if_absent, once, delete, incr, check, batch),
the ``KvResult`` truthiness, ``KvError`` codes, and the transaction rider ``tx.kv`` / ``tx.once``."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from conftest import uniq
from queen.errors import KvError


async def test_put_get_and_versions(queen_client):
    ns = uniq("ckv")
    res = await queen_client.kv.put(ns, "cfg", {"limit": 5}, forever=True)
    assert res and res["applied"] and res["version"] > 0
    got = await queen_client.kv.get(ns, "cfg")
    assert got and got["value"] == {"limit": 5} and got["version"] == res["version"] and got["expiresAt"] is None
    miss = await queen_client.kv.get(ns, "nope")
    assert not miss and miss["found"] is False
    stale = await queen_client.kv.put(ns, "cfg", {"limit": 6}, forever=True, expect=res["version"] + 1)
    assert not stale and stale["reason"] == "version" and stale["value"] == {"limit": 5}
    fresh = await queen_client.kv.put(ns, "cfg", {"limit": 6}, ttl=timedelta(minutes=5), expect=res["version"])
    assert fresh and fresh["version"] > res["version"]
    assert (await queen_client.kv.get(ns, "cfg"))["expiresAt"] is not None
    null = await queen_client.kv.put(ns, "nothing", None, ttl_seconds=30)
    assert null and (await queen_client.kv.get(ns, "nothing"))["found"] is True


async def test_put_if_absent_once_and_delete(queen_client):
    ns = uniq("ckv")
    assert await queen_client.kv.once(ns, "job:1", ttl_seconds=60) is True
    assert await queen_client.kv.once(ns, "job:1", ttl_seconds=60) is False
    lost = await queen_client.kv.put_if_absent(ns, "job:1", "x", forever=True)
    assert not lost and lost["reason"] == "exists" and lost["value"] is True
    winners = await asyncio.gather(*[queen_client.kv.once(ns, "race", forever=True, value=i) for i in range(6)])
    assert winners.count(True) == 1
    gone = await queen_client.kv.delete(ns, "job:1")
    assert gone and gone["applied"]
    again = await queen_client.kv.delete(ns, "job:1")
    assert not again and again["reason"] == "absent"
    v = (await queen_client.kv.put(ns, "fenced", 1, forever=True))["version"]
    assert (await queen_client.kv.delete(ns, "fenced", expect=v + 1))["reason"] == "version"
    assert await queen_client.kv.delete(ns, "fenced", expect=v)


async def test_incr_limiter_and_check(queen_client):
    ns = uniq("ckv")
    admitted = [bool(await queen_client.kv.incr(ns, "rate:acme", max=3, ttl_seconds=60)) for _ in range(5)]
    assert admitted == [True, True, True, False, False]
    res = await queen_client.kv.incr(ns, "rate:acme", delta=-1, min=0, forever=True)
    assert res["value"] == 2
    typed = await queen_client.kv.put(ns, "s", "text", forever=True)
    assert (await queen_client.kv.incr(ns, "s", forever=True))["reason"] == "type"
    held = await queen_client.kv.check(ns, "s", expect=typed["version"])
    assert held and held["applied"]
    assert not await queen_client.kv.check(ns, "s", expect=0)
    assert await queen_client.kv.check(ns, "never", expect=0)


async def test_get_many_get_prefix_and_list_all(queen_client):
    ns = uniq("ckv")
    await queen_client.kv.batch([queen_client.kv.op.put(ns, f"user/{i:03d}", {"i": i}, forever=True) for i in range(25)])
    many = await queen_client.kv.get_many(ns, ["user/001", "user/999", "user/002"])
    assert [r["key"] for r in many["rows"]] == ["user/001", "user/002"] and many["missing"] == ["user/999"]
    page = await queen_client.kv.get_prefix(ns, "user/", limit=10)
    assert len(page["rows"]) == 10 and page["truncated"] and page["nextAfter"] == "user/009"
    keys = await queen_client.kv.get_prefix(ns, "user/01", keys_only=True)
    assert [r["key"] for r in keys["rows"]] == [f"user/{i:03d}" for i in range(10, 20)]
    assert all("value" not in r for r in keys["rows"])
    rows = await queen_client.kv.list_all(ns, "user/", limit=7)
    assert [r["key"] for r in rows] == [f"user/{i:03d}" for i in range(25)]
    assert len(await queen_client.kv.list_all(ns, "user/", limit=7, max_rows=9)) == 9


async def test_batch_index_aligned_and_required(queen_client):
    ns = uniq("ckv")
    op = queen_client.kv.op
    res = await queen_client.kv.batch([op.put(ns, "a", 1, forever=True), op.get(ns, "a"), op.incr(ns, "n", forever=True),
                                 op.check(ns, "zz", expect=0)])
    assert [r["index"] for r in res] == [0, 1, 2, 3]
    assert res[1]["value"] == 1 and res[2]["value"] == 1 and bool(res[3])
    # a lost required precondition: nothing applied, no results (documented: the queen_client sees [])
    lost = await queen_client.kv.batch([op.put(ns, "b", 1, forever=True), op.check(ns, "a", expect=0, required=True)])
    assert lost == []
    assert not await queen_client.kv.get(ns, "b")
    with pytest.raises(KvError) as e:
        await queen_client.kv.put(ns, "a", 2, forever=True, expect=0, required=True)
    assert e.value.code == "kv_result_missing"


async def test_errors_carry_codes(queen_client):
    with pytest.raises(KvError) as e:
        await queen_client.kv.get("Bad-NS", "k")
    assert e.value.code == "kv_bad_request" and e.value.reason == "kv_bad_namespace" and e.value.status == 400
    with pytest.raises(KvError) as e:
        await queen_client.kv.put(uniq("ckv"), "k", "x" * 70_000, forever=True)
    assert e.value.code == "payload_too_large" and e.value.reason == "kv_value_too_large" and e.value.status == 413
    with pytest.raises(KvError) as e:
        await queen_client.kv.batch([queen_client.kv.op.put("ns", "k", 1, forever=True), queen_client.kv.op.delete("ns", "k")])
    assert e.value.reason == "kv_duplicate_key_in_call"
    with pytest.raises(ValueError):  # the queen_client refuses a write without an expiry before sending
        await queen_client.kv.put("ns", "k", 1)


async def test_expired_keys_are_never_returned(queen_client):
    ns = uniq("ckv")
    await queen_client.kv.put(ns, "flash", "v", ttl_seconds=1)
    assert await queen_client.kv.get(ns, "flash")
    await asyncio.sleep(1.2)
    assert not await queen_client.kv.get(ns, "flash")
    assert await queen_client.kv.once(ns, "flash", forever=True)  # an expired row does not exist


async def test_transaction_rider(queen_client):
    ns, q = uniq("ckv"), uniq("q")
    v = (await queen_client.kv.put(ns, "saga:1", {"state": "open"}, forever=True))["version"]
    tx = queen_client.transaction()
    tx.queue(q).push([{"data": {"order": 1}}])
    tx.kv.put(ns, "saga:1", {"state": "closed"}, forever=True, expect=v, required=True)
    tx.kv.get(ns, "saga:1")
    tx.once(ns, "effect:1", ttl_seconds=60)
    res = await tx.commit()
    assert res and res["success"] is True
    kv_results = [r for r in res["results"] if r.get("type") == "kv"]
    assert [r["index"] for r in kv_results] == [1, 2, 3]
    assert kv_results[1]["value"] == {"state": "closed"}
    # replay of the same step: the fence holds, the whole bundle is rolled back and RETURNED
    tx = queen_client.transaction()
    tx.queue(q).push([{"data": {"order": 2}}])
    tx.kv.put(ns, "saga:1", {"state": "closed"}, forever=True, expect=v, required=True)
    lost = await tx.commit()
    assert not lost and lost["reason"] == "kv_precondition" and lost["failedIndex"] == 1
    assert lost["kvReason"] == "version" and lost["value"] == {"state": "closed"}
    popped = await queen_client.queue(q).batch(10).wait(False).pop()
    assert [m["data"] for m in popped] == [{"order": 1}]
    with pytest.raises(ValueError):
        queen_client.transaction().kv.get_prefix(ns, "saga")
