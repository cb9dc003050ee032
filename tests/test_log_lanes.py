"""Push lanes (broker/log/lanes.py): a tenant's small pushes are written by the worker that owns the tenant.

Against real brokers of two workers with ``QUEEN_PUSH_LANES=1``: pushes taken by either worker are all
written by the owner (the lane counters say which way each went) and all delivered; by default (lanes
off) each worker writes what it takes; an owner killed with SIGKILL costs no push taken after its death (the other worker writes them
itself until the replacement has booted, then hands them over again) and no push answered 2xx is lost.
In process: the frames' outcomes (rows, a refusal, the owner's error in its envelope, a lost answer)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest
from helpers import Api
from test_metrics import sample

from broker import errors
from broker.auth import Principal
from broker.log import lanes
from broker.log.parse import PushItem

LANES_ON = {"QUEEN_PUSH_LANES": "1"}
TENANT = "default"  # the brokers below run without auth: every request is the default tenant's
OWNER = lanes.owner_of(TENANT, 2)


def lane(b, result: str) -> float:
    return sample(b, "queen_push_lane_jobs_total", {"result": result})


async def clients_per_worker(url: str, each: int = 3) -> dict[int, list[httpx.AsyncClient]]:
    """One-connection clients until each of the two workers holds ``each`` of them (keyed by worker index)."""
    out: dict[int, list[httpx.AsyncClient]] = {0: [], 1: []}
    spare: list[httpx.AsyncClient] = []
    deadline = time.monotonic() + 20
    while min(len(v) for v in out.values()) < each:
        assert time.monotonic() < deadline, {k: len(v) for k, v in out.items()}
        c = httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1))
        w = (await c.get("/health")).json()["worker_id"]
        (out[w] if len(out[w]) < each else spare).append(c)
    for c in spare:
        await c.aclose()
    return out


async def close_all(by_worker: dict[int, list[httpx.AsyncClient]]) -> None:
    for cs in by_worker.values():
        for c in cs:
            await c.aclose()


async def push_one(c: httpx.AsyncClient, queue: str, txn: str, i: int) -> httpx.Response:
    return await c.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": f"p{i % 2}", "transactionId": txn, "payload": {"i": i}}]})


def drain(url: str, queue: str, expect: int) -> list[dict]:
    with httpx.Client(base_url=url, timeout=30) as c:
        return Api(c).pop_until(queue, expect, timeout=30, batch=500)


async def push_from_both(b, queue: str, n: int) -> tuple[int, list[str]]:
    """n one-message pushes over two partitions, spread over three connections on each worker, all at
    once; returns how many went through the worker that does not own the tenant, and the txns."""
    by_worker = await clients_per_worker(b.url)
    try:
        order = [c for i in range(3) for c in (by_worker[0][i], by_worker[1][i])]
        txns = [f"t{i}-{uuid.uuid4().hex[:8]}" for i in range(n)]
        answers = await asyncio.gather(*[push_one(order[i % 6], queue, txns[i], i) for i in range(n)])
        assert all(r.status_code in (200, 201) for r in answers), [r.text for r in answers if r.status_code >= 300][:3]
        assert all(r.json()[0]["status"] == "queued" for r in answers)
        via_other = sum(1 for i in range(n) if order[i % 6] in by_worker[1 - OWNER])
        return via_other, txns
    finally:
        await close_all(by_worker)


async def test_a_tenants_pushes_are_written_by_its_owner_whichever_worker_takes_them(start_broker):
    b = start_broker(workers=2, env=LANES_ON)
    before = {r: lane(b, r) for r in ("forwarded", "served", "fallback")}
    via_other, txns = await push_from_both(b, "lanes-on", 300)
    assert via_other == 150
    after = {r: lane(b, r) for r in ("forwarded", "served", "fallback")}
    assert after["forwarded"] - before["forwarded"] == via_other
    assert after["served"] - before["served"] == via_other
    assert after["fallback"] == before["fallback"]
    got = drain(b.url, "lanes-on", 300)
    assert sorted(m["transactionId"] for m in got) == sorted(txns)


async def test_by_default_each_worker_writes_what_it_takes(start_broker):
    b = start_broker(workers=2)
    via_other, txns = await push_from_both(b, "lanes-off", 100)
    assert via_other == 50
    assert [lane(b, r) for r in ("forwarded", "served", "fallback")] == [0, 0, 0]
    got = drain(b.url, "lanes-off", 100)
    assert sorted(m["transactionId"] for m in got) == sorted(txns)


async def test_an_owner_killed_costs_no_push(start_broker):
    """Pushes go on through the other worker from before the kill until after the replacement booted:
    each is answered 2xx, or 503 ``push_lane_lost`` for one the owner took and died with (then retried
    with its transactionId, as the error asks); every push answered 2xx is delivered, once."""
    b = start_broker(workers=2, env=LANES_ON)
    by_worker = await clients_per_worker(b.url, each=1)
    other = by_worker[1 - OWNER][0]
    owner_pid = (await by_worker[OWNER][0].get("/health")).json()["pid"]
    queue, stored, lost_answers = "lanes-kill", [], 0
    fallback0, forwarded0 = lane(b, "fallback"), lane(b, "forwarded")
    try:
        i = 0
        killed_at = None
        replaced = False
        deadline = time.monotonic() + 60
        while not replaced or i < killed_at + 400:
            assert time.monotonic() < deadline, f"no replacement within 60 s:\n{b.tail()}"
            if i == 100:
                os.kill(owner_pid, signal.SIGKILL)
                killed_at = i
            txn = f"k{i}"
            r = await push_one(other, queue, txn, i)
            if r.status_code == 503 and r.json()["reason"] == "push_lane_lost":
                lost_answers += 1
                r = await push_one(other, queue, txn, i)  # the retry the error asks for
            assert r.status_code in (200, 201), r.text
            assert r.json()[0]["status"] in ("queued", "duplicate")
            stored.append(txn)
            i += 1
            if killed_at is not None and not replaced and i % 20 == 0:
                pids = {int(p) for p in b.worker_pids()}
                replaced = owner_pid not in pids and len(pids) == 2 and lane(b, "forwarded") > forwarded0 + 100
                if not replaced:
                    await asyncio.sleep(0.05)
    finally:
        await close_all(by_worker)
    assert lost_answers <= 1
    assert lane(b, "fallback") > fallback0, "nothing was written by the worker that took it while the owner was down"
    got = drain(b.url, queue, len(stored))
    assert sorted(m["transactionId"] for m in got) == sorted(stored)


async def test_an_owner_draining_hands_every_push_back(start_broker):
    """SIGTERM to the owner worker alone (it drains; the master starts a new one): the owner says goodbye
    on its lanes, so the other worker writes what comes next itself: no push answers anything but 2xx,
    not even 503 push_lane_lost, and every one is delivered once."""
    b = start_broker(workers=2, env=LANES_ON)
    by_worker = await clients_per_worker(b.url, each=1)
    other = by_worker[1 - OWNER][0]
    owner_pid = (await by_worker[OWNER][0].get("/health")).json()["pid"]
    queue, stored = "lanes-drain", []
    fallback0 = lane(b, "fallback")
    try:
        deadline = time.monotonic() + 60
        i = 0
        while owner_pid in b.worker_pids() or i < 500:
            assert time.monotonic() < deadline, f"the owner did not drain within 60 s:\n{b.tail()}"
            if i == 100:
                os.kill(owner_pid, signal.SIGTERM)
            r = await push_one(other, queue, f"d{i}", i)
            assert r.status_code in (200, 201), r.text
            assert r.json()[0]["status"] == "queued"
            stored.append(f"d{i}")
            i += 1
    finally:
        await close_all(by_worker)
    assert lane(b, "fallback") > fallback0
    got = drain(b.url, queue, len(stored))
    assert sorted(m["transactionId"] for m in got) == sorted(stored)


# ---------------------------------------------------------------- in process


P = Principal(tenant="t", sub="s", grants=frozenset({"admin"}))
ITEMS = [PushItem(queue="q", partition="p", data=b"{}", txn="x", trace=None, deadline_ms=None)]
ROWS = [{"status": "queued", "message_id": uuid.uuid4(), "partition_id": uuid.uuid4(), "seq": 1, "txn": "x"}]


async def _pair(tmp_path: Path, submit, ready=lambda: True) -> tuple[lanes.LaneServer, lanes.LaneClient]:
    path = str(tmp_path / "w0.sock")
    server = lanes.LaneServer(path, submit, ready)
    await server.start()
    return server, lanes.LaneClient(path)


async def test_a_frame_brings_back_the_rows_or_the_owners_error(tmp_path):
    async def submit(principal, items):
        if items[0].txn == "bad":
            raise errors.Unavailable("encryption_unavailable", "no keys", code="unavailable",
                                     headers={"Retry-After": "1"}, extra={"queue": "q"})
        if items[0].txn == "db":
            raise asyncpg.exceptions.ConnectionDoesNotExistError("gone")
        if items[0].txn == "bug":
            raise KeyError("oops")
        assert (principal.tenant, principal, items) == ("t", P, ITEMS)
        return ROWS

    server, client = await _pair(tmp_path, submit)
    try:
        assert await client.push(P, ITEMS) == ROWS
        with pytest.raises(errors.Unavailable) as e:
            await client.push(P, [PushItem("q", "p", b"{}", "bad", None, None)])
        assert (e.value.status, e.value.envelope(), e.value.headers) == (
            503, {"error": "unavailable", "reason": "encryption_unavailable", "detail": "no keys", "queue": "q"},
            {"Retry-After": "1"})
        with pytest.raises(errors.ApiError) as e:  # what the error middleware answers for a lost database
            await client.push(P, [PushItem("q", "p", b"{}", "db", None, None)])
        assert e.value.status == 503
        with pytest.raises(RuntimeError, match="KeyError"):  # the middleware's 500, as had it failed here
            await client.push(P, [PushItem("q", "p", b"{}", "bug", None, None)])
        # answers come back by tag, whatever their order
        assert await asyncio.gather(*[client.push(P, ITEMS) for _ in range(50)]) == [ROWS] * 50
    finally:
        await client.close()
        await server.close(1)


async def test_an_owner_not_ready_or_absent_takes_nothing(tmp_path):
    taken = []

    async def submit(principal, items):
        taken.append(items)
        return ROWS

    server, client = await _pair(tmp_path, submit, ready=lambda: False)
    try:
        with pytest.raises(lanes.NotSent):
            await client.push(P, ITEMS)
    finally:
        await server.close(1)
    assert taken == []
    with pytest.raises(lanes.NotSent):  # no socket any more: never sent
        await client.push(P, ITEMS)
    await client.close()


async def test_an_owner_gone_after_taking_a_push_answers_lost(tmp_path):
    started = asyncio.Event()

    async def submit(principal, items):
        started.set()
        await asyncio.sleep(30)
        return ROWS

    server, client = await _pair(tmp_path, submit)
    try:
        call = asyncio.ensure_future(client.push(P, ITEMS))
        await asyncio.wait_for(started.wait(), 5)
        for w in list(server._conns):  # the owner's process dies: its end of the socket closes
            w.transport.abort()
        with pytest.raises(errors.Unavailable) as e:
            await asyncio.wait_for(call, 5)
        assert e.value.reason == "push_lane_lost"
    finally:
        for t in list(server._jobs):
            t.cancel()
        await client.close()
        await server.close(1)


async def test_a_push_too_big_for_a_frame_is_not_sent(tmp_path, monkeypatch):
    taken = []

    async def submit(principal, items):
        taken.append(items)
        return ROWS

    server, client = await _pair(tmp_path, submit)
    try:
        monkeypatch.setattr(lanes, "MAX_FRAME", 200)
        with pytest.raises(lanes.NotSent):
            await client.push(P, [PushItem("q", "p", b"x" * 500, "big", None, None)])
        monkeypatch.undo()
        assert await client.push(P, ITEMS) == ROWS  # the connection is still good
    finally:
        await client.close()
        await server.close(1)
    assert taken == [ITEMS]
