"""The official ``queen-mq`` 2.6.0 client's ephemeral surface (``client.ephemeral``) end to end against the
shared broker: configure, push (direct and buffered), pop (plain, waiting, per group, commit on delivery),
ack with its outcomes, reset, delete, queues and depth, and the two 404s the client tells apart."""

from __future__ import annotations

import asyncio

import pytest
from conftest import uniq
from queen import Queen
from queen.errors import EphemeralError, EphemeralQueueNotFoundError


async def test_configure_push_pop_ack_depth(queen_client):
    eph = queen_client.ephemeral
    q = uniq("ceph")
    conf = await eph.configure(q, max_length=50, lease_seconds=20, retry_limit=2)
    assert conf["options"]["maxLength"] == 50 and conf["options"]["leaseSeconds"] == 20
    assert await eph.push(q, [{"payload": {"n": 1}}, {"data": {"n": 2}}, {"n": 3}], partition="room-7") == \
        {"pushed": 3, "dropped": 0}
    got = await eph.pop(q, batch=10)
    assert got["queue"] == q
    assert [m["payload"] for m in got["messages"]] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert {m["partition"] for m in got["messages"]} == {"room-7"} and {m["attempts"] for m in got["messages"]} == {1}
    depth = await eph.depth(q)
    assert depth["depth"] == 3 and depth["inFlight"] == 3
    # a mixed batch: per-entry status wins over the call's
    msgs = got["messages"]
    res = await eph.ack(q, [msgs[0], {"id": msgs[1]["id"], "status": "retry"}, msgs[2]["id"]])
    assert [r["outcome"] for r in res["results"]] == ["acked", "redelivered", "acked"]
    again = await eph.pop(q, batch=10)
    assert [(m["payload"], m["attempts"]) for m in again["messages"]] == [({"n": 2}, 2)]
    assert [r["outcome"] for r in (await eph.ack(q, again["messages"], status=True))["results"]] == ["acked"]
    assert (await eph.depth(q))["depth"] == 0
    assert (await eph.pop(q))["messages"] == []  # empty is a list, never None


async def test_groups_commit_on_delivery_and_waiting_pop(queen_client):
    eph = queen_client.ephemeral
    q = uniq("ceph-g")
    # subscribers see what is pushed after their first pop (and whatever the ring still holds)
    assert (await eph.pop(q, group="tail-b"))["messages"] == []
    await eph.push(q, ["a", "b"])
    fan_a = await eph.pop(q, group="tail-a", batch=5, commit_on_delivery=True)
    fan_b = await eph.pop(q, group="tail-b", batch=5, auto_ack=True)
    assert [m["payload"] for m in fan_a["messages"]] == ["a", "b"] == [m["payload"] for m in fan_b["messages"]]
    assert (await eph.pop(q, group="tail-a", batch=5))["messages"] == []  # committed at delivery: no redelivery

    async def later() -> None:
        await asyncio.sleep(0.4)
        await eph.push(q, ["c"])

    pusher = asyncio.create_task(later())
    waited = await eph.pop(q, group="tail-a", wait=True, timeout=10_000)
    await pusher
    assert [m["payload"] for m in waited["messages"]] == ["c"]


async def test_reset_delete_queues_and_the_two_404s(queen_client):
    eph = queen_client.ephemeral
    q = uniq("ceph-admin")
    await eph.configure(q, {"ttlSeconds": 300}, policy="dropOldest", max_length=2)
    await eph.push(q, [1, 2])
    assert (await eph.push(q, [3]))["dropped"] == 1  # feed semantics: the oldest made room
    listed = {x["queue"]: x for x in (await eph.queues())["queues"]}
    assert listed[q]["tier"] == "declared" and listed[q]["depth"] == 2 and listed[q]["drops"]["bounds"] == 1
    assert (await eph.reset(q))["dropped"] == 2
    assert (await eph.depth(q))["options"]["policy"] == "dropOldest"
    assert (await eph.delete(q))["deleted"] is True
    assert (await eph.delete(q))["deleted"] is False
    with pytest.raises(EphemeralQueueNotFoundError) as nf:
        await eph.depth(q)
    assert nf.value.code == "ephemeral_queue_not_found"
    with pytest.raises(EphemeralError) as bad:
        await eph.configure(q, max_length=0)
    assert bad.value.status == 400 and bad.value.reason == "bad_option" and not isinstance(bad.value, EphemeralQueueNotFoundError)


async def test_buffered_push_flushes_and_a_full_queue_is_refused(broker):
    async with Queen(broker.url, retry_429={"max_attempts": 1}) as client:
        eph = client.ephemeral
        q = uniq("ceph-buf")
        await eph.configure(q, max_length=3)
        out = await eph.push(q, ["x", "y"], buffered={"message_count": 100, "interval_millis": 60_000})
        assert out == {"buffered": True, "count": 2}
        assert (await eph.depth(q))["depth"] == 0  # still in the client's buffer
        await eph.flush(q)
        assert (await eph.depth(q))["depth"] == 2
        await eph.push(q, ["z"])
        with pytest.raises(EphemeralError) as full:
            await eph.push(q, ["w"])
        assert full.value.status == 429 and full.value.code == "queue_full" and full.value.retry_after_seconds == 1
        assert (await eph.depth(q))["depth"] == 3
