"""The queue options the official ``queen-mq`` client sends at configure, each honoured: every test
configures a queue through the client, then asserts the option's documented effect on push and pop
(broker/sql/functions/queue_options.sql; docs/reference/client-surface.md; docs/decisions.md §7)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from conftest import uniq


async def _pop(client, q: str, **kw) -> list[dict]:
    return await client.queue(q).batch(kw.pop("batch", 10)).wait(False).pop()


async def test_delayed_processing_holds_a_message_until_it_is_due(queen_client):
    q = uniq("qo-delay")
    await queen_client.queue(q).config({"delayed_processing": 2}).create()
    t0 = time.monotonic()
    await queen_client.queue(q).push([{"data": "later"}])
    assert await _pop(queen_client, q) == []
    await asyncio.sleep(1.0)
    assert await _pop(queen_client, q) == []
    # a long poll is woken when the message becomes due (the empty pop's hint), not at its timeout
    got = await queen_client.queue(q).batch(1).wait(True).timeout_millis(10_000).pop()
    assert [m["data"] for m in got] == ["later"]
    assert 1.8 <= time.monotonic() - t0 < 4.0


async def test_delayed_processing_holds_the_later_messages_of_a_partition_too(queen_client):
    q = uniq("qo-delay2")
    await queen_client.queue(q).config({"delayed_processing": 1}).create()
    await queen_client.queue(q).push([{"data": "a"}])
    await asyncio.sleep(0.6)
    await queen_client.queue(q).push([{"data": "b"}])
    await asyncio.sleep(0.6)
    # "a" is due, "b" is not yet: only "a" comes out, offsets stay in order
    assert [m["data"] for m in await _pop(queen_client, q)] == ["a"]


async def test_retry_delay_keeps_a_nacked_message_back(queen_client):
    q = uniq("qo-retry")
    await queen_client.queue(q).config({"retry_delay": 2000}).create()
    await queen_client.queue(q).push([{"data": "flaky"}])
    [m] = await _pop(queen_client, q)
    assert m["deliveryAttempt"] == 1
    t0 = time.monotonic()
    assert (await queen_client.ack(m, False, {"error": "try later"}))["success"] is True
    assert await _pop(queen_client, q) == []
    await asyncio.sleep(1.0)
    assert await _pop(queen_client, q) == []
    got = await queen_client.queue(q).batch(1).wait(True).timeout_millis(10_000).pop()
    assert [(x["data"], x["deliveryAttempt"]) for x in got] == [("flaky", 2)]
    assert 1.8 <= time.monotonic() - t0 < 4.0


async def test_without_retry_delay_a_nacked_message_comes_back_at_once(queen_client):
    q = uniq("qo-noretry")
    await queen_client.queue(q).create()
    await queen_client.queue(q).push([{"data": "x"}])
    [m] = await _pop(queen_client, q)
    await queen_client.ack(m, False)
    assert [x["deliveryAttempt"] for x in await _pop(queen_client, q)] == [2]


async def test_max_size_refuses_the_push_that_would_exceed_it(queen_client):
    q = uniq("qo-max")
    await queen_client.queue(q).config({"max_size": 2}).create()
    await queen_client.queue(q).push([{"data": 1}])
    await queen_client.queue(q).push([{"data": 2}])
    with pytest.raises(Exception, match="queue_full") as exc:
        await queen_client.queue(q).push([{"data": 3}])
    assert "maxSize 2" in str(exc.value)
    # nothing of the refused push was written; consuming one message makes room for one
    [m] = await _pop(queen_client, q, batch=1)
    assert m["data"] == 1
    with pytest.raises(Exception, match="queue_full"):  # leased, not done: still in the backlog
        await queen_client.queue(q).push([{"data": 3}])
    await queen_client.ack(m, True)
    await queen_client.queue(q).push([{"data": 3}])
    assert [x["data"] for x in await _pop(queen_client, q)] == [2, 3]


async def test_max_size_refuses_a_whole_batch_that_does_not_fit(queen_client):
    q = uniq("qo-maxb")
    await queen_client.queue(q).config({"max_size": 3}).create()
    await queen_client.queue(q).push([{"data": 1}, {"data": 2}])
    failed: list = []

    async def on_error(items, error):
        failed.extend([items, str(error)])

    await queen_client.queue(q).push([{"data": 3}, {"data": 4}]).on_error(on_error)
    items, error = failed
    assert [it["result"]["status"] for it in items] == ["failed", "failed"] and "queue_full" in error
    assert [x["data"] for x in await _pop(queen_client, q)] == [1, 2]


async def test_max_size_in_a_transaction_refuses_it_whole(queen_client):
    q, other = uniq("qo-maxtx"), uniq("qo-maxtx")
    await queen_client.queue(q).config({"max_size": 1}).create()
    await queen_client.queue(q).push([{"data": 1}])
    with pytest.raises(Exception, match="queue_full"):
        await queen_client.transaction().queue(other).push([{"data": "o"}]).queue(q).push([{"data": 2}]).commit()
    assert await _pop(queen_client, other) == []  # all or nothing


async def test_priority_orders_a_namespace_pop(queen_client):
    ns = uniq("qo-ns")
    low, high = f"{ns}-a-low", f"{ns}-b-high"  # by name alone, "low" would be served first
    await queen_client.queue(low).namespace(ns).config({"priority": 1}).create()
    await queen_client.queue(high).namespace(ns).config({"priority": 9}).create()
    await queen_client.queue(low).push([{"data": "low"}])
    await queen_client.queue(high).push([{"data": "high"}])
    first = await queen_client.queue().namespace(ns).batch(1).wait(False).pop()
    second = await queen_client.queue().namespace(ns).batch(1).wait(False).pop()
    assert [m["data"] for m in first + second] == ["high", "low"]


async def test_window_buffer_waits_for_a_partition_to_be_quiet(queen_client):
    q = uniq("qo-window")
    await queen_client.queue(q).config({"window_buffer": 2}).create()
    await queen_client.queue(q).push([{"data": "a"}])
    await asyncio.sleep(1.2)
    await queen_client.queue(q).push([{"data": "b"}])  # the window starts again from the newest message
    await asyncio.sleep(1.2)
    assert await _pop(queen_client, q) == []  # "a" is 2.4 s old, but "b" only 1.2 s
    t0 = time.monotonic()
    got = await queen_client.queue(q).batch(10).wait(True).timeout_millis(10_000).pop()
    assert [m["data"] for m in got] == ["a", "b"]  # the whole window at once
    assert time.monotonic() - t0 < 2.5


async def test_max_wait_time_dead_letters_a_message_that_waited_too_long(queen_client):
    q = uniq("qo-wait")
    await queen_client.queue(q).config({"max_wait_time_seconds": 1}).create()
    await queen_client.queue(q).push([{"data": "stale"}])
    await asyncio.sleep(1.5)
    await queen_client.queue(q).push([{"data": "fresh"}])
    assert [m["data"] for m in await _pop(queen_client, q)] == ["fresh"]
    [row] = (await queen_client.queue(q).dlq().limit(10).get())["messages"]
    assert row["data"] == "stale" and "max_wait_exceeded" in row["errorMessage"]


async def test_delay_at_least_the_max_wait_is_refused(queen_client):
    q = uniq("qo-conflict")
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await queen_client.queue(q).config({"delayed_processing": 5, "max_wait_time_seconds": 5}).create()
    body = exc.value.response.json()
    assert exc.value.response.status_code == 400 and body["reason"] == "conflicting_options"
    assert body["option"] == "maxWaitTimeSeconds"


async def test_retry_delay_counts_from_an_expired_lease_too(queen_client):
    q = uniq("qo-retry-lease")
    await queen_client.queue(q).config({"lease_time": 1, "retry_delay": 1500}).create()
    await queen_client.queue(q).push([{"data": "dropped"}])
    [m] = await _pop(queen_client, q)
    await asyncio.sleep(1.2)  # the lease ran out unacked: a failed delivery, noticed by this pop
    assert await _pop(queen_client, q) == []
    t0 = time.monotonic()
    got = await queen_client.queue(q).batch(1).wait(True).timeout_millis(10_000).pop()
    assert [(x["data"], x["deliveryAttempt"]) for x in got] == [("dropped", 2)]
    assert 1.2 <= time.monotonic() - t0 < 3.5


async def test_max_size_holds_under_concurrent_pushes(queen_client, ahttp):
    """Twelve one-item pushes at once into maxSize=5: exactly five are written (pushes to a capped queue
    take its lock in turn, and a coalesced call that fails is retried request by request)."""
    q = uniq("qo-maxc")
    await queen_client.queue(q).config({"max_size": 5}).create()
    answers = await asyncio.gather(*[
        ahttp.post("/api/v1/push", json={"items": [{"queue": q, "payload": i}]}) for i in range(12)])
    statuses = sorted(r.json()[0]["status"] for r in answers)
    assert all(r.status_code == 201 for r in answers)
    assert statuses == ["failed"] * 7 + ["queued"] * 5
    assert {r.json()[0].get("reason") for r in answers if r.json()[0]["status"] == "failed"} == {"queue_full"}
    assert len(await _pop(queen_client, q, batch=20)) == 5


async def test_max_size_refuses_a_dlq_replay_and_keeps_the_dead_letter(queen_client):
    q = uniq("qo-maxdlq")
    await queen_client.queue(q).config({"max_size": 1, "retry_limit": 0}).create()
    await queen_client.queue(q).push([{"data": "dead"}])
    [m] = await _pop(queen_client, q)
    await queen_client.ack(m, False, {"error": "boom"})  # dead-lettered: the queue is empty again
    await queen_client.queue(q).push([{"data": "live"}])  # and now full
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await queen_client.admin.retry_message(m["partitionId"], m["transactionId"])
    assert exc.value.response.status_code == 409 and exc.value.response.json()["reason"] == "queue_full"
    assert (await queen_client.queue(q).dlq().limit(10).get())["total"] == 1
