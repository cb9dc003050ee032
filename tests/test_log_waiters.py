"""Long-poll wake-ups of the message log (broker/log/waiters.py and LogService.pop): a notify wakes ONE
parked poll, the baton hands on what one pop could not take, concurrent pops gather into one statement,
and nothing is lost or delayed: a burst of single pushes costs about one pop per push (not one per
parked poll), a lone push answers a parked poll at once, and a push of several partitions reaches as
many parked polls."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import asyncpg
import pytest

from broker import services
from broker.auth import Principal
from broker.config import Settings
from broker.context import Broker
from broker.log.calls import Pop
from broker.log.parse import PushItem
from broker.log.service import LogService, PopRequest
from broker.log.waiters import CHANNEL, Waiters
from broker.store.pool import create_pool
from broker.store.queries import Q

# ---- the waiters alone


async def test_a_notify_wakes_one_waiter_and_the_baton_the_next() -> None:
    w = Waiters(one=True)
    key = ("t", "q")
    evs = [w.register([key]) for _ in range(4)]
    w.notify("t\tq")
    assert [e.is_set() for e in evs] == [True, False, False, False]  # the oldest parked one
    w.notify("t\tq")
    assert [e.is_set() for e in evs] == [True, True, False, False]  # one not woken yet
    w.pass_on([key])
    assert [e.is_set() for e in evs] == [True, True, True, False]
    w.notify("t\tother")  # another queue's notify wakes nobody here
    assert not evs[3].is_set()
    assert w.unregister([key], evs[0]) is not None  # woken by a notify: the instant is kept
    assert w.unregister([key], evs[3]) is None
    # one waiter of each class (consumer group, named partition): g2 cannot take what g1 takes
    g1 = [w.register([key], ("g1", None)) for _ in range(2)]
    g2 = w.register([key], ("g2", None))
    part = w.register([key], ("g1", "p"))
    w.notify("t\tq")
    assert [e.is_set() for e in (*g1, g2, part)] == [True, False, True, True]
    w.pass_on([key], ("g1", None))
    assert g1[1].is_set()
    every = Waiters()  # the default (ephemeral queues): every waiter of the queue
    evs = [every.register([key]) for _ in range(3)]
    every.notify("t\tq")
    assert all(e.is_set() for e in evs)


# ---- through LogService on a real database, woken by real NOTIFYs


@pytest.fixture
async def svc(pg):  # type: ignore[no-untyped-def]
    b = Broker(settings=Settings.from_env({}), dsn=pg.new_db())
    s = services.build(b).log
    b.pool = await create_pool(b.settings, b.dsn, min_size=1, max_size=8)
    b.ready = True
    listener = await asyncpg.connect(b.dsn)
    await listener.add_listener(CHANNEL, lambda _c, _pid, _ch, payload: s.waiters.notify(payload))
    try:
        yield s
    finally:
        await listener.close()
        await s.close()
        await b.pool.close()


P = Principal(tenant="co", sub="alice", grants=frozenset({"produce", "consume"}))


def req(queue: str, *, timeout_ms: int = 10_000, batch: int = 100, partitions: int = 1,
        auto_ack: bool = True, group: str = "__QUEUE_MODE__", partition: str | None = None) -> PopRequest:
    return PopRequest(queue=queue, partition=partition, group=group, batch=batch, partitions=partitions,
                      auto_ack=auto_ack, sub_mode=None, sub_from=None, wait=True, timeout_ms=timeout_ms)


async def push(svc: LogService, queue: str, *parts: str) -> None:
    items = [PushItem(queue=queue, partition=p, data=b'"x"', txn=None, trace=None, deadline_ms=None)
             for p in parts]
    out = await svc.push(P, items)
    assert all(r["status"] == "queued" for r in out)


async def parked(svc: LogService, n: int) -> None:
    """Wait until n long polls wait on their events (registered, listening, popped empty)."""
    for _ in range(500):
        if len(svc.waiters) >= n and svc.pop_coalescer._inflight == 0 and not svc.pop_coalescer._pending:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{len(svc.waiters)} of {n} polls parked")


async def test_a_burst_of_single_pushes_costs_about_one_pop_per_push(svc: LogService) -> None:
    n_polls, m_pushes = 8, 20
    q = "burst"
    await push(svc, q, "p0")  # the queue exists
    assert (await svc.pop(P, req(q)))["messages"]
    got: list[str] = []
    stop = asyncio.Event()

    async def consumer() -> None:
        while not stop.is_set():
            ans = await svc.pop(P, req(q, timeout_ms=3_000))
            if ans is not None:
                got.extend(m["id"] for m in ans["messages"])

    tasks = [asyncio.ensure_future(consumer()) for _ in range(n_polls)]
    await parked(svc, n_polls)
    jobs_before = svc.pop_coalescer.jobs
    for i in range(m_pushes):
        await push(svc, q, f"p{i % 5}")
        for _ in range(400):  # the next push only once this one was delivered (every poll parked again)
            if len(got) == i + 1:
                break
            await asyncio.sleep(0.005)
        await parked(svc, n_polls)
    pops = svc.pop_coalescer.jobs - jobs_before
    stop.set()
    svc.waiters.wake_all()
    await asyncio.gather(*tasks)
    assert len(got) == m_pushes == len(set(got))
    # Every push woke one parked poll (its pop) and, as that poll took a whole partition's worth, the
    # baton one more (an empty pop); waking every parked poll made about n_polls pops per push.
    assert pops <= 3 * m_pushes, f"{pops} queen_pop calls for {m_pushes} pushes to {n_polls} parked polls"


async def test_a_lone_push_answers_a_parked_poll_at_once(svc: LogService) -> None:
    q = "lone"
    await push(svc, q, "a")
    assert (await svc.pop(P, req(q)))["messages"]
    polls = [asyncio.ensure_future(svc.pop(P, req(q, timeout_ms=10_000))) for _ in range(4)]
    await parked(svc, 4)
    t0 = time.perf_counter()
    await push(svc, q, "a")
    done, _ = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED, timeout=5)
    took = time.perf_counter() - t0
    assert len(done) == 1 and (await done.pop())["messages"]
    assert took < 1.0, f"a parked poll answered {took:.3f}s after the push"
    svc.waiters.wake_all()
    svc.b.draining = True  # the other polls answer empty now
    rest = await asyncio.gather(*[p for p in polls if not p.done()])
    assert all(r is None for r in rest)


async def test_one_push_to_several_partitions_reaches_as_many_parked_polls(svc: LogService) -> None:
    """One NOTIFY for a push of k partitions wakes one poll; each poll that took a partition hands the
    baton on, so k polls answer (one partition each) while the timeout is still far."""
    q = "spread"
    await push(svc, q, "a", "b", "c", "d")
    async with svc.b.require_pool().acquire() as c:  # consume the priming messages
        await c.fetch(Q.log_pop, *Pop(tenant="co", queue=q, partition=None, group="__QUEUE_MODE__", batch=100,
                                      max_partitions=10, auto_ack=True).args())
    polls = [asyncio.ensure_future(svc.pop(P, req(q, timeout_ms=20_000))) for _ in range(6)]
    await parked(svc, 6)
    t0 = time.perf_counter()
    await push(svc, q, "a", "b", "c", "d")
    answers: list[dict[str, Any]] = []
    while len(answers) < 4 and time.perf_counter() - t0 < 10:
        done, _ = await asyncio.wait([p for p in polls if not p.done()], return_when=asyncio.FIRST_COMPLETED,
                                     timeout=10)
        answers.extend(d.result() for d in done)
    assert time.perf_counter() - t0 < 5
    assert sorted(a["partition"] for a in answers) == ["a", "b", "c", "d"]
    svc.b.draining = True
    svc.waiters.wake_all()
    await asyncio.gather(*polls)


async def test_a_push_wakes_a_poll_of_every_group_and_of_its_named_partition(svc: LogService) -> None:
    """One poll per class is woken: each consumer group needs the message, and a poll of one named
    partition cannot take another's (woken in their place, the message would wait for the timeout)."""
    q = "classes"
    await push(svc, q, "a", "b")
    for r in (req(q, group="g1"), req(q, group="g2"), req(q), req(q)):  # the groups exist, all consumed
        await svc.pop(P, dataclasses.replace(r, wait=False, partitions=10))
    mk = [req(q, group="g1", timeout_ms=20_000), req(q, group="g1", timeout_ms=20_000),
          req(q, group="g2", timeout_ms=20_000), req(q, partition="a", timeout_ms=20_000),
          req(q, partition="b", timeout_ms=20_000)]
    polls = [asyncio.ensure_future(svc.pop(P, r)) for r in mk]
    await parked(svc, len(polls))
    t0 = time.perf_counter()
    await push(svc, q, "b")
    answered: list[int] = []
    while len(answered) < 3 and time.perf_counter() - t0 < 10:
        await asyncio.wait([p for p in polls if not p.done()], return_when=asyncio.FIRST_COMPLETED, timeout=10)
        answered = [i for i, p in enumerate(polls) if p.done()]
    assert time.perf_counter() - t0 < 5, f"answered {answered} only"
    assert len(answered) == 3 and answered[0] in (0, 1) and answered[1:] == [2, 4]
    svc.b.draining = True
    svc.waiters.wake_all()
    await asyncio.gather(*polls)


async def test_gathered_pops_each_get_their_own_partitions_and_lease(svc: LogService) -> None:
    q = "gather"
    await push(svc, q, "a", "a", "b", "c")
    jobs = [Pop(tenant="co", queue=q, partition=None, group="__QUEUE_MODE__", batch=10, max_partitions=1,
                auto_ack=False) for _ in range(4)]
    jobs.append(Pop(tenant="co", queue=q, partition="a", group="g2", batch=10, max_partitions=1, auto_ack=True))
    out = await svc._pop_group("co", jobs)
    msgs = [[r for r in rows if r["kind"] == "msg"] for rows in out]
    parts = [{r["partition"] for r in m} for m in msgs[:4]]
    assert sorted(p for s in parts for p in s) == ["a", "b", "c"]  # one partition per pop, none twice
    assert [len(m) for m in msgs[:4]].count(0) == 1 and [r["kind"] for r in out[3]] == ["idle"]
    leases = [m[0]["lease_id"] for m in msgs[:3]]
    assert len(set(leases)) == 3 and all(r["lease_id"] == m[0]["lease_id"] for m in msgs[:3] for r in m)
    assert [r["seq"] for r in msgs[4]] == [1, 2]  # another group sees partition a on its own
    # the leases hold: a fresh pop of the queue finds nothing until they are acked or expire
    assert [r["kind"] for r in await svc._pop_alone(jobs[0])] == ["idle"]
