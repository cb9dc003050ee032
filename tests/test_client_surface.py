"""The official ``queen-mq`` 2.6.0 client's wider surface against our broker: each call asserts
its documented effect, not just that it did not raise."""

from __future__ import annotations

import asyncio
import uuid

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


# ------------------------------------------------------------------------------ consumer groups (item 2)

def _group_in(listing: dict, name: str) -> dict | None:
    return next((g for g in listing["consumerGroups"] if g["name"] == name), None)


async def _pop_group(queen_client, q: str, g: str, partition: str | None = None) -> list:
    qb = queen_client.queue(q)
    if partition:
        qb = qb.partition(partition)
    return [m["data"] for m in await qb.group(g).batch(50).wait(False).pop()]


async def test_group_list_get_lag_and_lagging(queen_client):
    q, g = uniq("cs-g"), uniq("grp")
    await queen_client.queue(q).create()
    await queen_client.queue(q).push([{"data": i} for i in range(3)])
    msgs = await queen_client.queue(q).group(g).batch(1).wait(False).pop()
    await queen_client.ack(msgs, True, {"group": g})
    listed = _group_in(await queen_client.admin.list_consumer_groups(), g)
    assert listed is not None and listed["pending"] == 2
    [row] = listed["queues"]
    assert row["queue"] == q and row["pending"] == 2 and row["oldestPendingAt"]
    one = await queen_client.admin.get_consumer_group(g)
    assert one["name"] == g and one["pending"] == 2
    await asyncio.sleep(1.1)
    lag = await queen_client.admin.get_lagging_consumers(min_lag_seconds=1)
    assert any(r["consumerGroup"] == g and r["queue"] == q and r["lagSeconds"] >= 1 for r in lag["lagging"])
    lag = await queen_client.admin.get_lagging_consumers(min_lag_seconds=3600)
    assert not any(r["consumerGroup"] == g for r in lag["lagging"])
    assert (await queen_client.admin.refresh_consumer_stats())["refreshed"] is True
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await queen_client.admin.get_consumer_group(uniq("nobody"))
    assert exc.value.response.status_code == 404


async def test_group_seek_to_end_and_to_timestamp(queen_client):
    q, g = uniq("cs-seek"), uniq("grp")
    await queen_client.queue(q).create()
    await queen_client.queue(q).push([{"data": "old"}])
    await asyncio.sleep(0.3)
    from datetime import UTC, datetime
    middle = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    await asyncio.sleep(0.3)
    await queen_client.queue(q).push([{"data": "new"}])
    out = await queen_client.admin.seek_consumer_group(g, q, {"toEnd": True})
    assert out["success"] is True and out["partitions"][0]["pending"] == 0
    assert await _pop_group(queen_client, q, g) == []
    await queen_client.queue(q).push([{"data": "after"}])
    assert await _pop_group(queen_client, q, g) == ["after"]
    await queen_client.admin.seek_consumer_group(g, q, {"timestamp": middle})
    assert await _pop_group(queen_client, q, g) == ["new", "after"]
    await queen_client.admin.seek_consumer_group(g, q, {"timestamp": "2000-01-01T00:00:00Z"})
    assert await _pop_group(queen_client, q, g) == ["old", "new", "after"]


async def test_group_delete_for_queue_and_everywhere(queen_client):
    q1, q2, g = uniq("cs-gd"), uniq("cs-gd"), uniq("grp")
    for q in (q1, q2):
        await queen_client.queue(q).create()
        await queen_client.queue(q).push([{"data": q}])
        msgs = await queen_client.queue(q).group(g).batch(5).wait(False).pop()
        await queen_client.ack(msgs, True, {"group": g})
        assert await _pop_group(queen_client, q, g) == []
    out = await queen_client.admin.delete_consumer_group_for_queue(g, q1)
    assert out["deleted"] is True and out["queues"] == [q1]
    # the group forgot its position on q1 only: it reads q1 from the start again, q2 stays done
    assert await _pop_group(queen_client, q1, g) == [q1]
    assert await _pop_group(queen_client, q2, g) == []
    out = await queen_client.delete_consumer_group(g)
    assert out["deleted"] is True and sorted(out["queues"]) == sorted([q1, q2])
    assert _group_in(await queen_client.admin.list_consumer_groups(), g) is None


async def test_group_subscription_timestamp_governs_unread_partitions(queen_client):
    q, g = uniq("cs-sub"), uniq("grp")
    await queen_client.queue(q).create()
    await queen_client.queue(q).partition("p1").push([{"data": "p1"}])
    assert await _pop_group(queen_client, q, g, "p1") == ["p1"]
    await queen_client.queue(q).partition("p2").push([{"data": "before"}])
    await asyncio.sleep(0.3)
    from datetime import UTC, datetime
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    await asyncio.sleep(0.3)
    out = await queen_client.update_consumer_group_timestamp(g, now)
    assert out["success"] is True and out["queues"] == [q]
    await queen_client.queue(q).partition("p2").push([{"data": "after"}])
    assert await _pop_group(queen_client, q, g, "p2") == ["after"]


# ------------------------------------------------------------------------------ queue options (the rest: test_client_queue_options.py)

async def test_dead_letter_queue_false_turns_the_dlq_off(queen_client):
    q = uniq("cs-nodlq")
    await queen_client.queue(q).config({"retry_limit": 0, "dead_letter_queue": False}).create()
    await queen_client.queue(q).push([{"data": 1}])
    [m] = await queen_client.queue(q).batch(1).wait(False).pop()
    assert (await queen_client.ack(m, False, {"error": "x"}))["success"] is True
    assert (await queen_client.queue(q).dlq().limit(10).get())["total"] == 0
    assert await queen_client.queue(q).batch(1).wait(False).pop() == []


# ------------------------------------------------------------------------------ monitoring (item 3)

async def test_overview_namespaces_tasks_partitions_and_depth(queen_client):
    ns, task = uniq("ns"), uniq("task")
    q = uniq("cs-mon")
    await queen_client.queue(q).namespace(ns).task(task).create()
    await queen_client.queue(q).partition("a").push([{"data": i} for i in range(3)])
    await queen_client.queue(q).partition("b").push([{"data": 9}])
    before = await queen_client.admin.get_overview()
    assert before["queues"] >= 1 and before["messages"] >= 4 and before["time"]
    [nsrow] = [n for n in (await queen_client.admin.get_namespaces())["namespaces"] if n["namespace"] == ns]
    assert nsrow["queues"] == 1 and nsrow["messages"] == 4 and nsrow["queueNames"] == [q]
    [trow] = [t for t in (await queen_client.admin.get_tasks())["tasks"] if t["task"] == task]
    assert trow["partitions"] == 2
    parts = (await queen_client.admin.get_partitions(queue=q))["partitions"]
    assert [(p["name"], p["messages"], p["lastOffset"]) for p in parts] == [("a", 3, 3), ("b", 1, 1)]
    depth = await queen_client.admin.get_queue_depth(q)
    assert depth["pending"] == 4 and depth["partitionsPending"] == 2 and depth["effectivePending"] == 4
    assert depth["conflation"] is False
    msgs = await queen_client.queue(q).partition("a").group("g").batch(2).wait(False).pop()
    await queen_client.ack(msgs, True, {"group": "g"})
    gd = await queen_client.admin.get_queue_depth(q, group="g")
    assert gd["group"] == "g" and {p["partition"]: p["pending"] for p in gd["partitions"]} == {"a": 1, "b": 1}
    # no group named: behind the worst cursor of any group (g's on a); b has no cursor, so all of it counts
    assert (await queen_client.admin.get_queue_depth(q))["pending"] == 2
    await queen_client.queue(q).partition("a").group("h").batch(1).wait(False).pop()  # h: a cursor at 0 on a
    assert {p["partition"]: p["pending"] for p in (await queen_client.admin.get_queue_depth(q))["partitions"]} == {
        "a": 3, "b": 1}


async def test_status_queue_stats_detail_and_analytics(queen_client):
    q = uniq("cs-stat")
    await queen_client.queue(q).config({"retry_limit": 0}).create()
    await queen_client.queue(q).push([{"data": 1}, {"data": 2}])
    [m] = await queen_client.queue(q).batch(1).wait(False).pop()
    await queen_client.ack(m, False, {"error": "no"})
    st = await queen_client.admin.get_status()
    assert st["status"] == "ok" and st["deadLetters"] >= 1
    stats = await queen_client.admin.get_queue_stats(limit=10_000)
    [row] = [r for r in stats["queues"] if r["name"] == q]
    assert row["messages"] == 2 and row["deadLetters"] == 1 and row["pending"] == 1
    detail = await queen_client.admin.get_queue_detail(q)
    assert detail["name"] == q and detail["options"]["retryLimit"] == 0 and detail["deadLetters"] == 1
    an = await queen_client.admin.get_analytics()
    assert an["source"] == "meter" and an["periods"] and an["periods"][0]["messages"] >= 2
    sysm = await queen_client.admin.get_system_metrics()
    assert sysm["database"]["connections"] >= 1 and sysm["worker"]["pid"] > 0
    wm = await queen_client.admin.get_worker_metrics()
    assert len(wm["workers"]) == 1


async def test_list_messages_with_state_and_delete(queen_client):
    q = uniq("cs-list")
    await queen_client.queue(q).create()
    await queen_client.queue(q).push([{"data": {"i": i}} for i in range(3)])
    [first] = await queen_client.queue(q).batch(1).wait(False).pop()
    await queen_client.ack(first, True)
    listed = await queen_client.admin.list_messages(queue=q)
    assert [m["data"]["i"] for m in listed["messages"]] == [2, 1, 0]
    assert [m["status"] for m in listed["messages"]] == ["pending", "pending", "completed"]
    pend = await queen_client.admin.list_messages(queue=q, status="pending", limit=1)
    assert [m["data"]["i"] for m in pend["messages"]] == [2]
    one = listed["messages"][1]
    got = await queen_client.admin.get_message(one["partitionId"], one["transactionId"])
    assert got["data"] == {"i": 1} and got["deleted"] is False
    # the official client's delete, end to end: a tombstone at its offset that no consumer receives
    gone = await queen_client.admin.delete_message(one["partitionId"], one["transactionId"])
    assert gone["deleted"] is True and gone["alreadyDeleted"] is False and gone["offset"] == one["offset"]
    tomb = await queen_client.admin.get_message(one["partitionId"], one["transactionId"])
    assert tomb["deleted"] is True and tomb["data"] is None and tomb["offset"] == one["offset"]
    again = await queen_client.admin.delete_message(one["partitionId"], one["transactionId"])
    assert again["alreadyDeleted"] is True and again["deletedAt"] == gone["deletedAt"]
    listed = await queen_client.admin.list_messages(queue=q)
    assert [m["status"] for m in listed["messages"]] == ["pending", "deleted", "completed"]
    rest = await queen_client.queue(q).batch(10).wait(False).pop()
    assert [m["data"]["i"] for m in rest] == [2]
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await queen_client.admin.delete_message(one["partitionId"], "no-such-txn")
    assert exc.value.response.status_code == 404 and exc.value.response.json()["error"] == "message_not_found"


# ------------------------------------------------------------------------------ traces (item 5)

async def test_message_trace_is_recorded_and_read_back(queen_client):
    q, name = uniq("cs-trace"), uniq("order-flow")
    await queen_client.queue(q).create()
    await queen_client.queue(q).push([{"data": {"order": 1}}])
    results: list = []

    async def handler(msg):
        m = msg[0] if isinstance(msg, list) else msg
        results.append(await m["trace"]({"traceName": name, "data": {"step": "charged"}}))
        results.append(await m["trace"]({"eventType": "error", "data": {"step": "retry"}}))
        results.append(m)

    await asyncio.wait_for(queen_client.queue(q).batch(1).limit(1).idle_millis(2000).consume(handler), 20)
    ok1, ok2, m = results
    assert ok1["success"] is True and ok1["recorded"] is True and ok2["success"] is True
    got = await queen_client.admin.get_traces_for_message(m["partitionId"], m["transactionId"])
    assert [(t["eventType"], t["data"]) for t in got["traces"]] == [("info", {"step": "charged"}),
                                                                     ("error", {"step": "retry"})]
    assert got["traces"][0]["consumerGroup"] == "__QUEUE_MODE__" and got["traces"][0]["traceNames"] == [name]
    by = await queen_client.admin.get_traces_by_name(name)
    assert [t["data"] for t in by["traces"]] == [{"step": "charged"}]
    names = await queen_client.admin.get_trace_names(search=name)
    assert names["names"] == [{"name": name, "traces": 1, "lastSeenAt": by["traces"][0]["createdAt"]}]


async def test_trace_of_unknown_message_reports_failure(queen_client, ahttp):
    r = await ahttp.post("/api/v1/traces", json={"transactionId": "nope", "partitionId": str(uuid.uuid4()),
                                                 "consumerGroup": None, "traceNames": None, "data": {}})
    assert r.status_code == 404 and r.json()["error"] == "message_not_found"


# ------------------------------------------------------------------------------ reads by offset (item 6)

async def test_fetch_reads_a_partition_by_offset(queen_client):
    q = uniq("cs-fetch")
    await queen_client.queue(q).partition("p").push([{"data": {"i": i}} for i in range(5)])
    got = await queen_client.queue(q).fetch("p")
    p = got["p"]
    assert [r["payload"] for r in p["records"]] == [{"i": i} for i in range(5)]
    assert [r["offset"] for r in p["records"]] == [0, 1, 2, 3, 4]
    assert p["highWatermark"] == 5 and p["logStartOffset"] == 0 and p["nextOffset"] == 5
    tail = (await queen_client.queue(q).fetch("p", offsets={"p": 3}))["p"]
    assert [r["payload"]["i"] for r in tail["records"]] == [3, 4]
    # a fetch takes nothing from consumers: the queue still delivers all five
    assert len(await queen_client.queue(q).partition("p").batch(10).wait(False).pop()) == 5
    none = (await queen_client.queue(uniq("cs-none")).fetch("p"))["p"]
    assert none["records"] == []


async def test_changed_since_lists_written_partitions_with_a_safe_time(queen_client):
    q = uniq("cs-changed")
    await queen_client.queue(q).partition("a").push([{"data": 1}])
    await queen_client.queue(q).partition("b").push([{"data": 2}, {"data": 3}])
    first = await queen_client.queue(q).changed_since()
    assert [(p["name"], p["lastOffset"]) for p in first["partitions"]] == [("a", 0), ("b", 1)]
    assert first["safeTime"]
    await asyncio.sleep(0.05)
    await queen_client.queue(q).partition("b").push([{"data": 4}])
    later = await queen_client.queue(q).changed_since(first["safeTime"])
    assert [(p["name"], p["lastOffset"]) for p in later["partitions"]] == [("b", 2)]
    assert later["safeTime"] >= first["safeTime"]
    assert (await queen_client.queue(uniq("cs-none")).changed_since())["partitions"] == []
