"""Schedule, cancel, peek and list timers against the database.

One call of ``POST /api/v1/timers`` is one statement in autocommit (one transaction, one round trip):
the whole batch goes to ``queen_timers_apply`` as parallel arrays and the same statement writes the
metering row (``timers_schedule``); a cancel is one ``queen_timers_apply`` statement; a ``timers`` rider
runs the same metering statement inside the bundle's transaction.
When the broker has an encryption key ring, the destination queues' ``encryption_enabled`` flags are
read first (one more statement) so payloads bound for an encrypting queue are sealed — encrypted — at
schedule time; the SQL function refuses a cleartext payload for an encrypting queue, so a flag switched
on in between cannot leave cleartext at rest (the call re-reads the flags once and retries).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import zstandard

from broker import errors, limits, metering
from broker.auth import Principal
from broker.codec import CodecError
from broker.crypto import NoEncryptionKey
from broker.ids import uuid7_text
from broker.metrics import TIMERS_OPS
from broker.payloads import NotJson, client_json, seal
from broker.store.pool import Conn
from broker.store.queries import Q
from broker.timers import recur
from broker.timers.calls import TimersApply, TimersRecurApply
from broker.timers.parse import CODE, TimerOp, bad
from broker.timers.status import iso_us, result, status_of

if TYPE_CHECKING:
    from broker.context import Broker
    from broker.timers.sweeper import Sweeper

log = logging.getLogger("queen.timers")

SQLSTATE_DISABLED = "QT001"
SQLSTATE_ENCRYPTING = "QT002"
SQLSTATE_CLOCK = "QT003"  # queen_timers_recur_apply: no cron candidate after the database's clock
DISABLED_RETRY_AFTER_S = 5
HINT = {errors.TIMERS_HINT_HEADER: errors.TIMERS_HINT_VALUE}


def with_hint(exc: errors.ApiError) -> errors.ApiError:
    """A refusal of the schedule route names the cancel route that always works."""
    exc.headers.setdefault(errors.TIMERS_HINT_HEADER, errors.TIMERS_HINT_VALUE)
    return exc


def disabled_error(*, in_transaction: bool) -> errors.ApiError:
    detail = "timer scheduling is switched off by an operator; cancels keep working on the DELETE route"
    if in_transaction:
        return errors.Forbidden("timers_disabled", detail, code="timers_disabled", headers=HINT)
    return errors.Unavailable(
        "timers_disabled", detail, code="timers_disabled", retry_after_s=DISABLED_RETRY_AFTER_S, headers=HINT
    )


def schedule_count(ops: Sequence[TimerOp]) -> int:
    return sum(1 for op in ops if op.is_schedule)


def decoded_size(op: TimerOp, ceiling: int) -> int:
    """Size of the payload the fire will deliver: the bytes, or their zstd content size."""
    assert op.payload is not None
    if not op.payload_zstd:
        return len(op.payload)
    try:
        size = zstandard.frame_content_size(op.payload)
    except zstandard.ZstdError:
        raise bad("timers_payload_not_zstd", "`payloadZstd` is true but `payload` is not a zstd frame") from None
    if size >= 0:
        return size
    # No content size in the frame header: decompress, but never more than the ceiling + 1 byte.
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(op.payload)
        return len(reader.read(ceiling + 1))
    except zstandard.ZstdError:
        raise bad("timers_payload_not_zstd", "`payloadZstd` is true but `payload` is not a valid zstd frame") from None


async def check_plan(broker: Broker, principal: Principal, ops: Sequence[TimerOp]) -> None:
    """The plan's verdicts: the horizon (403) and the payload ceiling (413), on every schedule op."""
    if not any(op.is_schedule for op in ops):
        return
    plan = await limits.plan_for(broker, principal.tenant)
    horizon = plan.timers_horizon_ms
    ceiling = plan.timer_payload_ceiling
    for i, op in enumerate(ops):
        if not op.is_schedule:
            continue
        if op.recur is not None:
            _check_recur_horizon(op, i, horizon)
        elif op.delay_ms is not None and op.delay_ms > horizon:
            raise with_hint(
                errors.Forbidden(
                    "timers_horizon",
                    f"op {i}: delayMs {op.delay_ms} is beyond this tenant's horizon of {horizon} ms",
                    code="timer_horizon_exceeded",
                    extra={"index": i, "horizonMs": horizon},
                )
            )
        size = decoded_size(op, ceiling)
        if size > ceiling:
            raise errors.PayloadTooLarge(
                "timers_payload_too_large",
                f"op {i}: the decoded payload is {size} bytes; the ceiling is {ceiling} bytes",
                code="payload_too_large",
                extra={"index": i, "limit": ceiling},
            )


def _check_recur_horizon(op: TimerOp, i: int, horizon: int) -> None:
    """A recurring schedule keeps its row, so the horizon bounds what it can promise: its first occurrence
    and the gap between two occurrences (measured on this broker's clock: a plan verdict, not a due time)."""
    assert op.recur is not None
    now = datetime.now(UTC)
    ahead = max(recur.first_delay_ms(op.recur, op.delay_ms, now), recur.period_ms(op.recur, now))
    if ahead > horizon:
        raise with_hint(
            errors.Forbidden(
                "timers_horizon",
                f"op {i}: the schedule's first occurrence or its period ({ahead} ms) is beyond this tenant's "
                f"horizon of {horizon} ms",
                code="timer_horizon_exceeded",
                extra={"index": i, "horizonMs": horizon},
            )
        )


def _seal_for_encrypting_queue(broker: Broker, tenant: str, op: TimerOp) -> tuple[bytes, bool, str]:
    """Encryption happens at schedule: the payload is sealed into the log's stored format now and the
    fire moves it untouched. The fire cannot look inside it, so it must be JSON now."""
    assert op.payload is not None
    try:
        body = client_json(broker.codec, op.payload, zstd=op.payload_zstd)
    except CodecError:
        raise bad("timers_payload_not_zstd", "`payloadZstd` is true but `payload` is not a valid zstd frame") from None
    except NotJson:
        raise bad(
            "timers_payload_not_json",
            f"queue {op.queue!r} encrypts at rest, so the payload is sealed at schedule and must be JSON now",
        ) from None
    try:
        sealed = seal(broker.codec, broker.keyring, tenant, op.queue, body, encrypt=True)
    except NoEncryptionKey as exc:
        raise _no_keys(op.queue) from exc
    return sealed.payload, sealed.codec == 1, sealed.key_id or ""


def _no_keys(queue: str) -> errors.ApiError:
    return errors.Unavailable(
        "timers_encryption_key_missing",
        f"queue {queue!r} encrypts at rest but this broker has no encryption key (QUEEN_ENCRYPTION_KEYS)",
        code="timers_misconfigured",
        retry_after_s=30,
    )


async def apply(
    conn: Conn,
    broker: Broker,
    principal: Principal,
    ops: Sequence[TimerOp],
    *,
    check_switch: bool = True,
    in_transaction: bool = False,
    meter: bool = False,
) -> list[dict[str, Any]]:
    """Apply validated ops (in the caller's transaction, or as one autocommit statement); one result
    element per op, in op order. ``meter``: the same statement meters the schedules that made a promise
    (``POST /api/v1/timers`` in autocommit, the timers rider in its bundle: one round trip in all)."""
    if not ops:
        return []
    if any(op.is_recurring for op in ops):
        return await _apply_split(conn, broker, principal, ops, check_switch=check_switch,
                                  in_transaction=in_transaction, meter=meter)
    tenant = principal.tenant
    encrypting = await _encrypting_queues(conn, broker, tenant, ops)
    sweeper = _local_sweeper(broker, conn)
    sent_at = 0.0

    def statement() -> tuple[str, Sequence[Any]]:
        nonlocal sent_at
        call = _call(broker, principal, ops, encrypting, check_switch=check_switch, notify=sweeper is None,
                     meter_period_s=metering.period_seconds() if meter else None)
        args = call.args()
        sent_at = asyncio.get_running_loop().time()  # when this attempt goes out (the local sweeper's wake)
        return call.query, args

    rows = await _fetch_sealed(conn, broker, encrypting, statement, in_transaction=in_transaction,
                               savepoint=bool(broker.keyring))
    if sweeper is not None:
        _wake_local(broker, sweeper, ops, sent_at)
    out: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for op, row in zip(ops, rows, strict=True):
        status = status_of(row["status"])
        counts[status.value] += 1
        out.append(
            result(status, op.queue, op.key, txn=row["txn"], message_id=row["message_id"], deliver_at=row["deliver_at"])
        )
    for value, n in counts.items():
        TIMERS_OPS.labels(value).inc(n)
    return out


async def _apply_split(
    conn: Conn, broker: Broker, principal: Principal, ops: Sequence[TimerOp], *, check_switch: bool,
    in_transaction: bool, meter: bool,
) -> list[dict[str, Any]]:
    """A batch with recurring ops: the one-shot ops through ``apply`` (queen_timers_apply, unchanged), the
    recurring ones through queen_timers_recur_apply; both in one transaction when the batch has both
    (a savepoint inside a caller's transaction), so the batch stays all or nothing."""
    once = [(i, op) for i, op in enumerate(ops) if not op.is_recurring]
    rec = [(i, op) for i, op in enumerate(ops) if op.is_recurring]
    out: list[dict[str, Any]] = [{} for _ in ops]

    async def run() -> None:
        if once:
            done = await apply(conn, broker, principal, [op for _, op in once], check_switch=check_switch,
                               in_transaction=in_transaction, meter=meter)
            for (i, _), r in zip(once, done, strict=True):
                out[i] = r
        done = await _apply_recur(conn, broker, principal, [op for _, op in rec], check_switch=check_switch,
                                  in_transaction=in_transaction, meter=meter)
        for (i, _), r in zip(rec, done, strict=True):
            out[i] = r

    if once:
        async with conn.transaction():
            await run()
    else:
        await run()
    return out


async def _encrypting_queues(conn: Conn, broker: Broker, tenant: str, ops: Sequence[TimerOp]) -> set[str]:
    """The queues of these schedules that store encrypted payloads (none without a key ring)."""
    if not broker.keyring:
        return set()
    queues = sorted({op.queue for op in ops if op.is_schedule})
    if not queues:
        return set()
    return {r["name"] for r in await conn.fetch(Q.timers_encrypting_queues, tenant, queues)}


async def _fetch_sealed(
    conn: Conn, broker: Broker, encrypting: set[str], statement: Callable[[], tuple[str, Sequence[Any]]], *,
    in_transaction: bool, savepoint: bool,
) -> list[asyncpg.Record]:
    """Run an apply statement (``statement()`` builds it from ``encrypting`` as it stands); when the
    database answers that a queue began encrypting (``_queue_to_encrypt``), add it and run it once more,
    sealed. ``savepoint``: inside a transaction the statement runs in a savepoint, so the second attempt
    finds the transaction still usable."""
    for attempt in (1, 2):
        query, args = statement()
        try:
            if savepoint and conn.is_in_transaction():
                async with conn.transaction():
                    return list(await conn.fetch(query, *args))
            return list(await conn.fetch(query, *args))
        except asyncpg.PostgresError as exc:
            queue = _queue_to_encrypt(exc, broker, attempt, in_transaction=in_transaction)
            if queue is None:
                raise
            encrypting.add(queue)
    raise AssertionError("unreachable: the second attempt returns or raises")


def _queue_to_encrypt(exc: asyncpg.PostgresError, broker: Broker, attempt: int, *, in_transaction: bool) -> str | None:
    """What an apply statement's refusal means: the answer it raises (scheduling switched off, the
    database's clock ahead, no key for a queue that encrypts), or the queue that began encrypting since
    the ops were sealed, to seal again and retry once; None for any other error (the caller re-raises)."""
    state = getattr(exc, "sqlstate", None)
    if state == SQLSTATE_DISABLED:
        raise disabled_error(in_transaction=in_transaction) from None
    if state == SQLSTATE_CLOCK:
        raise errors.Unavailable(
            "timers_clock_skew",
            "the database's clock is ahead of this broker's by more than the broker's margin; "
            "a cron schedule's first occurrence cannot be chosen (check the hosts' time sync)",
            code="timers_clock_skew", retry_after_s=5,
        ) from None
    if state == SQLSTATE_ENCRYPTING:
        queue: str = getattr(exc, "detail", None) or "?"
        if not broker.keyring or attempt == 2:
            raise _no_keys(queue) from None
        return queue
    return None


async def _apply_recur(
    conn: Conn, broker: Broker, principal: Principal, ops: Sequence[TimerOp], *, check_switch: bool,
    in_transaction: bool, meter: bool,
) -> list[dict[str, Any]]:
    """Recurring schedules, pauses and resumes: one statement (queen_timers_recur_apply and its meter)."""
    tenant = principal.tenant
    encrypting = await _encrypting_queues(conn, broker, tenant, ops)

    def statement() -> tuple[str, Sequence[Any]]:
        call = _recur_call(broker, principal, ops, encrypting, check_switch,
                           metering.period_seconds() if meter else 0)
        return Q.timers_recur_apply, call.args()

    rows = await _fetch_sealed(conn, broker, encrypting, statement, in_transaction=in_transaction, savepoint=True)
    out: list[dict[str, Any]] = []
    for op, row in zip(ops, rows, strict=True):
        status = status_of(row["status"])
        TIMERS_OPS.labels(status.value).inc()
        body = result(status, op.queue, op.key, txn=row["txn"], message_id=row["message_id"],
                      deliver_at=row["deliver_at"])
        if op.recur is not None and status.ok:
            body["recur"] = op.recur.wire()
        out.append(body)
    return out


def _recur_json(broker: Broker, op: TimerOp) -> None:
    """A recurring timer's payload is delivered again and again: it must be JSON now (a payload the fire
    would refuse would refuse every occurrence), zstd frames included."""
    assert op.payload is not None
    try:
        client_json(broker.codec, op.payload, zstd=op.payload_zstd)
    except CodecError:
        raise bad("timers_payload_not_zstd", "`payloadZstd` is true but `payload` is not a valid zstd frame") from None
    except NotJson:
        raise bad("timers_payload_not_json", "a recurring timer's payload must be JSON (it is delivered at every "
                  "occurrence and checked now, not at each fire)") from None


def _recur_call(
    broker: Broker, principal: Principal, ops: Sequence[TimerOp], encrypting: set[str], check_switch: bool,
    period_s: int,
) -> TimersRecurApply:
    now = datetime.now(UTC)
    kinds: list[str] = []
    columns: list[list[Any]] = [[] for _ in range(10)]
    queues, keys, parts, txns, ids, payloads, zstd, key_ids, stored, delays = columns
    cand_idx: list[int] = []
    cands: list[datetime] = []
    minted = iter(uuid7_text(sum(1 for op in ops if op.recur is not None)))
    firsts: dict[tuple[str | None, str | None], list[datetime]] = {}  # a batch shares its expressions
    for n, op in enumerate(ops, start=1):  # n: the statement's ordinality
        queues.append(op.queue)
        keys.append(op.key)
        if op.recur is None:  # pause / resume
            kinds.append(op.op)
            for column in (parts, txns, ids, payloads, zstd, key_ids, stored, delays):
                column.append(None)
            continue
        kinds.append("schedule")
        assert op.txn is not None
        parts.append(op.partition)
        txns.append(op.txn)
        ids.append(next(minted))
        stored.append(op.recur.stored(op.txn))
        if op.queue in encrypting:
            body, z, kid = _seal_for_encrypting_queue(broker, principal.tenant, op)
            payloads.append(body)
            zstd.append(z)
            key_ids.append(kid)
        else:
            _recur_json(broker, op)
            payloads.append(op.payload)
            zstd.append(op.payload_zstd)
            key_ids.append(None)
        if op.recur.every_ms is not None:
            delays.append(op.recur.every_ms if op.delay_ms is None else op.delay_ms)
        else:
            delays.append(None)
            shape = (op.recur.cron, op.recur.zone)
            if shape not in firsts:
                firsts[shape] = op.recur.first_candidates(now)
            for c in firsts[shape]:
                cand_idx.append(n)
                cands.append(c)
    return TimersRecurApply(
        tenant=principal.tenant, sub=principal.sub, check_switch=check_switch,
        near_ms=broker.settings.sweeper_max_sleep_ms, ops=kinds, queues=queues, keys=keys, partitions=parts,
        txns=txns, ids=ids, payloads=payloads, zstd=zstd, key_ids=key_ids, recur=stored, delays_ms=delays,
        cand_idx=cand_idx, cands=cands, meter_period_s=period_s,
    )


def _local_sweeper(broker: Broker, conn: Conn) -> Sweeper | None:
    """This worker's sweeper when a schedule may wake it in process instead of by NOTIFY: the statement
    commits by itself (autocommit, so the row is visible when it returns; in a caller's transaction only
    the NOTIFY, delivered at commit, comes late enough) and the sweeper is running. Why avoid the
    NOTIFY: it holds PostgreSQL's one notify-queue lock from its commit until the commit's WAL flush is
    done, so under a steady rate of schedules the fires' commits (which NOTIFY the waiting pops) would
    queue behind the schedules' flushes."""
    sweeper = broker.services.sweeper
    if sweeper is None or not sweeper.awake or conn.is_in_transaction():
        return None
    return sweeper


def _wake_local(broker: Broker, sweeper: Sweeper, ops: Sequence[TimerOp], sent_at: float) -> None:
    """Wake this worker's sweeper by the earliest delay scheduled (counted from when the statement was
    sent, so never late: an early wake-up only asks the database again); if it started draining meanwhile,
    NOTIFY the others after all."""
    delays = [op.delay_ms for op in ops if op.is_schedule and op.delay_ms is not None]
    if not delays or min(delays) > broker.settings.sweeper_max_sleep_ms:
        return
    if not sweeper.expect(sent_at + max(0, min(delays)) / 1000):
        task = asyncio.get_running_loop().create_task(_notify_others(broker, min(delays)))
        _NOTIFYING.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(_NOTIFYING.discard)


_NOTIFYING: set[asyncio.Task[None]] = set()


async def _notify_others(broker: Broker, delay_ms: int) -> None:
    try:
        async with broker.require_pool().acquire() as conn:
            await conn.execute(Q.timers_wake, str(max(0, delay_ms)))
    except Exception:  # the others still wake by their own next-due reckoning (at most the max sleep)
        log.warning("could not NOTIFY the sweepers of a timer due in %d ms", delay_ms, exc_info=True)


def log_ready(broker: Broker, op: TimerOp) -> bool:
    """queen_timers.payload_ready: the payload as sent is already what the fire would store in the log,
    so the sweeper fires it without a pass through Python (broker/sql/migrations/0018_timer_payload_ready.sql):
    not zstd, below the compression threshold (above it the fire may compress), and JSON by the very check
    the sweeper's pack makes (orjson). Anything else is stored as before and judged at the fire (a payload
    that is not JSON still fails there, permanently, and reaches the DLQ)."""
    body = op.payload
    if body is None or op.payload_zstd:
        return False
    threshold = broker.codec.threshold
    if threshold and len(body) >= threshold:
        return False
    try:
        client_json(broker.codec, body, zstd=False)
    except NotJson:
        return False
    return True


def _call(
    broker: Broker, principal: Principal, ops: Sequence[TimerOp], encrypting: set[str], *, check_switch: bool,
    notify: bool, meter_period_s: int | None,
) -> TimersApply:
    kinds = [op.op for op in ops]
    queues = [op.queue for op in ops]
    keys = [op.key for op in ops]
    txns = [op.txn for op in ops]
    columns: list[list[Any]] = [[] for _ in range(7)]
    parts, ids, payloads, zstd, key_ids, delays, ready = columns
    minted = iter(uuid7_text(schedule_count(ops)))  # minted in op order, as one uuid7() per op would be
    for op in ops:
        if op.is_schedule:
            parts.append(op.partition)
            ids.append(next(minted))
            delays.append(op.delay_ms)
            if op.queue in encrypting:
                body, z, kid = _seal_for_encrypting_queue(broker, principal.tenant, op)
                payloads.append(body)
                zstd.append(z)
                key_ids.append(kid)
                ready.append(False)  # sealed: the fire knows by the key id
            else:
                payloads.append(op.payload)
                zstd.append(op.payload_zstd)
                key_ids.append(None)
                ready.append(log_ready(broker, op))
        else:
            for column in columns:
                column.append(None)
    near_ms = broker.settings.sweeper_max_sleep_ms if notify else -1  # -1: the statement sends no NOTIFY
    # A column with nothing to say (every partition the default, nothing zstd, nothing sealed) is sent as
    # NULL, which queen_timers_apply reads as all NULLs: asyncpg spends an isinstance test or two on every
    # element it encodes, and these three were a third of a plain batch's elements.
    return TimersApply(
        tenant=principal.tenant, sub=principal.sub, check_switch=check_switch, near_ms=near_ms, ops=kinds,
        queues=queues, keys=keys, partitions=parts if any(p is not None for p in parts) else None, txns=txns,
        ids=ids, payloads=payloads, zstd=zstd if any(zstd) else None,
        key_ids=key_ids if any(k is not None for k in key_ids) else None, delays_ms=delays, ready=ready,
        meter_period_s=meter_period_s,
    )


async def admit(broker: Broker, principal: Principal, ops: Sequence[TimerOp]) -> None:
    """Admission of a schedule-class call (``POST /api/v1/timers``, the timers rider): the limits rungs
    (surface ``timers``, ops = schedules and reschedules), any refusal carrying ``x-queen-timers-hint``,
    then the plan's horizon and payload ceiling."""
    try:
        await limits.admit(broker, principal, "timers", schedule_count(ops))
    except errors.ApiError as exc:
        raise with_hint(exc) from None
    await check_plan(broker, principal, ops)


async def schedule_call(broker: Broker, principal: Principal, ops: Sequence[TimerOp]) -> list[dict[str, Any]]:
    """``POST /api/v1/timers``: admission, then one statement (one transaction) for the batch and its meter."""
    await admit(broker, principal, ops)
    pool = broker.require_pool()
    async with pool.acquire() as conn:
        return await apply(conn, broker, principal, ops, check_switch=True, meter=True)


async def cancel_one(broker: Broker, principal: Principal, queue: str, key: str, txn: str | None) -> dict[str, Any]:
    """``DELETE /api/v1/timers/:queue/*timerKey``: no grant, no limits, no switch; only the boot flag."""
    pool = broker.require_pool()
    op = TimerOp("cancel", queue, key, txn)
    async with pool.acquire() as conn:  # one statement in autocommit: one transaction, one round trip
        results = await apply(conn, broker, principal, [op], check_switch=False)
    return results[0]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _row_body(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "queue": row["queue"],
        "timerKey": row["timer_key"],
        "partition": row["partition"],
        "deliverAt": iso_us(row["deliver_at"]),
        "txn": row["txn"],
        "messageId": str(row["message_id"]),
        "payloadZstd": row["payload_zstd"],
        "encrypted": row["key_id"] is not None,
        "producerSub": row["producer_sub"],
        "attempts": row["attempts"],
        "lastError": row["last_error"],
        "claimed": row["claimed"],
        "createdAt": iso_us(row["created_at"]),
        "updatedAt": iso_us(row["updated_at"]),
        **_recur_body(row),
    }


def _recur_body(row: asyncpg.Record) -> dict[str, Any]:
    """A recurring timer's own fields (a one-shot timer's peek and list rows are as they were)."""
    stored = row["recur"]
    if stored is None:
        return {}
    sched, base = recur.from_stored(stored)
    return {"recur": sched.wire(), "recurTxn": base, "paused": row["paused"], "occurrences": row["occurrences"],
            "lastFiredAt": iso_us(row["last_fired_at"])}


async def peek(broker: Broker, tenant: str, queue: str, key: str) -> dict[str, Any]:
    """One timer with its payload base64 as stored (never decrypted); a miss is ``found: false``."""
    pool = broker.require_pool()
    async with pool.acquire() as conn:
        row = await conn.fetchrow(Q.timers_peek, tenant, queue, key)
    if row is None:
        return {"found": False, "queue": queue, "timerKey": key}
    body = {"found": True, **_row_body(row)}
    body["payload"] = _b64(row["payload"])
    return body


async def list_page(broker: Broker, tenant: str, queue: str, after: str | None, limit: int) -> dict[str, Any]:
    """Keyset page over one queue's pending timers, in byte order of timerKey; no payloads."""
    pool = broker.require_pool()
    async with pool.acquire() as conn:
        rows = await conn.fetch(Q.timers_list, tenant, queue, after, limit + 1)
    truncated = len(rows) > limit
    rows = rows[:limit]
    return {
        "rows": [_row_body(r) for r in rows],
        "truncated": truncated,
        "nextAfter": rows[-1]["timer_key"] if truncated and rows else None,
    }


OVERVIEW_SCAN = 50_000
OVERVIEW_NEXT = 20


async def overview(broker: Broker, tenant: str) -> dict[str, Any]:
    """The tenant's pending timers per queue and its next due instants (the console's timers page).

    ``pending`` is exact (the usage gauge the triggers keep); the per-queue counts come from a scan of at
    most ``OVERVIEW_SCAN`` rows, and ``truncated`` says when it stopped there (the counts are then lower
    bounds). ``next`` lists the ``OVERVIEW_NEXT`` earliest due timers; ``dueAt`` is when the sweeper may
    claim a timer (later than ``deliverAt`` while it backs off after a failed fire)."""
    pool = broker.require_pool()
    async with pool.acquire() as conn:
        total = await conn.fetchrow(Q.timers_overview_total, tenant)
        queues = await conn.fetch(Q.timers_overview_queues, tenant, OVERVIEW_SCAN)
        nxt = await conn.fetch(Q.timers_overview_next, tenant, OVERVIEW_NEXT)
    assert total is not None  # an aggregate without GROUP BY always answers one row
    counted = sum(r["pending"] for r in queues)
    return {
        "pending": total["pending"],
        "now": iso_us(total["now"]),
        "truncated": counted >= OVERVIEW_SCAN,
        "queues": [
            {"queue": r["queue"], "pending": r["pending"], "nextDueAt": iso_us(r["next_due_at"]),
             "claimed": r["claimed"], "retrying": r["retrying"]}
            for r in queues
        ],
        "next": [
            {"queue": r["queue"], "timerKey": r["timer_key"], "partition": r["partition"],
             "deliverAt": iso_us(r["deliver_at"]), "dueAt": iso_us(r["due_at"]), "attempts": r["attempts"],
             "claimed": r["claimed"]}
            for r in nxt
        ],
    }


__all__ = [
    "CODE",
    "apply",
    "cancel_one",
    "admit",
    "check_plan",
    "list_page",
    "overview",
    "peek",
    "schedule_call",
    "schedule_count",
    "with_hint",
]
