"""Group commit inside a worker (broker/log/coalesce.py and its use by LogService): concurrent small
pushes and acks share one database call; every waiter gets exactly its own outcome, only after the
shared call returned (committed); a failure answers every waiter of the call and commits nothing."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from helpers import sql_ack, sql_pop, sql_push

from broker import services
from broker.auth import Principal
from broker.config import Settings
from broker.context import Broker
from broker.log.calls import Pop
from broker.log.coalesce import Coalescer
from broker.log.parse import AckItem, PushItem
from broker.log.service import COALESCE_PUSH_ITEMS, LogService
from broker.store import lock_keys
from broker.store.pool import create_pool
from broker.store.queries import Q

# ---- the coalescer alone


async def settle() -> None:
    """Let the submitted tasks and the calls they start run up to their next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


class Recorder:
    """A run function that records its calls and can be held open or made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: BaseException | None = None

    async def run(self, key: str, jobs: list[int]) -> list[object]:
        self.calls.append((key, list(jobs)))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [j * 10 if j >= 0 else ValueError(f"job {j}") for j in jobs]


async def test_queued_jobs_share_one_call_and_get_their_own_results() -> None:
    r = Recorder()
    c: Coalescer[str, int] = Coalescer("t", r.run, max_inflight=1, max_items=100)
    r.gate.clear()
    first = asyncio.ensure_future(c.submit("a", 1))
    await settle()  # the first goes out alone at once (nothing waits on a timer)
    assert r.calls == [("a", [1])]
    rest = [asyncio.ensure_future(c.submit("a", j)) for j in range(2, 8)]
    await settle()
    assert len(r.calls) == 1  # held while the first call is in flight
    r.gate.set()
    assert await first == 10
    assert await asyncio.gather(*rest) == [j * 10 for j in range(2, 8)]
    assert r.calls == [("a", [1]), ("a", [2, 3, 4, 5, 6, 7])]
    assert (c.calls, c.jobs) == (2, 7)


async def test_one_jobs_own_failure_stays_its_own() -> None:
    r = Recorder()
    c: Coalescer[str, int] = Coalescer("t", r.run, max_inflight=1, max_items=100)
    r.gate.clear()
    hold = asyncio.ensure_future(c.submit("a", 0))
    await settle()
    futs = [asyncio.ensure_future(c.submit("a", j)) for j in (1, -1, 2)]
    r.gate.set()
    await hold
    out = await asyncio.gather(*futs, return_exceptions=True)
    assert out[0] == 10 and out[2] == 20 and isinstance(out[1], ValueError)


async def test_a_failed_call_answers_every_waiter_with_the_failure() -> None:
    r = Recorder()
    c: Coalescer[str, int] = Coalescer("t", r.run, max_inflight=1, max_items=100)
    r.gate.clear()
    hold = asyncio.ensure_future(c.submit("a", 0))
    await settle()
    futs = [asyncio.ensure_future(c.submit("a", j)) for j in range(1, 5)]
    r.fail = ConnectionResetError("database went away")
    r.gate.set()
    out = await asyncio.gather(hold, *futs, return_exceptions=True)
    assert all(isinstance(x, ConnectionResetError) for x in out)
    r.fail = None
    assert await c.submit("a", 3) == 30  # the coalescer keeps working after a failed call


async def test_cancelled_waiters_do_not_lose_the_others() -> None:
    r = Recorder()
    c: Coalescer[str, int] = Coalescer("t", r.run, max_inflight=1, max_items=100)
    r.gate.clear()
    sent = asyncio.ensure_future(c.submit("a", 1))
    await settle()
    queued = [asyncio.ensure_future(c.submit("a", j)) for j in (2, 3, 4)]
    await settle()
    queued[1].cancel()  # cancelled before its call was sent: never sent
    sent.cancel()  # cancelled after its call was sent: its outcome is dropped
    await settle()
    r.gate.set()
    assert await queued[0] == 20 and await queued[2] == 40
    assert r.calls == [("a", [1]), ("a", [2, 4])]
    with pytest.raises(asyncio.CancelledError):
        await sent


async def test_calls_respect_max_items_and_keys() -> None:
    r = Recorder()
    c: Coalescer[str, int] = Coalescer("t", r.run, max_inflight=1, max_items=5)
    r.gate.clear()
    hold = asyncio.ensure_future(c.submit("a", 0))
    await settle()
    futs = [asyncio.ensure_future(c.submit("a", 1, size=3)), asyncio.ensure_future(c.submit("b", 2)),
            asyncio.ensure_future(c.submit("a", 3, size=3)), asyncio.ensure_future(c.submit("a", 4, size=2))]
    r.gate.set()
    await asyncio.gather(hold, *futs)
    # key a: 3 items, then 3 + 2 (never over 5); key b on its own call; tenants take turns
    assert r.calls == [("a", [0]), ("a", [1]), ("b", [2]), ("a", [3, 4])]


async def test_one_call_per_key_leaves_the_other_slot_to_other_keys() -> None:
    r = Recorder()
    c: Coalescer[str, int] = Coalescer("t", r.run, max_inflight=2, max_items=100, max_per_key=1)
    r.gate.clear()
    first = asyncio.ensure_future(c.submit("a", 1))
    await settle()
    more_a = [asyncio.ensure_future(c.submit("a", j)) for j in (2, 3)]
    await settle()
    assert r.calls == [("a", [1])]  # a's second call waits for its first, though a slot is free
    b = asyncio.ensure_future(c.submit("b", 9))
    await settle()
    assert r.calls == [("a", [1]), ("b", [9])]  # another key takes the free slot at once
    r.gate.set()
    assert await asyncio.gather(first, *more_a, b) == [10, 20, 30, 90]
    assert r.calls[2:] == [("a", [2, 3])]  # the waiting jobs of a went out as one bigger call
    assert c._per_key == {} and c._inflight == 0


def test_max_per_key_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Coalescer("t", Recorder().run, max_inflight=2, max_items=10, max_per_key=0)


async def test_the_push_coalescer_runs_one_call_per_tenant(svc: LogService) -> None:
    assert svc.push_coalescer.max_per_key == 1 and svc.push_coalescer.max_inflight == 2


# ---- through LogService on a real database


@pytest.fixture
async def svc(pg):  # type: ignore[no-untyped-def]
    b = Broker(settings=Settings.from_env({}), dsn=pg.new_db())
    s = services.build(b).log  # the worker's services, none started: limits admit from the cache
    b.pool = await create_pool(b.settings, b.dsn, min_size=1, max_size=4)
    b.ready = True
    try:
        yield s
    finally:
        await s.close()
        await b.pool.close()


P = Principal(tenant="co", sub="alice", grants=frozenset({"produce", "consume"}))
P2 = Principal(tenant="co", sub="bob", grants=frozenset({"produce", "consume"}))


def item(queue: str, part: str, txn: str | None, body: bytes = b'{"a":1}') -> PushItem:
    return PushItem(queue=queue, partition=part, data=body, txn=txn, trace=None, deadline_ms=None)


async def stored(svc: LogService, queue: str) -> list[tuple[str, str, int, str | None]]:
    async with svc.b.require_pool().acquire() as c:
        rows = await c.fetch(
            "SELECT p.name, m.txn, m.seq, m.producer_sub FROM queen_messages m JOIN queen_partitions p "
            "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.tenant = 'co' AND p.queue = $1 "
            "ORDER BY p.name, m.seq", queue)
    return [tuple(r) for r in rows]  # type: ignore[misc]


async def test_a_coalesced_push_splits_rows_and_dedupes_across_requests(svc: LogService) -> None:
    jobs = [
        (P, [item("q", "p1", "a"), item("q", "p2", "b")]),
        (P2, [item("q", "p1", "a"), item("q", "p3", "c")]),  # 'a' in p1 repeats the first request's
        (P, [item("q", "p2", "b2"), item("q", "p2", "b2")]),  # a duplicate inside one request
    ]
    out = await svc._push_group("co", jobs)
    assert [[r["status"] for r in rows] for rows in out] == [["queued", "queued"], ["duplicate", "queued"],
                                                            ["queued", "duplicate"]]
    assert out[1][0]["message_id"] == out[0][0]["message_id"]
    assert out[2][1]["message_id"] == out[2][0]["message_id"]
    assert [r["seq"] for r in out[0]] == [1, 1] and out[2][0]["seq"] == 2  # FIFO per partition, gapless
    assert await stored(svc, "q") == [("p1", "a", 1, "alice"), ("p2", "b", 1, "alice"), ("p2", "b2", 2, "alice"),
                                      ("p3", "c", 1, "bob")]


async def test_concurrent_pushes_through_the_coalescer_are_answered_and_committed(svc: LogService) -> None:
    before = svc.push_coalescer.calls
    res = await asyncio.gather(*[svc.push(P, [item("cq", f"p{i % 7}", f"t{i}")]) for i in range(60)])
    assert all(r[0]["status"] == "queued" for r in res)
    assert svc.push_coalescer.calls - before < 60  # shared calls happened
    rows = await stored(svc, "cq")
    assert sorted(t for _, t, _, _ in rows) == sorted(f"t{i}" for i in range(60))
    for part in {p for p, _, _, _ in rows}:  # gapless offsets per partition
        seqs = [s for p, _, s, _ in rows if p == part]
        assert seqs == list(range(1, len(seqs) + 1))
    # what each waiter was told is what is stored
    async with svc.b.require_pool().acquire() as c:
        ids = dict(await c.fetch("SELECT txn, id::text FROM queen_messages WHERE tenant = 'co'"))
    assert all(ids[r[0]["transaction_id"]] == r[0]["message_id"] for r in res)


async def test_hundred_item_pushes_share_calls_and_bigger_ones_go_alone(svc: LogService) -> None:
    """Pushes of up to COALESCE_PUSH_ITEMS items gather (up to COALESCE_CALL_ITEMS a call): concurrent
    pushes of a tenant that lock most of the same partitions share a commit instead of queueing on each
    other's rows one statement at a time. A bigger push is its own statement."""
    n = COALESCE_PUSH_ITEMS
    before = svc.push_coalescer.calls, svc.push_coalescer.jobs
    res = await asyncio.gather(*[svc.push(P, [item("hq", f"p{(r * n + i) % 11}", f"r{r}-{i}") for i in range(n)])
                                 for r in range(12)])
    calls, jobs = svc.push_coalescer.calls - before[0], svc.push_coalescer.jobs - before[1]
    assert jobs == 12 and calls < 12  # every request through the coalescer, some of them together
    assert all(len(r) == n and {x["status"] for x in r} == {"queued"} for r in res)
    rows = await stored(svc, "hq")
    assert sorted(t for _, t, _, _ in rows) == sorted(f"r{r}-{i}" for r in range(12) for i in range(n))
    for part in {p for p, _, _, _ in rows}:  # gapless offsets per partition
        assert [s for p, _, s, _ in rows if p == part] == list(range(1, 1 + sum(1 for q, *_ in rows if q == part)))
    before = svc.push_coalescer.calls, svc.push_coalescer.jobs
    big = await svc.push(P, [item("hq", f"p{i % 11}", f"big-{i}") for i in range(n + 1)])
    assert len(big) == n + 1 and (svc.push_coalescer.calls, svc.push_coalescer.jobs) == before


async def test_a_database_failure_answers_every_waiter_and_commits_nothing(svc: LogService, monkeypatch) -> None:
    real = svc.write

    async def broken(conn, *a, **kw):  # type: ignore[no-untyped-def]
        await real(conn, *a, **kw)  # the statement ran ...
        raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost before the answer")

    async def lost(conn, *a, **kw):  # type: ignore[no-untyped-def]
        raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost")

    monkeypatch.setattr(svc, "write", lost)
    out = await asyncio.gather(*[svc.push(P, [item("fq", f"p{i}", f"t{i}")]) for i in range(20)],
                               return_exceptions=True)
    assert all(isinstance(x, asyncpg.exceptions.ConnectionDoesNotExistError) for x in out)
    assert await stored(svc, "fq") == []
    # lost after the statement ran (the answer never came): the waiters still all get the failure
    monkeypatch.setattr(svc, "write", broken)
    out = await asyncio.gather(*[svc.push(P, [item("fq2", f"p{i}", f"t{i}")]) for i in range(20)],
                               return_exceptions=True)
    assert all(isinstance(x, asyncpg.exceptions.ConnectionDoesNotExistError) for x in out)
    monkeypatch.setattr(svc, "write", real)
    assert (await svc.push(P, [item("fq", "p0", "t0")]))[0]["status"] == "queued"


async def test_a_shared_call_that_fails_for_one_job_retries_each_alone(svc: LogService, monkeypatch) -> None:
    real = svc.write
    shared: list[int] = []

    async def picky(conn, tenant, items, *a, **kw):  # type: ignore[no-untyped-def]
        if len(items) > 1:
            shared.append(len(items))
            async with conn.transaction():  # a statement that fails rolls back all of itself
                await real(conn, tenant, items, *a, **kw)
                raise asyncpg.exceptions.CheckViolationError("one bad item")
        return await real(conn, tenant, items, *a, **kw)

    monkeypatch.setattr(svc, "write", picky)
    out = await svc._push_group("co", [(P, [item("iq", "p1", "x")]), (P, [item("iq", "p2", "y")])])
    assert shared == [2]
    assert [rows[0]["status"] for rows in out] == ["queued", "queued"]
    assert [t for _, t, _, _ in await stored(svc, "iq")] == ["x", "y"]


async def test_coalesced_acks_split_verdicts(svc: LogService) -> None:
    for i in range(4):
        await svc.push(P, [item("aq", f"p{i}", f"m{i}")])
    async with svc.b.require_pool().acquire() as c:
        pop = Pop(tenant="co", queue="aq", partition=None, group="__QUEUE_MODE__", batch=10, max_partitions=1,
                  auto_ack=False)
        pops = [await c.fetch(Q.log_pop, *pop.args()) for _ in range(4)]
    msgs = [r for rows in pops for r in rows if r["kind"] == "msg"]
    assert len(msgs) == 4

    def ack(m, lease=None):  # type: ignore[no-untyped-def]
        return AckItem(partition_id=m["partition_id"], txn=m["txn"], status="completed",
                       lease=lease if lease is not None else m["lease_id"], lease_malformed=False,
                       group="__QUEUE_MODE__", error=None)

    jobs = [[ack(msgs[0])], [ack(msgs[1], uuid.uuid4())], [ack(m) for m in msgs[2:]]]
    out = await svc._ack_group("co", jobs)
    assert [[v[0] for v in rows] for rows in out] == [[True], [False], [True, True]]
    assert out[1][0][1] == "Invalid or expired lease"
    # through the coalescer, concurrently: the refused one is still acknowledgeable with its lease
    res = await asyncio.gather(svc.ack(P, [ack(msgs[1])]), svc.ack(P, [ack(msgs[0])]))
    assert [r[0]["success"] for r in res] == [True, True]


# ---- gathered pops: one walk of the group's cursors for all of them (queen_pop_many)


def gathered(queue: str, *widths: int, group: str = "__QUEUE_MODE__") -> tuple:
    """``log_pop_many`` arguments: one autoAck pop of ``queue`` per width (its max_partitions)."""
    return Pop.many_args("co", [Pop(tenant="co", queue=queue, partition=None, group=group, batch=10,
                                    max_partitions=w, auto_ack=True) for w in widths])


def by_job(rows: list[asyncpg.Record], jobs: int) -> list[list[str]]:
    """Per job (1-based in the rows), the partitions of the messages it got, in order."""
    out: list[list[str]] = [[] for _ in range(jobs)]
    for r in rows:
        if r["kind"] == "msg" and (not out[r["job"] - 1] or out[r["job"] - 1][-1] != r["partition"]):
            out[r["job"] - 1].append(r["partition"])
    return out


async def seed(c: asyncpg.Connection, queue: str, parts: list[str]) -> None:
    """One message in each partition, and the group's cursors on all of them (a pop that finds the
    queue empty again), claimed in the order of ``parts``: p[0] the least recently claimed."""
    for p in parts:
        await sql_push(c, "co", queue, [f"{p}-0"], partition=p)
    for _ in parts:  # a pop per partition: the group's cursors exist and each is claimed once
        assert len(await sql_pop(c, "co", queue, batch=10, auto_ack=True)) == 1
    for k, p in enumerate(parts):
        await c.execute(
            "UPDATE queen_cursors cu SET claimed_at = now() - (100 - $3) * interval '1 second' FROM queen_partitions p "
            "WHERE p.tenant = cu.tenant AND p.id = cu.partition_id AND cu.tenant = 'co' AND p.queue = $1 AND p.name = $2",
            queue, p, k)
        await sql_push(c, "co", queue, [f"{p}-1"], partition=p)


async def test_gathered_pops_take_the_least_recently_claimed_partitions_in_job_order(svc: LogService) -> None:
    async with svc.b.require_pool().acquire() as c:
        await seed(c, "gw", ["p3", "p1", "p4", "p0", "p2"])
        rows = await c.fetch(Q.log_pop_many, *gathered("gw", 1, 1, 1, 1, 1, 1, 1))
        # one walk handed the five servable partitions out in claimed_at order; the jobs left without
        # one answer idle (nothing else to serve at this instant), and nothing went out twice
        assert by_job(rows, 7) == [["p3"], ["p1"], ["p4"], ["p0"], ["p2"], [], []]
        assert sorted(r["txn"] for r in rows if r["kind"] == "msg") == sorted(f"p{i}-1" for i in range(5))
        assert [r["kind"] for r in rows if r["job"] > 5] == ["idle", "idle"]


async def test_gathered_pops_of_several_partitions_walk_alone_and_stop_at_their_batch(svc: LogService) -> None:
    async with svc.b.require_pool().acquire() as c:
        await seed(c, "gs", ["p0", "p1", "p2", "p3", "p4"])
        await sql_push(c, "co", "gs", ["p0-2", "p0-3"], partition="p0")
        # an autopilot-style pop (up to 5 partitions) whose batch fills on p0 and p1 leaves the rest to the
        # jobs after it: a share of cursors handed out in advance would have held all five
        jobs = [Pop(tenant="co", queue="gs", partition=None, group="__QUEUE_MODE__", batch=b, max_partitions=w,
                    auto_ack=True) for b, w in ((4, 5), (10, 1), (10, 1), (10, 5))]
        rows = await c.fetch(Q.log_pop_many, *Pop.many_args("co", jobs))
        got = by_job(rows, 4)
        assert got[0] == ["p0", "p1"] and sorted(p for ps in got[1:] for p in ps) == ["p2", "p3", "p4"]
        assert len(got[1]) <= 1 and len(got[2]) <= 1


async def test_gathered_pops_pass_over_cursors_another_transaction_holds(svc: LogService) -> None:
    async with svc.b.require_pool().acquire() as c, svc.b.require_pool().acquire() as other:
        await seed(c, "gl", ["p0", "p1", "p2"])
        async with other.transaction():
            await other.execute(
                "SELECT 1 FROM queen_cursors cu JOIN queen_partitions p ON p.tenant = cu.tenant AND "
                "p.id = cu.partition_id WHERE cu.tenant = 'co' AND p.queue = 'gl' AND p.name = 'p0' FOR UPDATE OF cu")
            rows = await c.fetch(Q.log_pop_many, *gathered("gl", 1, 1, 1))
            assert by_job(rows, 3) == [["p1"], ["p2"], []]
        rows = await c.fetch(Q.log_pop_many, *gathered("gl", 1, 1))  # released: the next call takes it
        assert by_job(rows, 2) == [["p0"], []]


async def test_gathered_pops_of_a_new_group_walk_to_the_cursors_its_first_pop_makes(svc: LogService) -> None:
    async with svc.b.require_pool().acquire() as c:
        for p in ("p0", "p1", "p2"):
            await sql_push(c, "co", "gn", [f"{p}-0"], partition=p)
        rows = await c.fetch(Q.log_pop_many, *gathered("gn", 1, 1, 1, 1, group="fresh"))
        got = by_job(rows, 4)
        assert sorted(p for ps in got[:3] for p in ps) == ["p0", "p1", "p2"] and got[3] == []
        # the queue-mode group beside it has not been touched, and gets them all once
        rows = await c.fetch(Q.log_pop_many, *gathered("gn", 1, 1, 1))
        assert sorted(p for ps in by_job(rows, 3) for p in ps) == ["p0", "p1", "p2"]


async def test_gathered_pops_of_two_queues_and_a_named_partition_keep_their_own_answers(svc: LogService) -> None:
    async with svc.b.require_pool().acquire() as c:
        await seed(c, "ga", ["p0", "p1"])
        await seed(c, "gb", ["p0", "p1"])
        await seed(c, "gc", ["py", "px"])  # py is the least recently claimed: the named pop takes px all the same
        jobs = [Pop(tenant="co", queue=q, partition=part, group="__QUEUE_MODE__", batch=10, max_partitions=1,
                    auto_ack=True) for q, part in (("ga", None), ("gb", None), ("gc", "px"), ("ga", None),
                                                   ("gb", None))]
        rows = await c.fetch(Q.log_pop_many, *Pop.many_args("co", jobs))
        msgs = [(r["job"], r["txn"]) for r in rows if r["kind"] == "msg"]
        assert sorted(msgs) == [(1, "p0-1"), (2, "p0-1"), (3, "px-1"), (4, "p1-1"), (5, "p1-1")]
        assert {(r["job"], r["partition"]) for r in rows if r["kind"] == "msg"} == {
            (1, "p0"), (2, "p0"), (3, "px"), (4, "p1"), (5, "p1")}


async def test_gathered_pops_of_one_group_run_one_statement_at_a_time(svc: LogService) -> None:
    pool = svc.b.require_pool()
    async with pool.acquire() as a, pool.acquire() as b, pool.acquire() as c:
        await seed(a, "gw2", ["p0", "p1", "p2"])
        async with a.transaction():  # a gathered pop whose transaction is still open (another worker's)
            assert by_job(await a.fetch(Q.log_pop_many, *gathered("gw2", 1, 1)), 2) == [["p0"], ["p1"]]
            second = asyncio.ensure_future(b.fetch(Q.log_pop_many, *gathered("gw2", 1, 1)))
            for _ in range(200):  # it waits on the group's walk lock (lock_keys.POP_WALK), not beside it
                waiting = await c.fetchval("SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' "
                                           "AND NOT granted AND classid = $2", b.get_server_pid(), lock_keys.POP_WALK)
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 1 and not second.done()
            # another group of the same queue, and a named partition of the same group, do not wait
            rows = await asyncio.wait_for(c.fetch(Q.log_pop_many, *gathered("gw2", 1, 1, group="other")), 5)
            got = by_job(rows, 2)
            assert all(len(ps) == 1 for ps in got) and got[0] != got[1]
            named = [Pop(tenant="co", queue="gw2", partition=part, group="__QUEUE_MODE__", batch=10,
                         max_partitions=1, auto_ack=True) for part in ("p2", "p2")]
            rows = await asyncio.wait_for(c.fetch(Q.log_pop_many, *Pop.many_args("co", named)), 5)
            assert by_job(rows, 2) == [["p2"], []]
        rows = await asyncio.wait_for(second, 10)  # after the first committed: nothing it took goes out again
        assert by_job(rows, 2) == [[], []]
        await sql_push(a, "co", "gw2", ["p1-2"], partition="p1")
        assert by_job(await b.fetch(Q.log_pop_many, *gathered("gw2", 1, 1)), 2) == [["p1"], []]


async def mixed(c: asyncpg.Connection, queue: str) -> None:
    """A queue whose partitions hold what each branch of a pop meets, claimed in the order p0 .. p7:
    p0 plain messages; p1 one whose deadline passed; p2 a deleted one; p3 a failed delivery (the group
    keeps per-message state); p4 a lease that ran out; p5 more messages than a batch; p6 nothing new;
    p7 plain messages."""
    parts = [f"p{i}" for i in range(8)]
    await seed(c, queue, parts)
    await sql_push(c, "co", queue, ["p0-2", "p0-3"], partition="p0")
    await sql_push(c, "co", queue, ["p1-2", "p1-3"], partition="p1", deadlines_ms=[None, 1])
    rows = await sql_push(c, "co", queue, ["p2-2", "p2-3"], partition="p2")
    await c.fetch(Q.log_message_delete, "co", rows[0]["partition_id"], "p2-2", "alice", uuid.uuid4())
    failed = await sql_pop(c, "co", queue, partition="p3", batch=1)
    await sql_ack(c, "co", failed, status="failed")
    await sql_push(c, "co", queue, ["p4-2"], partition="p4")
    await sql_pop(c, "co", queue, partition="p4", batch=1)
    await sql_push(c, "co", queue, [f"p5-{i}" for i in range(2, 16)], partition="p5")
    await sql_pop(c, "co", queue, partition="p6", batch=10, auto_ack=True)
    await sql_push(c, "co", queue, ["p7-2"], partition="p7")
    await c.execute(  # the claim order again (the pops above stamped theirs), and p4's lease run out
        "UPDATE queen_cursors cu SET claimed_at = now() - (100 - substr(p.name, 2)::integer) * interval '1 second',"
        " lease_until = CASE WHEN cu.lease_id IS NULL THEN NULL ELSE now() - interval '1 second' END"
        " FROM queen_partitions p WHERE p.tenant = cu.tenant AND p.id = cu.partition_id AND cu.tenant = 'co'"
        " AND p.queue = $1", queue)
    await asyncio.sleep(0.01)  # p1-3's deadline (1 ms) passes


def mixed_jobs(queue: str) -> list[Pop]:
    """Nine one-partition pops of ``queue``: autoAck batch 10 but the third (leased), the sixth (batch 4)
    and the seventh (asks for conflation)."""
    return [Pop(tenant="co", queue=queue, partition=None, group="__QUEUE_MODE__", batch=4 if k == 5 else 10,
                max_partitions=1, auto_ack=k != 2, conflation=k == 6) for k in range(9)]


def answer(rows: list[asyncpg.Record]) -> list[tuple]:
    """What a pop's rows say, with the random lease id reduced to whether there is one."""
    return [(r["kind"], r["partition"], r["seq"], r["txn"], r["attempt"], r["lease_id"] is not None,
             r["deadline_at"] is not None) for r in rows if r["kind"] != "idle"] + \
        [("idle", r["seq"] is not None) for r in rows if r["kind"] == "idle"]


async def state(c: asyncpg.Connection, queue: str) -> list[tuple]:
    """The group's cursors and per-message state by partition name."""
    cursors = await c.fetch(
        "SELECT p.name, cu.acked_seq, cu.lease_id IS NOT NULL AS leased, cu.ready FROM queen_cursors cu"
        " JOIN queen_partitions p ON p.tenant = cu.tenant AND p.id = cu.partition_id"
        " WHERE cu.tenant = 'co' AND p.queue = $1 ORDER BY p.name", queue)
    states = await c.fetch(
        "SELECT p.name, s.seq, s.acked, s.failures FROM queen_msg_state s"
        " JOIN queen_partitions p ON p.tenant = s.tenant AND p.id = s.partition_id"
        " WHERE s.tenant = 'co' AND p.queue = $1 ORDER BY p.name, s.seq", queue)
    return [tuple(r) for r in cursors] + [tuple(r) for r in states]


async def test_gathered_pops_answer_as_the_same_pops_one_at_a_time(svc: LogService) -> None:
    """queen_pop_many serves the common case (autoAck, a clean window) as one set for all its jobs and
    every other job through queen_pop: the answers and what they leave behind are those of the same
    pops made one after the other, where each walks the group's cursors itself."""
    async with svc.b.require_pool().acquire() as c:
        await mixed(c, "gm_set")
        await mixed(c, "gm_one")
        async with c.transaction():
            await c.execute("SET LOCAL track_functions = 'pl'")
            rows = await c.fetch(Q.log_pop_many, *Pop.many_args("co", mixed_jobs("gm_set")))
            calls = await c.fetchval(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = 'queen_pop'")
        together = [answer([r for r in rows if r["job"] == k + 1]) for k in range(9)]
        # seven servable cursors: the same seven pops alone (an eighth alone would take p5's rest; the
        # shared walk hands each cursor once, and the last two jobs wait for a wake, hinted at p2's lease)
        alone = [answer(list(await c.fetch(Q.log_pop, *pop.args()))) for pop in mixed_jobs("gm_one")[:7]]
        assert together[:7] == alone and together[7:] == [[("idle", True)], [("idle", True)]]
        # p0's and p5's (four of its fifteen) went out as one set, the two idle answers with one lease hint;
        # the other five jobs through queen_pop
        assert [{t[1] for t in a if t[0] == "msg"} for a in together] == [
            {"p0"}, {"p1"}, {"p2"}, {"p3"}, {"p4"}, {"p5"}, {"p7"}, set(), set()]
        assert len(together[0]) == 3 and len(together[5]) == 4 and calls == 5
        assert await state(c, "gm_set") == await state(c, "gm_one")


async def test_a_lone_one_partition_pop_takes_its_groups_turn(svc: LogService) -> None:
    """A pop with nothing gathered beside it that claims one partition of no named partition goes through
    queen_pop_many too (its set, its turn); a pop of a named partition still goes alone, without one."""
    pool = svc.b.require_pool()
    async with pool.acquire() as a, pool.acquire() as c:
        await seed(a, "gl1", ["p0", "p1", "p2"])
        async with a.transaction():
            assert by_job(await a.fetch(Q.log_pop_many, *gathered("gl1", 1)), 1) == [["p0"]]
            lone = asyncio.ensure_future(svc._pop_group("co", [Pop(
                tenant="co", queue="gl1", partition=None, group="__QUEUE_MODE__", batch=10, max_partitions=1,
                auto_ack=True)]))
            for _ in range(200):
                waiting = await c.fetchval(  # this test's database only (other tests run beside it)
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = $1"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                    lock_keys.POP_WALK)
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 1 and not lone.done()
            named = await asyncio.wait_for(svc._pop_group("co", [Pop(
                tenant="co", queue="gl1", partition="p2", group="__QUEUE_MODE__", batch=10, max_partitions=1,
                auto_ack=True)]), 5)
            assert [r["txn"] for r in named[0] if r["kind"] == "msg"] == ["p2-1"]
        rows = await asyncio.wait_for(lone, 10)
        assert [r["txn"] for r in rows[0] if r["kind"] == "msg"] == ["p1-1"]
