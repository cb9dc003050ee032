"""The official client's streams SDK (``queen.Stream``) running real queries against our broker: each test
asserts what lands in the sink queue and what the query's state holds, and that the runner met no error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from conftest import uniq
from queen import Stream, token_bucket_gate

BASE_MS = 1_700_000_000_000  # a whole second: windows of one second start at BASE_MS + k * 1000


async def _eventually(probe: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await probe()
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


async def _drain(queen_client, queue: str, partition: str) -> list[Any]:
    msgs = await queen_client.queue(queue).partition(partition).batch(100).wait(False).pop()
    if msgs:
        await queen_client.ack(msgs, True)
    return [m["data"] for m in msgs or []]


async def _state(ahttp: httpx.AsyncClient, query_id: str, partition_id: str) -> dict[str, Any]:
    r = await ahttp.post("/streams/v1/state/get", json={"query_id": query_id, "partition_id": partition_id, "keys": []})
    assert r.status_code == 200, r.text
    return {row["key"]: row["value"] for row in r.json()["rows"]}


def _event(ts_offset_ms: int, amount: int) -> dict:
    return {"data": {"ts": BASE_MS + ts_offset_ms, "amount": amount}}


async def test_event_time_tumbling_sum_per_partition_reaches_the_sink(queen_client, broker, ahttp):
    src, sink, name = uniq("st-src"), uniq("st-sink"), uniq("st-sum")
    errors: list[Exception] = []
    stream = (
        Stream.from_(queen_client.queue(src))
        .window_tumbling(seconds=1, event_time=lambda m: m["data"]["ts"], idle_flush_ms=0)
        .reduce(lambda acc, v: acc + v["amount"], 0)
        .to(queen_client.queue(sink))
    )
    # window [0, 1000) of partition a starts in one cycle and is closed by a later one (state in between)
    pushed = await queen_client.queue(src).partition("a").push([_event(100, 1), _event(200, 2)])
    pid_a = pushed[0]["partition_id"]
    runner = await stream.run(query_id=name, url=broker.url, max_wait_millis=200,
                              on_error=lambda err, ctx: errors.append(err))
    try:
        qid = runner.metrics()["serverQueryId"]
        opened = await _eventually(lambda: _state(ahttp, qid, pid_a))
        assert [v["acc"] for k, v in opened.items() if k != "__wm__"] == [3], opened
        await queen_client.queue(src).partition("a").push([_event(1100, 3), _event(1500, 4), _event(5000, 100)])
        await queen_client.queue(src).partition("b").push([_event(300, 10), _event(900, 20), _event(3000, 1)])
        got_a: list[Any] = []
        got_b: list[Any] = []

        async def both() -> bool:
            got_a.extend(await _drain(queen_client, sink, "a"))
            got_b.extend(await _drain(queen_client, sink, "b"))
            return len(got_a) >= 2 and len(got_b) >= 1

        assert await _eventually(both), (got_a, got_b, errors)
        await asyncio.sleep(0.5)
        got_a.extend(await _drain(queen_client, sink, "a"))
        got_b.extend(await _drain(queen_client, sink, "b"))
        assert got_a == [{"value": 3}, {"value": 7}]
        assert got_b == [{"value": 30}]
        # closed windows left the state; the open ones (and the watermark) are still there
        left = await _state(ahttp, qid, pid_a)
        assert sorted(v["acc"] for k, v in left.items() if k != "__wm__") == [100]
        assert left["__wm__"] == {"eventTimeMs": BASE_MS + 5000}
        # every source message is done for the query's consumer group
        rest = await queen_client.queue(src).batch(100).wait(False).group(f"streams.{name}").pop()
        assert not rest
        assert errors == []
    finally:
        await runner.stop()


async def test_processing_time_window_is_emitted_by_the_idle_flush(queen_client, broker):
    """No later message closes the window: the runner's idle flush finds it with ``ripe_at_or_before``
    and commits a cycle without an ack (state delete + sink push)."""
    src, sink, name = uniq("st-src"), uniq("st-sink"), uniq("st-flush")
    errors: list[Exception] = []
    stream = (
        Stream.from_(queen_client.queue(src))
        .window_tumbling(seconds=1, idle_flush_ms=200)
        .reduce(lambda acc, v: acc + v["n"], 0)
        .to(queen_client.queue(sink))
    )
    runner = await stream.run(query_id=name, url=broker.url, max_wait_millis=200,
                              on_error=lambda err, ctx: errors.append(err))
    try:
        await queen_client.queue(src).partition("p").push([{"data": {"n": n}} for n in (1, 2, 3, 4)])
        total: list[Any] = []

        async def summed() -> bool:
            total.extend(await _drain(queen_client, sink, "p"))
            return sum(v["value"] for v in total) >= 10

        assert await _eventually(summed), (total, errors)
        # the four pushes can straddle a second boundary: one or two windows, never a value twice
        assert sum(v["value"] for v in total) == 10 and 1 <= len(total) <= 2, total
        assert runner.metrics()["flushCyclesTotal"] >= 1
        assert errors == []
    finally:
        await runner.stop()


async def test_token_bucket_gate_defers_without_losing_or_dead_lettering(queen_client, broker, ahttp):
    """The gate acks what it allows and keeps the lease over the denied tail (``release_lease: false``);
    the tail comes back when the lease ends, in order, with no failure counted."""
    src, sink, name = uniq("st-src"), uniq("st-sink"), uniq("st-gate")
    errors: list[Exception] = []
    await queen_client.queue(src).config({"lease_time": 1, "retry_limit": 0}).create()
    stream = Stream.from_(queen_client.queue(src)).gate(token_bucket_gate(capacity=2, refill_per_sec=2)).to(
        queen_client.queue(sink))
    await queen_client.queue(src).partition("p").push([{"data": {"n": n}} for n in range(6)])
    runner = await stream.run(query_id=name, url=broker.url, max_wait_millis=200,
                              on_error=lambda err, ctx: errors.append(err))
    try:
        got: list[Any] = []

        async def all_six() -> bool:
            got.extend(await _drain(queen_client, sink, "p"))
            return len(got) >= 6

        assert await _eventually(all_six, timeout=30), (got, errors)
        assert got == [{"n": n} for n in range(6)]
        assert runner.metrics().get("gateDenialsTotal", 0) >= 1  # it did defer
        dlq = await ahttp.get("/api/v1/dlq", params={"queue": src})
        assert dlq.json()["total"] == 0
        assert errors == []
    finally:
        await runner.stop()


async def test_another_chain_under_the_same_query_id_needs_reset(queen_client, broker):
    from queen.streams.runtime.register import StreamsConfigHashMismatch

    src, sink, name = uniq("st-src"), uniq("st-sink"), uniq("st-hash")
    one = Stream.from_(queen_client.queue(src)).map(lambda v: v).to(queen_client.queue(sink))
    other = Stream.from_(queen_client.queue(src)).filter(lambda v: True).to(queen_client.queue(sink))
    first = await one.run(query_id=name, url=broker.url, max_wait_millis=100)
    await first.stop()
    with pytest.raises(StreamsConfigHashMismatch, match="config_hash_mismatch"):
        await other.run(query_id=name, url=broker.url, max_wait_millis=100)
    again = await other.run(query_id=name, url=broker.url, max_wait_millis=100, reset=True)
    try:
        assert again.metrics()["serverQueryId"] == first.metrics()["serverQueryId"]
        await queen_client.queue(src).partition("p").push([{"data": {"k": 1}}])

        async def arrived() -> list[Any]:
            return await _drain(queen_client, sink, "p")

        assert await _eventually(arrived) == [{"k": 1}]
    finally:
        await again.stop()
