"""The official ``queen-mq`` 2.6.0 client's wider surface against our broker (issue 16): each call asserts
its documented effect, not just that it did not raise."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from conftest import uniq
from helpers import db_fetch


async def test_delete_of_missing_queue_does_not_raise(queen_client):
    q = uniq("cs-del")
    assert (await queen_client.queue(q).delete())["deleted"] is False
    await queen_client.queue(q).create()
    await queen_client.queue(q).push([{"data": 1}])
    assert (await queen_client.queue(q).delete())["deleted"] is True
    assert (await queen_client.queue(q).delete())["deleted"] is False


async def test_renew_of_expired_lease_reports_failure(queen_client):
    q = uniq("cs-lease")
    await queen_client.queue(q).config({"lease_time": 1}).create()
    await queen_client.queue(q).push([{"data": "a"}])
    msgs = await queen_client.queue(q).batch(1).wait(False).pop()
    assert (await queen_client.renew(msgs[0]))["success"] is True
    await asyncio.sleep(0.1)
    # the renewal moved the end to now + QUEEN_LEASE_EXTEND_S; a fresh 1 s lease shows the expiry
    q2 = uniq("cs-lease")
    await queen_client.queue(q2).config({"lease_time": 1}).create()
    await queen_client.queue(q2).push([{"data": "b"}])
    msgs2 = await queen_client.queue(q2).batch(1).wait(False).pop()
    await asyncio.sleep(1.5)
    renewed = await queen_client.renew(msgs2[0])
    assert renewed["success"] is False


# ------------------------------------------------------------------------------ DLQ replay (item 4)

async def _dead_letter(queen_client, q: str, payload) -> dict:
    await queen_client.queue(q).config({"retry_limit": 0}).create()
    await queen_client.queue(q).push([{"data": payload}])
    [m] = await queen_client.queue(q).batch(1).wait(False).pop()
    assert (await queen_client.ack(m, False, {"error": "boom"}))["success"] is True
    [row] = (await queen_client.queue(q).dlq().limit(10).get())["messages"]
    assert row["transactionId"] == m["transactionId"]
    return m


async def test_retry_message_replays_the_dead_letter(queen_client):
    q = uniq("cs-retry")
    m = await _dead_letter(queen_client, q, {"order": 7})
    out = await queen_client.admin.retry_message(m["partitionId"], m["transactionId"])
    assert out["replayed"] is True and out["originalTransactionId"] == m["transactionId"]
    assert (await queen_client.queue(q).dlq().limit(10).get())["total"] == 0
    [again] = await queen_client.queue(q).batch(5).wait(False).pop()
    assert again["data"] == {"order": 7} and again["transactionId"] == out["transactionId"]
    # the row is gone: a second retry is 404 dlq_not_found
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await queen_client.admin.retry_message(m["partitionId"], m["transactionId"])
    assert exc.value.response.status_code == 404 and exc.value.response.json()["error"] == "dlq_not_found"


async def test_retry_message_refuses_a_synthetic_timer_row(queen_client, broker):
    q = uniq("cs-retry-syn")
    m = await _dead_letter(queen_client, q, "tick")
    # what a timer that exhausted its fire attempts leaves: a row under the synthetic group
    db_fetch(broker.dsn, "UPDATE queen_dlq SET synthetic = true, consumer_group = '__timers__' WHERE txn = $1",
             m["transactionId"])
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await queen_client.admin.retry_message(m["partitionId"], m["transactionId"])
    body = exc.value.response.json()
    assert exc.value.response.status_code == 409
    assert body["error"] == "dlq_replay_refused" and body["reason"] == "synthetic_consumer_group"
    assert (await queen_client.queue(q).dlq().limit(10).get())["total"] == 1
    assert await queen_client.queue(q).batch(5).wait(False).pop() == []
