"""The log's domain operations over the named queries. One round trip per batch on the hot paths:
push = one ``queen_push_checked`` call (plus the metering hook) in one transaction, pop = one
``queen_pop`` call, ack = one ``queen_ack`` call."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from broker import limits, metering
from broker.auth import Principal
from broker.codec import CODEC_RAW
from broker.crypto import NoEncryptionKey
from broker.errors import Unavailable
from broker.ids import uuid7_many
from broker.log import QUEUE_MODE, render
from broker.log.calls import Ack, Pop, Push
from broker.log.coalesce import Coalescer
from broker.log.lanes import Lanes, NotSent
from broker.log.parse import AckItem, PushItem
from broker.log.waiters import Waiters
from broker.metrics import MESSAGES_ACKED, MESSAGES_EXPIRED, MESSAGES_POPPED, MESSAGES_PUSHED, PUSH_LANE_JOBS
from broker.payloads import Sealed, open_, seal
from broker.store.failures import DB_DOWN, retry_conflicts
from broker.store.pool import Conn
from broker.store.queries import Q

if TYPE_CHECKING:
    from broker.context import Broker

log = logging.getLogger("queen.log")

ENCRYPTION_RACE = "QN001"
QUEUE_FULL = "QN002"  # queen_push_guard: a destination queue's maxSize would be exceeded (nothing written)
FLAG_TTL_S = 10.0
LISTEN_SLACK_S = 10.0
# Group commit (broker/log/coalesce.py): pushes of at most COALESCE_PUSH_ITEMS items and acks of at
# most COALESCE_REQUEST_ITEMS share a call; bigger ones go alone. At most COALESCE_INFLIGHT calls of a
# kind run at once per worker, each of at most COALESCE_CALL_ITEMS items. A tenant's pushes run one call
# at a time per worker (other tenants take the second slot): a push call holds its partitions' row locks
# until its commit, so a second call of the same tenant mostly queued behind the first on those rows
# while splitting the waiting requests into smaller calls, costlier per message. One call per tenant
# measured +29 % push msg/s at 2 partitions and no loss elsewhere (docs/performance.md, "Push").
# A 100-item push amortises its statement, but not that wait: 100 items over 101 partitions lock most
# of them, so such pushes sent alone ran one after the other in PostgreSQL, one commit each, and filled
# the pool while the pops waited for a connection (consumers delivered 0.6 of what was pushed, the rest
# piled up: e2e p99 18-28 s). Gathered, up to five share a commit: the bench's batch_100 row pushed as
# much (28-30k msg/s against 26-33k) and delivered all of it within the run (e2e p99 0.38-0.46 s, push
# p99 0.31-0.36 s against 0.51-0.88; docs/performance.md "Push").
COALESCE_REQUEST_ITEMS = 20
COALESCE_PUSH_ITEMS = 100
COALESCE_INFLIGHT = 2
COALESCE_PUSH_PER_TENANT = 1
COALESCE_CALL_ITEMS = 500
COALESCE_POP_JOBS = 32  # pops gathered into one statement (each runs its own queen_pop: a pop is a job)


@dataclass(frozen=True)
class PopRequest:
    queue: str
    partition: str | None
    group: str
    batch: int
    partitions: int
    auto_ack: bool
    sub_mode: str | None
    sub_from: datetime | None
    wait: bool
    timeout_ms: int
    conflation: bool = False  # declared by the consumer; the group's stored policy wins (§2.4)


def _ids(items: list[PushItem]) -> list[uuid.UUID]:
    """Message ids: the client's (a binary push with frames mints them) or fresh ones, minted together
    in item order."""
    fresh = iter(uuid7_many(sum(1 for it in items if it.message_id is None)))
    return [it.message_id if it.message_id is not None else next(fresh) for it in items]


class LogService:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.waiters = Waiters(one=True)  # a notify wakes one long poll; pop passes the baton on
        self._flags: dict[tuple[str, str], tuple[bool, float]] = {}
        self.worker = f"{broker.worker_index}-{uuid.uuid4().hex[:12]}"
        self._listening: dict[tuple[str, str], float] = {}
        self.push_coalescer: Coalescer[str, tuple[Principal, list[PushItem]]] = Coalescer(
            "push", self._push_group, max_inflight=COALESCE_INFLIGHT, max_items=COALESCE_CALL_ITEMS,
            max_per_key=COALESCE_PUSH_PER_TENANT)
        self.ack_coalescer: Coalescer[str, list[AckItem]] = Coalescer(
            "ack", self._ack_group, max_inflight=COALESCE_INFLIGHT, max_items=COALESCE_CALL_ITEMS)
        # Pops gather too: concurrent pops of a tenant (woken long polls, consumers polling at once) go
        # out as one statement, one queen_pop per job in turn (see _pop_group).
        self.pop_coalescer: Coalescer[str, Pop] = Coalescer(
            "pop", self._pop_group, max_inflight=COALESCE_INFLIGHT, max_items=COALESCE_POP_JOBS)
        # With QUEEN_PUSH_LANES=1 a tenant's small pushes go to the worker that owns it (broker/log/lanes.py);
        # the supervisor makes the lanes' directory only then, and only for more than one worker.
        self.lanes = (Lanes(broker.lanes_dir, broker.worker_index, broker.settings.workers, self._submit_push,
                            lambda: broker.ready and not broker.draining)
                      if broker.lanes_dir else None)

    async def start(self) -> None:
        """Once booted: take pushes from the other workers for the tenants this worker owns."""
        if self.lanes is not None:
            try:
                await self.lanes.start()
            except OSError as exc:  # the others find no socket and write this worker's tenants themselves
                log.error("push lane: cannot listen on %s (%s); this worker's tenants are written by whichever "
                          "worker takes their pushes", self.lanes.server.path, exc)

    async def close(self) -> None:
        """At drain: calls in flight finish and answer their waiters; nothing new is coalesced. Pushes
        other workers handed over are answered first; what they send after that they write themselves."""
        if self.lanes is not None:
            await self.lanes.close(float(self.b.settings.drain_timeout_s))
        await self.push_coalescer.close()
        await self.ack_coalescer.close()
        await self.pop_coalescer.close()

    # ---- encryption flags (cached per worker; queen_push_checked catches a stale "plain")

    def forget(self, tenant: str, queue: str) -> None:
        self._flags.pop((tenant, queue), None)

    async def _encrypting(self, conn: Conn, tenant: str, queues: set[str], *, fresh: bool) -> set[str]:
        now = time.monotonic()
        out: set[str] = set()
        missing: list[str] = []
        for q in queues:
            hit = None if fresh else self._flags.get((tenant, q))
            if hit is None or hit[1] < now:
                missing.append(q)
            elif hit[0]:
                out.add(q)
        if missing:
            found = {r["name"]: r["encryption_enabled"] for r in await conn.fetch(Q.log_queue_flags, tenant, missing)}
            for q in missing:
                enc = bool(found.get(q, False))
                self._flags[(tenant, q)] = (enc, now + FLAG_TTL_S)
                if enc:
                    out.add(q)
        return out

    def _seal(self, tenant: str, items: list[PushItem], encrypting: set[str]) -> list[Sealed]:
        try:
            return [
                seal(self.b.codec, self.b.keyring, tenant, it.queue, it.data, encrypt=it.queue in encrypting)
                for it in items
            ]
        except NoEncryptionKey:
            raise Unavailable(
                "encryption_unavailable",
                "the destination queue encrypts at rest but this broker has no QUEEN_ENCRYPTION_KEYS",
                code="unavailable",
            ) from None

    # ---- push

    async def push(self, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        if not items:
            return []
        self.b.require_pool()
        await limits.admit(self.b, principal, "push", len(items))
        if len(items) <= COALESCE_PUSH_ITEMS:
            rows = await self._push_small(principal, items)
        else:
            rows = await self._push_alone(principal, items)
        return [render.push_result(i, it.queue, r["txn"], r) for i, (it, r) in enumerate(zip(items, rows, strict=True))]

    async def _push_small(self, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        """A push that shares a call with the tenant's other small pushes: on the worker that owns the
        tenant (handed over when that is another one, for at most COALESCE_REQUEST_ITEMS items), or here
        when the owner did not take it."""
        owner = (self.lanes.owner(principal.tenant)
                 if self.lanes is not None and len(items) <= COALESCE_REQUEST_ITEMS else None)
        if owner is not None:
            try:
                return await owner.push(principal, items)
            except NotSent as exc:
                PUSH_LANE_JOBS.labels("fallback").inc()
                log.debug("push lane: %s; writing here", exc)
        return await self._submit_push(principal, items)

    async def _submit_push(self, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self.push_coalescer.submit(principal.tenant, (principal, items), len(items))
        return rows

    async def _push_alone(self, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        """One request's push in one statement (its own transaction), run again when the database broke
        a deadlock with it (``retry_conflicts``: nothing of it committed)."""
        return await retry_conflicts(lambda: self._push_once(principal, items))

    async def _push_once(self, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        """``_push_alone``'s one attempt; re-sealed and retried when a queue's encryption setting changed
        under the cached view. The items of a queue whose maxSize the push would exceed answer ``failed``
        (``queue_full``) and the rest is pushed again without them (a second statement only in that
        case)."""
        pool = self.b.require_pool()
        tenant = principal.tenant
        ids = _ids(items)
        full: dict[str, dict[str, Any]] = {}
        todo, todo_ids = items, ids
        fresh = False
        for _ in range(3 + len({it.queue for it in items})):
            queues = {it.queue for it in todo}
            async with pool.acquire() as conn:
                encrypting = await self._encrypting(conn, tenant, queues, fresh=fresh)
                sealed = self._seal(tenant, todo, encrypting)
                try:
                    # One statement, its own transaction: push + metering of what was queued (the SQL side
                    # of metering.record) - no BEGIN/COMMIT round trips.
                    rows = await self.write(conn, tenant, todo, sealed, todo_ids, queues - encrypting,
                                            [principal.sub] * len(todo), meter_period_s=metering.period_seconds())
                except asyncpg.PostgresError as exc:
                    state = getattr(exc, "sqlstate", None)
                    if state == ENCRYPTION_RACE:
                        for q in queues:
                            self.forget(tenant, q)
                        fresh = True
                        continue
                    if state == QUEUE_FULL:
                        full.update(queues_full(exc))
                        kept = [(it, mid) for it, mid in zip(items, ids, strict=True) if it.queue not in full]
                        todo, todo_ids = [it for it, _ in kept], [mid for _, mid in kept]
                        if todo:
                            continue
                        rows = []
                    else:
                        raise
            MESSAGES_PUSHED.labels("push").inc(sum(1 for r in rows if r["status"] == "queued"))
            if not full:
                return rows
            done = iter(rows)
            return [refused_full(it, mid, full[it.queue]) if it.queue in full else next(done)
                    for it, mid in zip(items, ids, strict=True)]
        raise Unavailable("queue_reconfigured", "the queue's encryption setting kept changing during the push; retry")

    async def _push_group(self, tenant: str, jobs: list[tuple[Principal, list[PushItem]]]) -> list[Any]:
        """The push coalescer's call: every job's items in ONE queen_push_edge statement (one transaction,
        one commit), rows split back per job. Items keep their order (job by job), so dedupe inside the
        call works across requests exactly as inside one request: a later item with a txn already
        present in its partition is a duplicate of the earlier one. When the shared statement fails for
        a reason that may be one job's (anything but the database being unreachable), nothing of it
        committed and every job is retried alone, so each request gets its own answer."""
        if len(jobs) == 1:
            return [await self._push_alone(*jobs[0])]
        items = [it for _, its in jobs for it in its]
        subs = [p.sub for p, its in jobs for _ in its]
        queues = {it.queue for it in items}
        ids = _ids(items)
        try:
            async with self.b.require_pool().acquire() as conn:
                encrypting = await self._encrypting(conn, tenant, queues, fresh=False)
                sealed = self._seal(tenant, items, encrypting)
                rows = await self.write(conn, tenant, items, sealed, ids, queues - encrypting, subs,
                                        meter_period_s=metering.period_seconds())
        except DB_DOWN:
            raise
        except Exception as exc:
            log.debug("coalesced push of %d jobs failed (%s); each job alone", len(jobs), exc)
            return list(await asyncio.gather(*[self._push_alone(p, its) for p, its in jobs], return_exceptions=True))
        MESSAGES_PUSHED.labels("push").inc(sum(1 for r in rows if r["status"] == "queued"))
        out: list[Any] = []
        at = 0
        for _, its in jobs:
            out.append(rows[at:at + len(its)])
            at += len(its)
        return out

    async def write(
        self,
        conn: Conn,
        tenant: str,
        items: list[PushItem],
        sealed: list[Sealed],
        ids: list[uuid.UUID],
        plain_queues: set[str],
        subs: Sequence[str | None],
        *,
        meter_period_s: int | None = None,
    ) -> list[dict[str, Any]]:
        """Run queen_push for ``items`` on ``conn`` (inside the caller's transaction). Rows in item
        order: status, message_id, partition_id, seq, txn. With ``meter_period_s`` the same statement
        also meters the queued messages (queen_push_edge): for a push that is its own transaction."""
        txns = [it.txn or str(mid) for it, mid in zip(items, ids, strict=True)]
        push = Push(
            tenant=tenant, plain=sorted(plain_queues), queues=[it.queue for it in items],
            partitions=[it.partition for it in items], ids=ids, txns=txns, traces=[it.trace for it in items],
            payloads=[s.payload for s in sealed], codecs=[s.codec for s in sealed],
            key_ids=[s.key_id for s in sealed], subs=subs, deadline_ms=[it.deadline_ms for it in items],
            meter_period_s=meter_period_s,
        )
        rows = await conn.fetch(push.query, *push.args())
        return [
            {"status": r["status"], "message_id": r["message_id"], "partition_id": r["partition_id"], "seq": r["seq"], "txn": t}
            for r, t in zip(rows, txns, strict=True)
        ]

    async def push_in_tx(self, conn: Conn, principal: Principal, items: list[PushItem]) -> list[dict[str, Any]]:
        """Push inside an open transaction (the transaction route): flags are read fresh on ``conn``."""
        queues = {it.queue for it in items}
        encrypting = await self._encrypting(conn, principal.tenant, queues, fresh=True)
        sealed = self._seal(principal.tenant, items, encrypting)
        return await self.write(conn, principal.tenant, items, sealed, _ids(items), queues - encrypting,
                                [principal.sub] * len(items))

    # ---- pop

    async def pop(self, principal: Principal, req: PopRequest, queues: list[str] | None = None) -> dict[str, Any] | None:
        """Pop from ``req.queue`` (or the first of ``queues`` that has messages). With ``wait`` the call
        holds until a message arrives, ``timeout_ms`` passes or the worker drains."""
        pool = self.b.require_pool()
        targets = queues if queues is not None else [req.queue]
        keys = [(principal.tenant, q) for q in targets]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout_ms / 1000
        woken_at: float | None = None  # when a notify woke the previous wait, for queen_pop_wake_seconds
        echo: dict[str, bool] = {}  # the conflation echo of the queues looked at (§2.4)
        ev: asyncio.Event | None = None
        cls = (req.group, req.partition)  # who else could take what this poll takes (broker/log/waiters.py)
        baton = False  # a notify woke this poll and its answer may have left messages for another
        try:
            while True:
                ev = self.waiters.register(keys, cls) if req.wait else None
                try:
                    hint_s: float | None = None
                    for q in targets:
                        answer, hint = await self._pop_once(principal, req, q, echo)
                        if answer is not None:
                            self.waiters.observe_wake(woken_at)
                            baton = woken_at is not None and self._may_have_left_some(req, answer)
                            return answer
                        if hint is not None:
                            hint_s = hint if hint_s is None else min(hint_s, hint)
                    if ev is None or self.b.draining:
                        return self.empty_answer(req, echo)
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        return self.empty_answer(req, echo)
                    if await self._ensure_listening(pool, principal.tenant, targets, remaining):
                        continue  # registered just now: look once more before sleeping (closes the race)
                    if hint_s is not None:
                        remaining = min(remaining, max(hint_s, 0.005))
                    try:
                        await asyncio.wait_for(ev.wait(), remaining)
                    except TimeoutError:
                        pass
                    if self.b.draining:
                        return self.empty_answer(req, echo)
                finally:
                    if ev is not None:
                        woken_at = self.waiters.unregister(keys, ev)
        finally:
            # The baton (broker/log/waiters.py): a notify woke only this poll. Hand it on when the poll
            # leaves without having popped after it (cancelled, drained, failed: its event is set), or
            # leaves with an answer after a wake-up that may not have taken everything there is.
            if ev is not None and (baton or ev.is_set()):
                self.waiters.pass_on(keys, cls)

    @staticmethod
    def _may_have_left_some(req: PopRequest, answer: dict[str, Any]) -> bool:
        """Whether more messages may be ready after this answer: it filled its batch, or claimed as many
        partitions as it was allowed (others may hold messages). Fewer messages than the batch from
        fewer partitions than allowed means the pop's walk found no other partition to serve."""
        return len(answer["messages"]) >= req.batch or answer["partitionsClaimed"] >= max(req.partitions, 1)

    @staticmethod
    def empty_answer(req: PopRequest, echo: dict[str, bool]) -> dict[str, Any] | None:
        """Nothing to deliver: no body (204), except for a pop that asked for conflation, whose every
        answer carries the echo (the client refuses one without it)."""
        if not req.conflation:
            return None
        return {"success": True, "messages": [], **(echo or {"conflation": True})}

    @staticmethod
    def _echo(req: PopRequest, stored: bool | None) -> dict[str, bool]:
        """``conflation: true`` when the group conflates; ``conflationConflict: true`` when this consumer
        asked for it and the group's stored policy says no (stored wins). A group not registered yet
        gets what was asked."""
        if stored is None:
            stored = req.conflation
        if stored:
            return {"conflation": True}
        return {"conflationConflict": True} if req.conflation else {}

    async def _ensure_listening(self, pool: asyncpg.Pool, tenant: str, queues: list[str], remaining: float) -> bool:
        """Make sure pushes to these queues NOTIFY for at least ``remaining`` seconds (queen_listeners);
        True if a registration had to be written."""
        now = time.monotonic()
        need = [q for q in queues if self._listening.get((tenant, q), 0.0) < now + remaining]
        if not need:
            return False
        hold = remaining + LISTEN_SLACK_S
        async with pool.acquire() as conn:
            for q in need:
                await conn.execute(Q.log_listen, tenant, q, self.worker, int(hold * 1000))
                self._listening[(tenant, q)] = now + hold - 1.0
        return True

    async def _pop_once(self, principal: Principal, req: PopRequest, queue: str,
                        echo: dict[str, bool]) -> tuple[dict[str, Any] | None, float | None]:
        tenant = principal.tenant
        pop = Pop(tenant=tenant, queue=queue, partition=req.partition, group=req.group, batch=req.batch,
                  max_partitions=req.partitions, auto_ack=req.auto_ack, sub_mode=req.sub_mode,
                  sub_from=req.sub_from, conflation=req.conflation)
        if req.batch <= COALESCE_CALL_ITEMS:
            rows = await self.pop_coalescer.submit(tenant, pop)
        else:  # a pop that may carry thousands of messages goes alone: it would hold the others' answers
            rows = await self._pop_alone(pop)
        stored: bool | None = None
        msgs: list[dict[str, Any]] = []
        leased: dict[uuid.UUID, str] = {}  # partitions this pop leased, by id
        lease: uuid.UUID | None = None
        lease_until = None
        hint: float | None = None
        expired = 0
        # Per message only what differs between messages: the lease (one per pop), the partition's id
        # as text and the codec/keyring objects are looked up once, not per message (repeated
        # str()/attribute work was most of a large pop's rendering).
        # The same holds for created_at across messages pushed by one statement, or fired by one sweep
        # (one transaction, one now()): formatted only when it changes.
        lease_s = ""
        pids: dict[uuid.UUID, str] = {}
        codec, keyring, ts, data_fields = self.b.codec, self.b.keyring, render.ts, render.data_fields
        group = req.group
        created: Any = None
        created_s: str | None = None
        for r in rows:
            kind = r["kind"]
            if kind == "msg":
                if r["created_at"] != created:
                    created = r["created_at"]
                    created_s = ts(created)
                if lease is None and r["lease_id"] is not None:
                    lease = r["lease_id"]
                    lease_s = str(lease)
                    lease_until = r["lease_until"]
                ppid = r["partition_id"]
                pid = pids.get(ppid)
                if pid is None:
                    pid = pids[ppid] = str(ppid)
                    leased[ppid] = r["partition"]
                key_id = r["key_id"]
                payload = r["payload"]
                if key_id is None and r["codec"] == CODEC_RAW:
                    data: dict[str, Any] = {"data": orjson.Fragment(payload)}  # stored as sent: embedded as is
                else:
                    data = data_fields(open_(codec, keyring, tenant, queue, Sealed(payload, r["codec"], key_id)))
                trace = r["trace_id"]
                msgs.append({
                    "id": str(r["id"]),
                    "transactionId": r["txn"],
                    "traceId": str(trace) if trace else None,
                    **data,
                    "producerSub": r["producer_sub"],
                    "createdAt": created_s,
                    # the absolute deadline (database clock) for the consumer's last check, null without one
                    "deadlineAt": ts(r["deadline_at"]),
                    "queue": queue,
                    "partitionId": pid,
                    "partition": r["partition"],
                    "leaseId": lease_s,
                    "consumerGroup": group,
                    "deliveryAttempt": r["attempt"],
                    "offset": r["seq"],
                })
            elif kind == "expired":
                expired += 1
            elif kind == "conflation":
                stored = bool(r["seq"])
            elif kind == "idle" and r["seq"] is not None:
                hint = max(0.0, r["seq"] / 1000)
        if expired:
            MESSAGES_EXPIRED.inc(expired)
        policy = self._echo(req, stored) if req.conflation or stored else {}
        echo.update(policy)
        if not msgs:
            return None, hint
        MESSAGES_POPPED.inc(len(msgs))
        first = msgs[0]
        return {
            "success": True,
            "queue": queue,
            "partition": first["partition"],
            "partitionId": first["partitionId"],
            "leaseId": lease_s,
            "leaseExpiresAt": render.ts(lease_until) if lease else None,
            "consumerGroup": req.group,
            "partitionsClaimed": len(leased),
            "messages": msgs,
            **policy,
        }, None

    async def _pop_alone(self, pop: Pop) -> list[asyncpg.Record]:
        """One pop in one statement; run again when the database broke a deadlock with it (a gathered
        pop creating a new partition's cursors in several calls of one transaction can meet a pop or a
        push creating the same ones in another order): nothing of it committed."""

        async def once() -> list[asyncpg.Record]:
            async with self.b.require_pool().acquire() as conn:
                return list(await conn.fetch(Q.log_pop, *pop.args()))

        return await retry_conflicts(once)

    async def _pop_group(self, tenant: str, jobs: list[Pop]) -> list[Any]:
        """The pop coalescer's call: every job's ``queen_pop`` in ONE statement (``log_pop_many``: one
        round trip, one transaction, one commit), rows split back per job. The calls run one after the
        other inside the statement, and each of the function's statements reads what the earlier calls
        wrote (a volatile function's fresh snapshot), so a partition one job claimed or consumed is not
        servable to the next: each job gets only its own partitions and its own lease, as if the pops had
        run one after the other. Jobs of one queue and group that claim one partition each share one walk
        of the group's cursors (``queen_pop_many``), and the autoAck ones among them with an ordinary window
        are served as one set; such a pop alone goes the same way, to that set and to the group's turn
        across workers. A failure that may be one job's (anything but the database being unreachable)
        retries every job alone."""
        if len(jobs) == 1 and (jobs[0].partition is not None or jobs[0].max_partitions > 1):
            return [await self._pop_alone(jobs[0])]
        try:
            async with self.b.require_pool().acquire() as conn:
                rows = await conn.fetch(Q.log_pop_many, *Pop.many_args(tenant, jobs))
        except DB_DOWN:
            raise
        except Exception as exc:
            log.debug("gathered pop of %d jobs failed (%s); each job alone", len(jobs), exc)
            return list(await asyncio.gather(*[self._pop_alone(j) for j in jobs], return_exceptions=True))
        out: list[list[asyncpg.Record]] = [[] for _ in jobs]
        for r in rows:  # in statement order: job by job, each job's rows in its own order
            out[r["job"] - 1].append(r)
        return out

    # ---- ack

    async def ack(self, principal: Principal, items: list[AckItem], conn: Conn | None = None) -> list[dict[str, Any]]:
        """Settle acknowledgements; one result per item, in order (refusals are per item)."""
        if not items:
            return []
        ok_items = [(i, it) for i, it in enumerate(items) if not it.lease_malformed]
        verdicts: dict[int, tuple[bool, str | None, bool]] = {
            i: (False, "Invalid or expired lease", False) for i, it in enumerate(items) if it.lease_malformed
        }
        if ok_items:
            batch = [it for _, it in ok_items]
            if conn is not None:
                rows = await self._ack_rows(conn, principal.tenant, batch)
            elif len(batch) <= COALESCE_REQUEST_ITEMS:
                rows = await self.ack_coalescer.submit(principal.tenant, batch, len(batch))
            else:
                rows = await self._ack_alone(principal.tenant, batch)
            for (i, _), r in zip(ok_items, rows, strict=True):
                verdicts[i] = r
        out = []
        acked: dict[str, int] = {}
        for i, it in enumerate(items):
            success, error, dlq = verdicts[i]
            if success:
                acked[it.status] = acked.get(it.status, 0) + 1
            out.append({
                "index": i,
                "transactionId": it.txn,
                "partitionId": str(it.partition_id),
                "status": it.status,
                "success": success,
                "error": error,
                "dlq": dlq,
            })
        for status, n in acked.items():
            MESSAGES_ACKED.labels(status).inc(n)
        return out

    @staticmethod
    async def _ack_rows(conn: Conn, tenant: str, batch: list[AckItem]) -> list[tuple[bool, str | None, bool]]:
        rows = await conn.fetch(Q.log_ack, *Ack.of(tenant, batch).args())
        return [(r["success"], r["error"], r["dead_lettered"]) for r in rows]

    async def _ack_alone(self, tenant: str, batch: list[AckItem]) -> list[tuple[bool, str | None, bool]]:
        async with self.b.require_pool().acquire() as c:
            return await self._ack_rows(c, tenant, batch)

    async def _ack_group(self, tenant: str, jobs: list[list[AckItem]]) -> list[Any]:
        """The ack coalescer's call: every job's acknowledgements in ONE queen_ack statement (one
        transaction), verdicts split back per job. queen_ack judges every item against the state at the
        start of the call, as it does inside one request. A failure that may be one job's (anything but
        the database being unreachable) retries every job alone."""
        if len(jobs) == 1:
            return [await self._ack_alone(tenant, jobs[0])]
        try:
            rows = await self._ack_alone(tenant, [a for job in jobs for a in job])
        except DB_DOWN:
            raise
        except Exception as exc:
            log.debug("coalesced ack of %d jobs failed (%s); each job alone", len(jobs), exc)
            return list(await asyncio.gather(*[self._ack_alone(tenant, job) for job in jobs], return_exceptions=True))
        out: list[Any] = []
        at = 0
        for job in jobs:
            out.append(rows[at:at + len(job)])
            at += len(job)
        return out

    # ---- leases

    async def extend(self, principal: Principal, lease_id: str) -> dict[str, Any]:
        lease = None
        try:
            lease = uuid.UUID(lease_id)
        except ValueError:
            pass
        rows = []
        if lease is not None:
            async with self.b.require_pool().acquire() as conn:
                rows = await conn.fetch(Q.log_lease_extend, principal.tenant, lease, self.b.settings.lease_extend_s)
        if not rows:
            return {"leaseId": lease_id, "success": False, "renewed": 0, "error": "Invalid or expired lease",
                    "newExpiresAt": None, "expiresAt": None, "lease_expires_at": None}
        until = render.ts(max(r["lease_until"] for r in rows))
        return {"leaseId": lease_id, "success": True, "renewed": len(rows), "newExpiresAt": until, "expiresAt": until,
                "lease_expires_at": until}


def queues_full(exc: asyncpg.PostgresError) -> dict[str, dict[str, Any]]:
    """The full queues a QN002 names (queen_push_guard's DETAIL: [{queue, maxSize, backlog, items}])."""
    return {f["queue"]: f for f in orjson.loads(getattr(exc, "detail", None) or "[]")}


def queue_full_error(f: dict[str, Any]) -> str:
    return (f"queue_full: queue {f['queue']!r} holds {f['backlog']} unconsumed messages of its maxSize "
            f"{f['maxSize']}; this push of {f['items']} would exceed it")


def refused_full(it: PushItem, mid: uuid.UUID, f: dict[str, Any]) -> dict[str, Any]:
    """A push item refused because its queue is full: status ``failed`` with the reason (the official
    client raises with ``error``, or hands the item to its error callback)."""
    return {"status": "failed", "error": queue_full_error(f), "reason": "queue_full", "maxSize": f["maxSize"],
            "message_id": None, "partition_id": None, "seq": None, "txn": it.txn or str(mid)}


def default_group(group: str | None) -> str:
    return group or QUEUE_MODE
