"""The official ``queen-mq`` 2.6.0 client's wider surface against our broker (issue 16): each call asserts
its documented effect, not just that it did not raise."""

from __future__ import annotations

import asyncio

from conftest import uniq


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
