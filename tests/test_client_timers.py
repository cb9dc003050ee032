"""The official ``queen-mq`` 2.6.0 client's timer API end to end against the shared broker:
``client.timers`` (schedule, reschedule, cancel over DELETE, peek, list, list_all, batch), the fluent
``client.timer(q)`` builder, the transaction rider ``tx.timer(q)`` and the error type."""

from __future__ import annotations

from datetime import timedelta

import pytest
from conftest import uniq
from helpers import await_delivered
from queen.errors import TimerError


async def test_schedule_reschedule_peek_cancel(queen_client):
    q = uniq("cli")
    res = await queen_client.timers.schedule(q, "order:1:expire", {"orderId": 1}, delay=timedelta(minutes=30), txn="v1")
    assert res and res["status"] == "scheduled" and res["txn"] == "v1" and res["messageId"]
    again = await queen_client.timers.reschedule(q, "order:1:expire", {"orderId": 1, "v": 2}, delay_ms=3_600_000, txn="v2")
    assert again["status"] == "rescheduled" and again["messageId"] != res["messageId"]
    peek = await queen_client.timers.peek(q, "order:1:expire")
    assert peek and peek["found"] and peek["txn"] == "v2" and peek["attempts"] == 0
    gone = await queen_client.timers.cancel(q, "order:1:expire", txn="v2")
    assert gone and gone["status"] == "cancelled"
    absent = await queen_client.timers.cancel(q, "order:1:expire", txn="v2")
    assert not absent and absent["status"] == "absent" and absent["txn"] == "v2"
    miss = await queen_client.timers.peek(q, "order:1:expire")
    assert not miss and miss["found"] is False


async def test_fluent_builder_and_delivery(queen_client):
    q = uniq("cli")
    res = await queen_client.timer(q).key("tenant/42").payload({"hello": "world"}).after_ms(0).txn("fluent-1").schedule()
    assert res["ok"] and res["timerKey"] == "tenant/42"
    await await_delivered(queen_client, q, "fluent-1")
    msgs = await queen_client.queue(q).batch(1).wait(True).pop()
    assert [m["data"] for m in msgs] == [{"hello": "world"}]
    assert msgs[0]["id"] == res["messageId"]
    cancelled = await queen_client.timer(q).key("tenant/42").cancel()
    assert cancelled["status"] == "absent"  # delivered: no longer pending


async def test_list_and_list_all(queen_client):
    q = uniq("cli")
    results = await queen_client.timers.batch(
        [queen_client.timers.op.schedule(q, f"k{i:03}", {"i": i}, delay_ms=600_000) for i in range(25)]
    )
    assert [r["status"] for r in results] == ["scheduled"] * 25
    page = await queen_client.timers.list(q, limit=10)
    assert len(page["rows"]) == 10 and page["truncated"] and page["nextAfter"] == "k009"
    rows = await queen_client.timers.list_all(q, limit=7)
    assert [r["timerKey"] for r in rows] == [f"k{i:03}" for i in range(25)]


async def test_transaction_rider(queen_client):
    q = uniq("cli")
    await queen_client.timers.schedule(q, "compensate", {"undo": True}, delay_ms=600_000, txn="comp")
    tx = queen_client.transaction()
    tx.queue(q).push([{"data": {"shipped": True}}])
    tx.timer(q).key("compensate").cancel()
    tx.timer(q).key("followup").payload({"next": 1}).after_ms(600_000).schedule()
    out = await tx.commit()
    assert out["success"] is True
    timers = [r for r in out["results"] if r.get("type") == "timer"]
    assert [r["status"] for r in timers] == ["cancelled", "scheduled"]
    assert [r["index"] for r in timers] == [1, 2]
    assert not (await queen_client.timers.peek(q, "compensate"))
    assert await queen_client.timers.peek(q, "followup")


async def test_errors_surface_as_timer_error_with_codes(queen_client):
    q = uniq("cli")
    with pytest.raises(TimerError) as exc:
        await queen_client.timers.schedule(q, "far", {}, delay=timedelta(days=91))
    assert exc.value.code == "timer_horizon_exceeded" and exc.value.reason == "timers_horizon"
    with pytest.raises(TimerError) as exc:
        await queen_client.timers.batch([queen_client.timers.op.schedule(q, "dup", 1, delay_ms=1),
                                   queen_client.timers.op.schedule(q, "dup", 2, delay_ms=1)])
    assert exc.value.code == "timers_bad_request" and exc.value.reason == "timers_duplicate_key"
