"""The official ``queen-mq`` 2.6.0 client's locks end to end against the shared broker: ``client.lock`` as a
context manager, ``client.semaphore``, background and explicit renew (a new token each time), release,
``client.locks`` (the stateless calls and ``LockResult`` truthiness), ``Lock.run``, and
``transaction().guard(lock)``: it commits while the permit is the handle's and commits nothing, returning
``kv_precondition``, once the permit was lost and taken by another owner (docs/protocol.md §5, §2.6)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import uniq
from queen.errors import LockNotHeldError


async def _holders(client, name: str) -> list[dict]:
    got = await client.locks.get(name)
    assert bool(got) is bool(got["holders"])
    return got["holders"]


async def _found(client, queue: str, txn: str) -> bool:
    body = await client._http_client.get(f"/api/v1/messages/lookup?queue={queue}&txn={txn}")
    return bool(body and body.get("found"))


async def test_lock_as_context_manager_excludes_and_releases(queen_client):
    name = uniq("clk")
    async with queen_client.lock(name, ttl_seconds=10) as lock:
        assert lock.held and lock.slot == 0 and isinstance(lock.token, int) and lock.token > 0
        assert lock.guard() == {"op": "check", "ns": "queen-locks", "key": f"{name}#0", "expect": lock.token,
                                "required": True}
        (h,) = await _holders(queen_client, name)
        assert h["owner"] == lock.owner and h["token"] == lock.token
        other = queen_client.lock(name, ttl_seconds=10)
        assert await other.acquire() is False and not other.held
        with pytest.raises(LockNotHeldError):
            async with queen_client.lock(name, ttl_seconds=10):
                pass
    assert not lock.held and lock.token is None
    assert await _holders(queen_client, name) == []
    # free again: the other handle takes it
    assert await other.acquire() is True
    assert await other.release() is True


async def test_renew_gives_a_new_token_and_background_renewal_keeps_the_permit(queen_client):
    name = uniq("clk")
    lock = queen_client.lock(name, ttl_seconds=10, auto_renew=False)
    assert await lock.acquire()
    first = lock.token
    assert await lock.renew() is True
    assert lock.token > first and lock.guard()["expect"] == lock.token
    assert (await _holders(queen_client, name))[0]["token"] == lock.token
    # the old token no longer works at the broker
    stale = await queen_client.locks.renew(name, token=first, ttl_seconds=10)
    assert not stale and stale["reason"] == "lost"
    assert await lock.release() is True

    kept = queen_client.lock(uniq("clk"), ttl_seconds=2, renew_every=0.4)
    assert await kept.acquire()
    start = kept.token
    await asyncio.sleep(2.6)  # past the first lifetime: only the renewals keep it
    before = kept.token
    assert kept.held and before > start and not kept.lost.is_set()
    at_broker = (await _holders(queen_client, kept.name))[0]["token"]
    assert before <= at_broker <= kept.token  # a renewal may land while the get is in flight
    assert await kept.release() is True


async def test_semaphore_holds_at_most_limit_and_a_waiter_gets_the_freed_permit(queen_client):
    name = uniq("csem")
    handles = [queen_client.semaphore(name, 2, ttl_seconds=10) for _ in range(3)]
    assert [await h.acquire() for h in handles] == [True, True, False]
    assert sorted(h.slot for h in handles[:2]) == [0, 1]
    assert len(await _holders(queen_client, name)) == 2
    waiter = asyncio.ensure_future(handles[2].acquire(wait=5))
    await asyncio.sleep(0.3)
    freed = handles[0].slot
    assert await handles[0].release() is True
    assert await waiter is True and handles[2].slot == freed
    assert sorted(h["owner"] for h in await _holders(queen_client, name)) == sorted(h.owner for h in handles[1:])
    for h in handles[1:]:
        assert await h.release() is True


async def test_stateless_locks_api_and_run(queen_client):
    name = uniq("clk")
    got = await queen_client.locks.acquire(name, ttl_seconds=10, owner="me")
    assert got and got["owner"] == "me" and got["slot"] == 0
    again = await queen_client.locks.acquire(name, ttl_seconds=10, owner="me")
    assert again and again.get("already") is True and again["token"] == got["token"]
    held = await queen_client.locks.acquire(name, ttl_seconds=10, owner="you")
    assert not held and held["reason"] == "held" and held["holders"][0]["owner"] == "me"
    both = await queen_client.locks.batch([{"op": "get", "name": name}, {"op": "get", "name": uniq("clk")}])
    assert [bool(r) for r in both] == [True, False]
    assert await queen_client.locks.release(name, token=got["token"])
    assert not await queen_client.locks.release(name, token=got["token"])

    ran = await queen_client.lock(name, ttl_seconds=10).run(lambda lk: _holders(queen_client, lk.name))
    assert ran["acquired"] is True and len(ran["value"]) == 1
    assert await _holders(queen_client, name) == []


async def test_guarded_transaction_commits_only_while_the_lock_is_held(queen_client):
    name, q = uniq("clk"), uniq("cq")
    lock = queen_client.lock(name, ttl_seconds=30, auto_renew=False)
    assert await lock.acquire()
    ok = await queen_client.transaction().guard(lock).queue(q).push([{"data": {"n": 1}, "transactionId": "t-ok"}]).commit()
    assert ok and await _found(queen_client, q, "t-ok")
    # a renew moves the token; the guard follows it
    assert await lock.renew()
    ok2 = await queen_client.transaction().guard(lock).queue(q).push([{"data": {"n": 2}, "transactionId": "t-ok2"}]).commit()
    assert ok2 and await _found(queen_client, q, "t-ok2")

    # The permit is lost at the broker (released behind the handle's back, as an expiry would) and
    # another owner takes it: the handle still believes it holds it, the broker knows better.
    lost_handlers: list[str] = []
    lock.on_lost(lost_handlers.append)
    assert await queen_client.locks.release(name, token=lock.token, slot=lock.slot)
    thief = queen_client.lock(name, ttl_seconds=30)
    assert await thief.acquire()
    assert lock.held
    res = await queen_client.transaction().guard(lock).queue(q).push([{"data": {"n": 3}, "transactionId": "t-lost"}]).commit()
    assert not res and res["reason"] == "kv_precondition" and res["kvReason"] == "version"
    assert res["failedIndex"] == 1 and res["value"]["owner"] == thief.owner and res["version"] == thief.token
    assert not await _found(queen_client, q, "t-lost")
    assert lock.lost.is_set() and not lock.held and lost_handlers == ["guard"]
    assert await thief.release() is True


async def test_closing_the_client_gives_its_permits_back(broker, queen_client):
    from queen import Queen

    name = uniq("clk")
    async with Queen(broker.url) as own:
        lock = own.semaphore(name, 3, ttl_seconds=30)
        assert await lock.acquire()
        assert len(await _holders(queen_client, name)) == 1
    assert await _holders(queen_client, name) == []


async def test_guard_rides_the_binary_transaction_body_too(broker):
    """With ``binary_push`` + ``push_compression`` the client sends transactions as QTB1 (§1.10); the guard
    still holds the bundle to the permit."""
    from queen import Queen

    name, q = uniq("clk"), uniq("cq")
    async with Queen(broker.url, binary_push=True, push_compression=True) as client:
        lock = client.lock(name, ttl_seconds=30, auto_renew=False)
        assert await lock.acquire()
        ok = await client.transaction().guard(lock).queue(q).push([{"data": {"n": 1}, "transactionId": "b-ok"}]).commit()
        assert ok and await _found(client, q, "b-ok")
        assert await client.locks.release(name, token=lock.token, slot=lock.slot)
        thief = client.lock(name, ttl_seconds=30)
        assert await thief.acquire()
        res = await client.transaction().guard(lock).queue(q).push([{"data": {"n": 2}, "transactionId": "b-lost"}]).commit()
        assert not res and res["reason"] == "kv_precondition" and res["value"]["owner"] == thief.owner
        assert not await _found(client, q, "b-lost") and lock.lost.is_set()
        assert await thief.release()
