"""The sweeper: fires due timers into the message log (docs/decisions.md §3).

``SweeperConfig`` (from Settings), ``Sweeper.run()`` (the loop ``broker.services`` starts in every worker
unless ``QUEEN_SWEEPER_ENABLED=0``) and ``run_once()`` (one cycle, testable alone).

A cycle runs on the sweeper's own connection, and its transaction is what holds the rows it fires:
- Usually ONE statement, its own transaction (``queen_timers_sweep``): take the due rows and, when every
  one is ready (its payload was judged JSON or sealed at schedule, and no test fault is injected), fire
  them inside the database; no payload leaves it.
- When rows need packing, that statement takes nothing and answers 'unready'. The cycle (and the ones
  after it, until one finds nothing to pack; every cycle while the test hooks' faults are on) then runs
  inside a transaction: take (``queen_timers_sweep`` with ``p_in_tx``), pack in Python (decompress the
  client's zstd, check the payload is JSON, seal it in the log's stored format; a payload sealed at
  schedule moves untouched), fire (``queen_timers_fire``: delete exactly the rows taken that are
  unchanged, push exactly those through ``queen_push`` with the timer's message id, txn and producer
  sub, back off the failed ones), commit.

Recurring timers (``broker.timers.recur``, docs/concepts/recurring-schedules.md): a recurring row is
never ready, so a cycle that takes one runs the steps above in a transaction; between take and fire
``pack`` computes each such row's next occurrence from its schedule and the database's clock read by
the take (``db_now``), applying its missed policy, and the fire (``queen_timers_fire`` with its recurring
rows: query ``timers_fire_recur``) pushes the occurrence and moves the row in the same statement. The
worker CPU this costs is ``queen_timers_recur_next_seconds_total``. A cycle with none is unchanged.

Why a transaction and not a claim stamp: a take reads rows and writes nothing, so a burst costs one
delete per timer; a crash rolls back and the rows are due again at once; a cancel or reschedule meeting
a fire waits for its commit and then finds the row gone (``absent``) or, after a rollback, acts on it.
A hung sweeper's transaction is ended by the database after ``QUEEN_SWEEPER_LEASE_MS`` idle (at least
``IDLE_FLOOR_MS``). Rows that must be held while nothing happens (an injected stall) are leased instead
(``queen_timers_lease``: a token and ``claimed_until``); while leased a cancel answers ``too_late``, and
they are fired by token in autocommit. The sweeper's session commits without waiting for the WAL flush
(``timers_sweeper_session`` says why that loses nothing).

Order without a leader: takes are partition-exclusive (``queen_timers_take``), so each cycle fires whole
partitions' due prefixes in deliverAt order, one sweeper per partition at a time, different partitions
in parallel; tenants get equal slices of a batch, walked from a rotating cursor, so one tenant's burst
cannot starve another. A re-fire after a lost commit meets queen_push's (partition, txn) idempotency and
is a duplicate, never a second message.

Wake-ups: sleep until the earliest due instant the database reported, counted from the cycle's start,
clamped to [QUEEN_SWEEPER_MIN_SLEEP_MS, QUEEN_SWEEPER_MAX_SLEEP_MS]; a full batch (or rows left due)
takes again at once; due rows all in partitions other sweepers hold sleep ``BLOCKED_SLEEP_MS``. A timer
due sooner than the max sleep wakes a sweeper early: in process (``expect``) when its schedule
committed alone on a worker whose sweeper is awake, otherwise by NOTIFY ``queen_timers`` (payload: the
delay in ms), which every sweeper hears.

Failures: a permanent one (not JSON, not zstd, a row the database refuses, an injected permanent fault)
spends an attempt; a transient one (``broker.store.failures.failure_class``) spends none. Both back off
exponentially (``QUEEN_SWEEPER_BACKOFF_BASE_MS`` doubling up to ``..._CAP_MS``), leaving the row
cancellable; after ``QUEEN_SWEEPER_MAX_ATTEMPTS`` it moves to its queue's DLQ. A fire the database refuses
is undone inside the function (the transaction and its partition locks stay), and the rows at fault are
found one at a time in the same transaction.

Only an operator stops the fire (``POST /api/v1/admin/timers/sweeper {"paused": true}``); no limit does.
Drain (SIGTERM): stop taking, let a cycle in flight commit, interrupt a stall, hand back leases still
held so another sweeper fires those rows at once.

Gauges: ``queen_timers_pending`` sums the per-tenant counters the triggers keep (``queen_usage_gauges``),
read every ``PENDING_EVERY_S``; ``queen_sweeper_fired`` is this worker's own fired count.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from broker import metering
from broker.codec import CODEC_RAW, Codec, CodecError
from broker.config import Settings
from broker.ids import uuid7_text
from broker.metrics import (
    MESSAGES_PUSHED,
    SWEEP_CYCLE,
    SWEEP_SLEEP,
    SWEEPER_FIRED,
    TIMERS_DLQ,
    TIMERS_FIRE_FAILED,
    TIMERS_FIRE_LAG,
    TIMERS_FIRED,
    TIMERS_PENDING,
    TIMERS_RECUR_ADVANCED,
    TIMERS_RECUR_NEXT,
)
from broker.payloads import NotJson, client_json
from broker.store.failures import failure_class
from broker.store.pool import connect
from broker.store.queries import Q
from broker.timers import recur
from broker.timers.calls import Retry, TimersFire, TimersLease, TimersRecurRows, TimersSweep, TimersTake

log = logging.getLogger("queen.sweeper")

CHANNEL = "queen_timers"
BLOCKED_SLEEP_MS = 50
PENDING_EVERY_S = 5.0
STUCK_CYCLE_S = 0.25  # a cycle in flight longer than this cannot be relied on to see a new timer soon
IDLE_FLOOR_MS = 1_000  # a fire transaction idle this long is hung whatever the lease (never a slow pack)


@dataclass(frozen=True)
class SweeperConfig:
    """The sweeper's settings; its defaults are ``Settings``' (the one table of defaults)."""

    lease_ms: int = Settings.sweeper_lease_ms
    min_sleep_ms: int = Settings.sweeper_min_sleep_ms
    max_sleep_ms: int = Settings.sweeper_max_sleep_ms
    batch: int = Settings.sweeper_batch
    tenant_slice: int = Settings.sweeper_tenant_slice
    max_attempts: int = Settings.sweeper_max_attempts
    backoff_base_ms: int = Settings.sweeper_backoff_base_ms
    backoff_cap_ms: int = Settings.sweeper_backoff_cap_ms
    faults: bool = Settings.test_hooks  # honour the test hooks' injected faults
    peers: int = 1  # sweepers sharing the database (this broker's workers): a cycle takes its share of a small due set

    @classmethod
    def from_settings(cls, s: Settings) -> SweeperConfig:
        return cls(
            lease_ms=s.sweeper_lease_ms,
            min_sleep_ms=s.sweeper_min_sleep_ms,
            max_sleep_ms=s.sweeper_max_sleep_ms,
            batch=s.sweeper_batch,
            tenant_slice=s.sweeper_tenant_slice,
            max_attempts=s.sweeper_max_attempts,
            backoff_base_ms=s.sweeper_backoff_base_ms,
            backoff_cap_ms=s.sweeper_backoff_cap_ms,
            faults=s.test_hooks,
            peers=s.workers,
        )

    @property
    def retry(self) -> Retry:
        return Retry(max_attempts=self.max_attempts, backoff_base_ms=self.backoff_base_ms,
                     backoff_cap_ms=self.backoff_cap_ms)

    def sweep(self, cursor: str | None, *, in_tx: bool) -> TimersSweep:
        """One cycle's ``queen_timers_sweep`` call; faults are honoured only inside a transaction."""
        take = TimersTake(batch=self.batch, cursor=cursor, faults=self.faults and in_tx, slice_cap=self.tenant_slice)
        return TimersSweep(take=take, retry=self.retry, in_tx=in_tx)

    def clamp_sleep_ms(self, next_due_ms: int | None) -> int:
        if next_due_ms is None:
            return self.max_sleep_ms
        return max(self.min_sleep_ms, min(self.max_sleep_ms, next_due_ms))


@dataclass
class CycleResult:
    paused: bool = False
    taken: int = 0  # rows the cycle took (fired, failed, or found changed and skipped)
    fired: int = 0
    duplicates: int = 0
    backoff: int = 0
    dlq: int = 0
    next_due_ms: int | None = None
    lags: list[float] = field(default_factory=list)
    began_at: float = 0.0  # event-loop clock when the cycle's transaction began (next_due_ms counts from it)

    def more_due(self, batch: int) -> bool:
        """Take again at once: the batch was full, or rows were left due by the tenant slices."""
        if self.taken >= batch:
            return True
        return self.taken > 0 and self.next_due_ms is not None and self.next_due_ms <= 0


class _FireError(Exception):
    """A fire of taken rows that the database refused (its work undone, the transaction still open)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class _Stopped(Exception):
    """The sweeper is draining: abandon the cycle; its leases are handed back by ``stop``."""


@dataclass
class _Packed:
    g_tenants: list[str] = field(default_factory=list)
    g_queues: list[str] = field(default_factory=list)
    g_keys: list[str] = field(default_factory=list)
    g_ids: list[uuid.UUID | None] = field(default_factory=list)
    g_tids: list[Any] = field(default_factory=list)  # ctids of rows taken in this transaction
    g_payloads: list[bytes | None] = field(default_factory=list)
    g_codecs: list[int] = field(default_factory=list)
    f_tenants: list[str] = field(default_factory=list)
    f_queues: list[str] = field(default_factory=list)
    f_keys: list[str] = field(default_factory=list)
    f_ids: list[uuid.UUID | None] = field(default_factory=list)
    f_errors: list[str] = field(default_factory=list)
    f_costs: list[int] = field(default_factory=list)
    f_wrap: list[bool] = field(default_factory=list)
    # recurring rows (broker/timers/recur.py): moved to r_next, their occurrence pushed when r_fire
    r_tenants: list[str] = field(default_factory=list)
    r_queues: list[str] = field(default_factory=list)
    r_keys: list[str] = field(default_factory=list)
    r_ids: list[uuid.UUID | None] = field(default_factory=list)
    r_payloads: list[bytes | None] = field(default_factory=list)
    r_codecs: list[int] = field(default_factory=list)
    r_fire: list[bool] = field(default_factory=list)
    r_next: list[Any] = field(default_factory=list)
    r_next_ids: list[str] = field(default_factory=list)
    r_next_txns: list[str] = field(default_factory=list)

    def recurring(self, row: Any, payload: bytes | None, codec: int, step: recur.Advance, next_id: str,
                  next_txn: str) -> None:
        self.r_tenants.append(row["tenant"])
        self.r_queues.append(row["queue"])
        self.r_keys.append(row["timer_key"])
        self.r_ids.append(row.get("message_id"))
        self.r_payloads.append(payload)
        self.r_codecs.append(codec)
        self.r_fire.append(step.fire)
        self.r_next.append(step.next_at)
        self.r_next_ids.append(next_id)
        self.r_next_txns.append(next_txn)

    def recurring_row(self, i: int) -> dict[str, Any]:
        return {"tenant": self.r_tenants[i], "queue": self.r_queues[i], "timer_key": self.r_keys[i],
                "message_id": self.r_ids[i]}

    def take_recurring(self, i: int, into: _Packed) -> None:
        """Copy recurring row ``i`` into ``into`` (the one-at-a-time fallback)."""
        for name in ("r_tenants", "r_queues", "r_keys", "r_ids", "r_payloads", "r_codecs", "r_fire", "r_next",
                     "r_next_ids", "r_next_txns"):
            getattr(into, name).append(getattr(self, name)[i])

    def fail(self, row: Any, error: str, klass: str, *, bad_payload: bool = False) -> None:
        """``bad_payload``: the payload itself is the failure; the DLQ keeps it inside a JSON envelope."""
        self.f_tenants.append(row["tenant"])
        self.f_queues.append(row["queue"])
        self.f_keys.append(row["timer_key"])
        self.f_ids.append(row.get("message_id"))
        self.f_errors.append(error)
        self.f_costs.append(0 if klass == "transient" else 1)
        self.f_wrap.append(bad_payload)
        TIMERS_FIRE_FAILED.labels(klass).inc()

    def call(self, token: uuid.UUID | None, retry: Retry) -> TimersFire:
        """The fire of these rows: taken in the open transaction (no token), or leased under ``token``
        (found by key: their message ids and ctids are not sent)."""
        taken = token is None
        return TimersFire(
            token=token, g_tenants=self.g_tenants, g_queues=self.g_queues, g_keys=self.g_keys,
            g_ids=self.g_ids if taken else None, g_tids=self.g_tids if taken else None, g_payloads=self.g_payloads,
            g_codecs=self.g_codecs, f_tenants=self.f_tenants, f_queues=self.f_queues, f_keys=self.f_keys,
            f_ids=self.f_ids if taken else None, f_errors=self.f_errors, f_costs=self.f_costs, f_wrap=self.f_wrap,
            retry=retry, recur=self._recur_rows(),
        )

    def _recur_rows(self) -> TimersRecurRows | None:
        if not self.r_tenants:
            return None  # a one-shot cycle's fire is the call it always was
        return TimersRecurRows(
            tenants=self.r_tenants, queues=self.r_queues, keys=self.r_keys, ids=self.r_ids, payloads=self.r_payloads,
            codecs=self.r_codecs, fire=self.r_fire, next_at=self.r_next, next_ids=self.r_next_ids,
            next_txns=self.r_next_txns, period_s=metering.period_seconds(),
        )

    def good_row(self, i: int) -> dict[str, Any]:
        return {"tenant": self.g_tenants[i], "queue": self.g_queues[i], "timer_key": self.g_keys[i],
                "message_id": self.g_ids[i], "tid": self.g_tids[i]}

    def good(self, row: Any, payload: bytes | None, codec: int) -> None:
        self.g_tenants.append(row["tenant"])
        self.g_queues.append(row["queue"])
        self.g_keys.append(row["timer_key"])
        self.g_ids.append(row.get("message_id"))
        self.g_tids.append(row.get("tid"))
        self.g_payloads.append(payload)
        self.g_codecs.append(codec)


class Sweeper:
    def __init__(self, dsn: str, config: SweeperConfig, codec: Codec, *, name: str | None = None) -> None:
        self.dsn = dsn
        self.config = config
        self.codec = codec
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.conn: asyncpg.Connection | None = None
        self.cursor: str | None = None
        self.leases: set[uuid.UUID] = set()  # tokens of rows this sweeper leased and has not fired yet
        self.fired = 0  # timers this sweeper fired (the per-process gauge queen_sweeper_fired)
        self._wake = asyncio.Event()
        self._notify_at = math.inf
        self._stopping = asyncio.Event()
        self._cycle_lock = asyncio.Lock()
        self._last_pending = 0.0
        self._running = False  # inside run() (a supervised restart sets it again)
        self._cycle_since: float | None = None  # event-loop clock when the cycle in flight began
        self._in_tx = False  # the last cycle found rows to pack: take inside a transaction until none are

    # ---------------------------------------------------------------- wake-ups
    def notify(self, payload: str) -> None:
        """NOTIFY queen_timers: a timer due in ``payload`` ms was committed; wake no later than that.
        A notification that arrives during a cycle is kept and shortens the sleep that follows it."""
        try:
            delay_ms = max(0, int(payload or 0))
        except ValueError:
            delay_ms = 0
        self.expect(asyncio.get_running_loop().time() + delay_ms / 1000)

    def expect(self, at: float) -> bool:
        """A timer due at ``at`` (event-loop clock) was committed: wake no later than that (kept if a
        cycle is running: the sleep after it is shortened). False when this sweeper is stopping, so the
        caller must tell the others (``broker.timers.service``: a schedule committed on this worker wakes
        this worker's sweeper in process and sends no NOTIFY)."""
        if self._stopping.is_set():
            return False
        if at < self._notify_at:
            self._notify_at = at
        self._wake.set()
        return True

    @property
    def awake(self) -> bool:
        """Running, not draining and not stuck in a cycle (one in flight for over ``STUCK_CYCLE_S``: an
        injected stall, a slow statement): a timer committed on this worker now will be seen by this
        sweeper's next cycle in time."""
        if not self._running or self._stopping.is_set():
            return False
        since = self._cycle_since
        return since is None or asyncio.get_running_loop().time() - since < STUCK_CYCLE_S

    def wake_at(self, res: CycleResult) -> float:
        """When to start the next cycle after ``res`` (event-loop clock): the database's answer of how
        long until the earliest row is due, counted from the moment the cycle's transaction began (the
        instant the database measured it from, not the end of the cycle: a cycle that took 10 ms would
        otherwise sleep 10 ms past the due instant), clamped to [min_sleep, max_sleep]."""
        next_due = res.next_due_ms
        if not res.taken and next_due is not None and next_due <= 0:
            next_due = BLOCKED_SLEEP_MS  # due rows, all in partitions other sweepers hold
        return res.began_at + self.config.clamp_sleep_ms(next_due) / 1000

    async def _sleep_until(self, wake_at: float) -> None:
        """Sleep until ``wake_at`` (event-loop clock), or the earlier instant a NOTIFY asked for."""
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            wake_at = min(wake_at, self._notify_at)
            self._notify_at = math.inf
            remaining = wake_at - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=remaining)
            except TimeoutError:
                return

    # ---------------------------------------------------------------- the loop
    async def _ensure_conn(self) -> asyncpg.Connection:
        if self.conn is None or self.conn.is_closed():
            conn = await connect(self.dsn)
            await conn.execute(Q.timers_sweeper_session, max(self.config.lease_ms, IDLE_FLOOR_MS), self.config.peers)
            self.conn = conn
        return self.conn

    async def run(self) -> None:
        """The supervised loop body; returns only when stopping."""
        self._running = True
        try:
            while not self._stopping.is_set():
                res = await self.run_once()
                if self._stopping.is_set():
                    break
                if res.more_due(self.config.batch):
                    await asyncio.sleep(0)
                    continue
                wake_at = self.wake_at(res)
                SWEEP_SLEEP.observe(max(0.0, wake_at - asyncio.get_running_loop().time()))
                await self._sleep_until(wake_at)
        except _Stopped:
            pass
        except BaseException:
            # Start the next run from a clean connection; leases held expire by themselves.
            self._running = False
            await self._drop_conn()
            raise
        await asyncio.Event().wait()  # drained: idle until the loop is cancelled, never restarted

    async def _drop_conn(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def run_once(self) -> CycleResult:
        """One cycle: take, pack, fire (one transaction)."""
        async with self._cycle_lock:
            if self._stopping.is_set():
                raise _Stopped
            conn = await self._ensure_conn()
            started = time.perf_counter()
            self._cycle_since = asyncio.get_running_loop().time()
            try:
                res = await self._cycle(conn)
            finally:
                self._cycle_since = None
            if res.taken:
                SWEEP_CYCLE.observe(time.perf_counter() - started)
            await self._maybe_count_pending(conn)
            return res

    async def _cycle(self, conn: asyncpg.Connection) -> CycleResult:
        """One fire transaction; its rows are counted (metrics, ``res``) after its commit, not before it:
        that is a histogram observation per fired row, work that would otherwise keep the transaction,
        its partition locks and the consumers' wake-up (the NOTIFY at commit) waiting."""
        res = CycleResult(began_at=asyncio.get_running_loop().time())
        out = await self._fire_cycle(conn, res)
        self._account(res, out)
        return res

    async def _fire_cycle(self, conn: asyncpg.Connection, res: CycleResult) -> list[Any]:
        cfg = self.config
        if not (self._in_tx or cfg.faults):
            # The usual cycle: one statement that is its own transaction (no BEGIN and COMMIT round
            # trips), taking and firing ready rows. Rows to pack come back as 'unready' (nothing taken):
            # this cycle takes them again inside a transaction, and so do the next ones (_in_tx) until a
            # cycle finds nothing to pack.
            rows = await conn.fetch(Q.timers_sweep, *cfg.sweep(self.cursor, in_tx=False).args())
            _, fired, unready = self._read_sweep(rows, res)
            if not unready:
                return fired
            self._in_tx = True
        async with conn.transaction():
            rows = await conn.fetch(Q.timers_sweep, *cfg.sweep(self.cursor, in_tx=True).args())
            taken, fired, _ = self._read_sweep(rows, res)
            if not taken:
                self._in_tx = False
                return fired  # every row was ready: fired by the database (or nothing taken)
            packed = self.pack(taken)
            stall_ms = max((r["stall_ms"] or 0 for r in taken if r["fault"] == "stall"), default=0)
            if not stall_ms:
                # The common case: fire in the transaction that took the rows, then commit.
                return await self._settle(conn, None, packed)
            # Rows to hold while nothing happens (an injected stall): lease them and commit, so no
            # transaction stays open across the wait; the fire then goes by token.
            token = uuid.uuid4()
            self.leases.add(token)
            lease = TimersLease(token=token, lease_ms=cfg.lease_ms, claimed_by=self.name,
                                tenants=[r["tenant"] for r in taken], queues=[r["queue"] for r in taken],
                                keys=[r["timer_key"] for r in taken], ids=[r["message_id"] for r in taken])
            await conn.fetch(Q.timers_lease, *lease.args())
        await self._stall(stall_ms)
        out = await self._settle(conn, token, packed)
        self.leases.discard(token)
        return out

    def _read_sweep(self, rows: list[Any], res: CycleResult) -> tuple[list[Any], list[Any], bool]:
        """Split a sweep's answer into rows taken (to pack), rows fired and whether it found rows to pack
        outside a transaction ('unready'); the summary goes into ``res``."""
        taken, fired, unready = [], [], False
        for r in rows:
            kind = r["kind"]
            if kind == "summary":
                res.next_due_ms = r["next_due_ms"]
                res.paused = bool(r["paused"])
                res.taken = r["taken"] or 0
                if res.taken:
                    self.cursor = r["tenant"]
            elif kind == "taken":
                taken.append(r)
            elif kind == "unready":
                unready = True
            else:
                fired.append(r)
        return taken, fired, unready

    async def _settle(self, conn: asyncpg.Connection, token: uuid.UUID | None, packed: _Packed) -> list[Any]:
        """Fire ``packed``; a failed fire falls back to one row at a time (permanent) or backoff for all."""
        try:
            return await self._commit(conn, token, packed)
        except (asyncpg.PostgresError, _FireError, OSError, asyncpg.InterfaceError, TimeoutError) as exc:
            klass = failure_class(exc)
            n = len(packed.g_keys) + len(packed.f_keys) + len(packed.r_keys)
            log.warning("timer fire of %d rows failed (%s): %s", n, klass, exc)
            if conn.is_closed() or not isinstance(exc, _FireError) and token is None:
                raise  # nothing was fired: the rows stay due (or their lease expires) and are fired later
            if klass == "permanent" and n > 1:
                return await self._fire_each(conn, token, packed)
            return await self._fail_all(conn, token, packed, f"{type(exc).__name__}: {exc}", klass)

    async def _stall(self, ms: int) -> None:
        """Injected stall (test hook): the leased rows wait while nothing happens; a drain interrupts it."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=ms / 1000)
        except TimeoutError:
            return
        raise _Stopped

    def pack(self, rows: list[Any]) -> _Packed:
        """Turn rows taken into the log's stored bytes, or into failures with their class."""
        p = _Packed()
        recurring: list[tuple[Any, bytes | None, int]] = []
        for r in rows:
            fault = r["fault"]
            if fault in ("transient", "permanent"):
                p.fail(r, f"injected {fault} failure (test hook)", fault)
                continue
            if r.get("recur") is not None:
                sealed_or_none = self._pack_one(r, p)
                if sealed_or_none is not None:
                    recurring.append((r, *sealed_or_none))
                continue
            if r["key_id"] is not None:
                p.good(r, None, 0)  # sealed at schedule: the stored bytes are the log's bytes
                continue
            try:
                body = client_json(self.codec, r["payload"], zstd=r["payload_zstd"])
            except CodecError as exc:
                p.fail(r, f"payload is not a valid zstd frame: {exc}", "permanent", bad_payload=True)
                continue
            except NotJson as exc:
                p.fail(r, f"payload is not valid JSON: {exc}", "permanent", bad_payload=True)
                continue
            codec, sealed = self.codec.pack(body)
            if codec == CODEC_RAW and not r["payload_zstd"]:
                p.good(r, None, CODEC_RAW)  # unchanged: the database reuses the stored bytes
            else:
                p.good(r, sealed, codec)
        if recurring:
            self._advance(recurring, p)
        return p

    def _pack_one(self, r: Any, p: _Packed) -> tuple[bytes | None, int] | None:
        """A recurring row's frame bytes, as ``pack`` seals a one-shot row's (None bytes: the stored ones);
        None when the row failed (recorded in ``p``)."""
        if r["key_id"] is not None:
            return None, 0
        try:
            body = client_json(self.codec, r["payload"], zstd=r["payload_zstd"])
        except CodecError as exc:
            p.fail(r, f"payload is not a valid zstd frame: {exc}", "permanent", bad_payload=True)
            return None
        except NotJson as exc:
            p.fail(r, f"payload is not valid JSON: {exc}", "permanent", bad_payload=True)
            return None
        codec, sealed = self.codec.pack(body)
        if codec == CODEC_RAW and not r["payload_zstd"]:
            return None, CODEC_RAW
        return sealed, codec

    def _advance(self, rows: list[tuple[Any, bytes | None, int]], p: _Packed) -> None:
        """Each recurring row's next occurrence, from its schedule and the database's clock at the take
        (``db_now``): the worker CPU this costs is the one thing a recurring fire adds to a cycle
        (queen_timers_recur_next_seconds_total)."""
        started = time.perf_counter()
        ids = uuid7_text(len(rows))
        for (r, payload, codec), next_id in zip(rows, ids, strict=True):
            sched, base = recur.from_stored(r["recur"])
            step = recur.advance(sched, r["deliver_at"], r["db_now"])
            p.recurring(r, payload, codec, step, next_id, recur.occurrence_txn(base, step.next_at))
            if not step.fire:
                TIMERS_RECUR_ADVANCED.labels("skipped").inc()
            if step.skipped:
                TIMERS_RECUR_ADVANCED.labels("missed").inc(step.skipped)
        TIMERS_RECUR_NEXT.inc(time.perf_counter() - started)

    async def _commit(self, conn: asyncpg.Connection, token: uuid.UUID | None, p: _Packed) -> list[Any]:
        """Fire by token (leased rows; one statement in autocommit is one transaction) or, with no token,
        the rows taken in the caller's open transaction (an error there undoes only this call)."""
        call = p.call(token, self.config.retry)
        out = await conn.fetch(call.query, *call.args())
        if token is not None:
            return out
        for r in out:
            if r["kind"] == "error":  # the call's work was undone; the answer's other rows are void
                raise _FireError(r["tenant"], r["queue"])
        return out

    async def _fail_all(self, conn: asyncpg.Connection, token: uuid.UUID | None, p: _Packed, error: str, klass: str) -> list[Any]:
        f = _Packed()
        for i in range(len(p.g_tenants)):
            f.fail(p.good_row(i), error, klass)
        for i in range(len(p.r_tenants)):
            f.fail(p.recurring_row(i), error, klass)  # the occurrence stays due, backs off like a timer
        f.f_tenants += p.f_tenants
        f.f_queues += p.f_queues
        f.f_keys += p.f_keys
        f.f_ids += p.f_ids
        f.f_errors += p.f_errors
        f.f_costs += p.f_costs
        f.f_wrap += p.f_wrap
        return await self._commit(conn, token, f)

    async def _fire_each(self, conn: asyncpg.Connection, token: uuid.UUID | None, p: _Packed) -> list[Any]:
        """A permanent failure of the whole commit: find the row(s) at fault by firing one at a time."""
        out: list[Any] = []
        for i in range(len(p.g_tenants)):
            one = _Packed()
            one.good(p.good_row(i), p.g_payloads[i], p.g_codecs[i])
            try:
                out += await self._commit(conn, token, one)
            except (asyncpg.PostgresError, _FireError) as exc:
                out += await self._fail_all(conn, token, one, f"{type(exc).__name__}: {exc}", failure_class(exc))
        for i in range(len(p.r_tenants)):
            one = _Packed()
            p.take_recurring(i, one)
            try:
                out += await self._commit(conn, token, one)
            except (asyncpg.PostgresError, _FireError) as exc:
                out += await self._fail_all(conn, token, one, f"{type(exc).__name__}: {exc}", failure_class(exc))
        if p.f_tenants:
            rest = _Packed(f_tenants=p.f_tenants, f_queues=p.f_queues, f_keys=p.f_keys, f_ids=p.f_ids,
                           f_errors=p.f_errors, f_costs=p.f_costs, f_wrap=p.f_wrap)
            out += await self._commit(conn, token, rest)
        return out

    def _account(self, res: CycleResult, out: list[Any]) -> None:
        for r in out:
            kind = r["kind"]
            if kind == "fired":
                res.fired += 1
                lag = max(0.0, float(r["lag_s"] or 0.0))
                res.lags.append(lag)
                TIMERS_FIRE_LAG.observe(lag)
            elif kind == "duplicate":
                res.duplicates += 1
            elif kind == "backoff":
                res.backoff += 1
            elif kind == "dlq":
                res.dlq += 1
        if res.fired:
            self.fired += res.fired
            TIMERS_FIRED.inc(res.fired)
            SWEEPER_FIRED.inc(res.fired)
            MESSAGES_PUSHED.labels("timer").inc(res.fired)
        if res.dlq:
            TIMERS_DLQ.inc(res.dlq)

    async def _maybe_count_pending(self, conn: asyncpg.Connection) -> None:
        now = time.monotonic()
        if now - self._last_pending >= PENDING_EVERY_S:
            self._last_pending = now
            TIMERS_PENDING.set(await conn.fetchval(Q.timers_pending_total))

    # ---------------------------------------------------------------- drain
    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop taking, let an in-flight commit finish, hand back leases still held, close the connection."""
        self._stopping.set()
        self._wake.set()
        try:
            await asyncio.wait_for(self._cycle_lock.acquire(), timeout=timeout_s)
            locked = True
        except TimeoutError:
            locked = False
        try:
            if self.leases:
                tokens = list(self.leases)
                conn = self.conn if locked and self.conn is not None and not self.conn.is_closed() else None
                own = conn is None
                if own:
                    conn = await connect(self.dsn)
                assert conn is not None
                try:
                    await conn.execute(Q.timers_release_leases, tokens)
                    log.info("sweeper released %d lease token(s) at drain", len(tokens))
                    self.leases.clear()
                finally:
                    if own:
                        await conn.close()
        except Exception:
            log.exception("could not release timer leases at drain; they expire by themselves")
        finally:
            if self.conn is not None and not self.conn.is_closed():
                try:
                    await asyncio.wait_for(self.conn.close(), timeout=2)
                except Exception:
                    self.conn.terminate()
            self.conn = None
            if locked:
                self._cycle_lock.release()
