"""No leader (docs/decisions.md §3): the sweepers of both workers of one ``queen serve`` claim and fire at the same
time, each partition stays in deliverAt order, and every worker's own fired count shows in
``queen_sweeper_fired{pid=...}``."""

from __future__ import annotations

import asyncio
import re
import time

import asyncpg
import httpx
from conftest import uniq
from helpers import db_fetch, frames, timer_op, wait_for

ENV = {"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_BATCH": "8", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}


def fired_by_pid(c: httpx.Client) -> dict[int, float]:
    text = c.get("/metrics/prometheus").text
    return {int(pid): float(v) for pid, v in re.findall(r'^queen_sweeper_fired\{pid="(\d+)"\} (\S+)$', text, re.M)}


def test_both_workers_fire_at_once_and_each_partition_keeps_deliver_at_order(start_broker):
    b = start_broker(env=ENV, workers=2)
    stalled, burst = uniq("stall"), uniq("burst")
    parts, per = 12, 8
    with httpx.Client(base_url=b.url, timeout=30) as c:
        # 1. One sweeper claims `stalled`'s timer and sits on it for 4 s (a slow pack). Under a leader
        #    nothing else could fire meanwhile; here the other worker's sweeper fires the whole burst.
        assert c.post("/api/v1/test/timers/fail",
                      json={"queue": stalled, "count": 1, "class": "stall", "ms": 4_000}).status_code == 200
        r = c.post("/api/v1/timers", json={"operations": [timer_op(stalled, "s", uniq("txn"), delay=0, partition="S", payload=b'{"i": 0}')]})
        assert r.status_code == 200
        claim = wait_for(lambda: db_fetch(b.dsn, "SELECT claimed_by FROM queen_timers WHERE queue = $1 "
                                            "AND claim_token IS NOT NULL AND claimed_until > now()", stalled),
                         10, "the stalled timer claimed")
        staller = int(claim[0]["claimed_by"].rsplit(":", 1)[1])
        # a burst across partitions; within each partition deliverAt is distinct and the keys are
        # scheduled in reverse deliverAt order, so neither key nor schedule order can stand in for it
        ops = [timer_op(burst, f"p{p:02}-k{i}", f"{burst}-p{p:02}-{i}", delay=300 + 15 * i, partition=f"P{p:02}", payload=b'{"i": %d}' % i)
               for p in range(parts) for i in reversed(range(per))]
        t0 = time.monotonic()
        assert c.post("/api/v1/timers", json={"operations": ops}).status_code == 200
        wait_for(lambda: db_fetch(b.dsn, "SELECT count(*) = $2 AS ok FROM queen_messages WHERE txn LIKE $1 || '%'",
                             burst, parts * per)[0]["ok"], 10, "the burst fired")
        assert time.monotonic() - t0 < 3.5
        # ... all of it while the stalled claim was still live, by the other worker
        assert db_fetch(b.dsn, "SELECT count(*) AS n FROM queen_timers WHERE queue = $1 AND claim_token IS NOT NULL",
                   stalled)[0]["n"] == 1
        rows = db_fetch(b.dsn, "SELECT p.name AS partition, m.payload FROM queen_messages m "
                          "JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id "
                          "WHERE p.queue = $1 ORDER BY p.name, m.seq", burst)
        order: dict[str, list[int]] = {}
        for row in rows:
            order.setdefault(row["partition"], []).append(int(row["payload"].decode().split(":")[1].strip(" }")))
        assert len(order) == parts and all(v == list(range(per)) for v in order.values())
        # 2. The stall ends and the staller fires its own timer: both workers fired, per-pid series say so.
        wait_for(lambda: db_fetch(b.dsn, "SELECT count(*) AS n FROM queen_messages m JOIN queen_partitions p "
                                    "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.queue = $1",
                             stalled)[0]["n"] == 1, 10, "the stalled timer fired after its stall")
        counts = wait_for(lambda: (f := fired_by_pid(c)) and len([v for v in f.values() if v > 0]) >= 2 and f,
                          5, "two workers with fired timers")
        pids = set(b.worker_pids())
        assert staller in pids and {p for p, v in counts.items() if v > 0} <= pids
        assert sum(counts.values()) == parts * per + 1
        assert frames(b.dsn, f"{burst}-p00-0")


async def test_a_schedule_wakes_its_own_workers_sweeper_in_process_and_sends_no_notify(start_broker):
    """One worker, its sweeper asleep for up to 10 s: a timer scheduled 300 ms ahead fires at its instant
    (the schedule woke the sweeper of the worker that took it), and no NOTIFY queen_timers went out (a
    NOTIFY holds the database's notify-queue lock through the commit's flush)."""
    b = start_broker(env={"QUEEN_SWEEPER_MAX_SLEEP_MS": "10000"}, workers=1)
    notified: list[str] = []
    listener = await asyncpg.connect(b.dsn)
    await listener.add_listener("queen_timers", lambda _c, _p, _ch, payload: notified.append(payload))
    q = uniq("inproc")
    try:
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as c:
            await asyncio.sleep(0.5)  # the sweeper's first cycle found nothing: asleep for 10 s
            r = await c.post("/api/v1/timers", json={"operations": [timer_op(q, "k", uniq("txn"), delay=300)]})
            assert r.status_code == 200 and r.json()["results"][0]["status"] == "scheduled"
            t0 = time.monotonic()
            while not await listener.fetchval(
                    "SELECT count(*) FROM queen_messages m JOIN queen_partitions p ON p.tenant = m.tenant "
                    "AND p.id = m.partition_id WHERE p.queue = $1", q):
                assert time.monotonic() - t0 < 5, "the sleeping sweeper was not woken by the schedule"
                await asyncio.sleep(0.05)
        assert notified == []
    finally:
        await listener.close()
