"""The official ``queen-mq`` 2.6.0 client, unchanged and with default options, against our broker:
configure, push, consume with ack, pop/ack/renew, transaction, DLQ read, delete."""

from __future__ import annotations

import asyncio

from conftest import uniq
from queen import Queen


async def test_client_configure_push_consume_and_delete(broker):
    q = uniq("cl")
    async with Queen(broker.url) as queen:
        created = await queen.queue(q).config({"lease_time": 30, "retry_limit": 2}).create()
        assert created["configured"] is True
        await queen.queue(q).push([{"data": {"i": i}} for i in range(6)])
        seen: list[int] = []

        async def handler(msg):
            for m in msg if isinstance(msg, list) else [msg]:
                seen.append(m["data"]["i"])

        await asyncio.wait_for(queen.queue(q).limit(6).idle_millis(3000).consume(handler), 20)
        assert seen == list(range(6))
        # consume acked everything: nothing is left, nothing comes back
        assert await queen.queue(q).wait(False).batch(10).pop() == []
        deleted = await queen.queue(q).delete()
        assert deleted["deleted"] is True


async def test_client_pop_ack_renew_groups(broker):
    q = uniq("cl-pop")
    async with Queen(broker.url) as queen:
        await queen.queue(q).create()
        pushed = await queen.queue(q).partition("p1").push([{"data": "a"}, {"data": "b"}])
        assert [r["status"] for r in pushed] == ["queued", "queued"]
        msgs = await queen.queue(q).partition("p1").group("g").batch(2).wait(False).pop()
        assert [m["data"] for m in msgs] == ["a", "b"]
        renewed = await queen.renew(msgs[0])
        assert renewed["success"] is True
        res = await queen.ack(msgs, True, {"group": "g"})
        assert res["success"] is True
        assert await queen.queue(q).partition("p1").group("g").wait(False).pop() == []
        # another group still sees both
        other = await queen.queue(q).partition("p1").group("h").batch(5).wait(False).pop()
        assert [m["data"] for m in other] == ["a", "b"]


async def test_client_transaction_and_dlq(broker):
    src, dst = uniq("cl-src"), uniq("cl-dst")
    async with Queen(broker.url) as queen:
        await queen.queue(src).config({"retry_limit": 0}).create()
        await queen.queue(src).push([{"data": {"order": 1}}, {"data": {"order": 2}}])
        first = (await queen.queue(src).batch(1).wait(False).pop())[0]
        result = await (queen.transaction().ack(first).queue(dst).push([{"data": {"shipped": 1}}]).commit())
        assert result["success"] is True
        got = await queen.queue(dst).batch(5).wait(False).pop()
        assert [m["data"] for m in got] == [{"shipped": 1}]
        second = (await queen.queue(src).batch(1).wait(False).pop())[0]
        assert second["data"] == {"order": 2}
        nack = await queen.ack(second, False, {"error": "cannot ship"})
        assert nack["success"] is True
        dlq = await queen.queue(src).dlq().limit(10).get()
        assert dlq["total"] == 1 and dlq["messages"][0]["data"] == {"order": 2}
        assert dlq["messages"][0]["errorMessage"] == "cannot ship"
        # a transaction whose ack is refused raises in the client and changes nothing
        stale = dict(first, leaseId="00000000-0000-4000-8000-000000000000")
        try:
            await queen.transaction().ack(stale).queue(dst).push([{"data": "never"}]).commit()
            raised = False
        except Exception:
            raised = True
        assert raised
        assert await queen.queue(dst).batch(5).wait(False).pop() == []
