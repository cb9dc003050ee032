"""Recurring schedules: the wire's ``recur`` object, validated, and the next occurrence of a schedule.

A recurring timer is one row of ``queen_timers`` whose ``recur`` column holds its schedule (the JSON
this module writes, ``Schedule.stored``). The row's ``deliver_at`` is always its next occurrence, its
``txn`` and ``message_id`` are that occurrence's frame's; the sweeper fires the occurrence and, in the
same statement, moves the row to the occurrence chosen by ``advance`` (docs/concepts/recurring-schedules.md).

Two kinds, one of them per schedule:

- ``cron`` (5 fields, or 6 with seconds first) in an IANA ``timeZone`` (default ``UTC``), parsed and
  iterated by cronsim (PyPI), never by hand.
- ``everyMs``: a fixed interval, at least ``MIN_EVERY_MS``; occurrences are first + k * everyMs.

The next occurrence is computed from the schedule (the first occurrence strictly after the one being
fired), never from the fire time, so a late fire never shifts the ones after it.

DST rule (cron in a zone with daylight saving time): a local time that does not exist (the spring-forward
gap) fires once, at the first valid instant after the gap (02:30 Europe/Berlin on the last Sunday of
March fires at 03:00 CEST); a local time that exists twice (the fall-back overlap) fires once, at its first
pass (CEST). That holds for every expression, including those with a step or wildcard hour field: in
the repeated hour only the first pass fires. A fixed interval is real elapsed time, and DST is nothing to it.

Missed occurrences (after an outage, a paused sweeper or a paused schedule) follow the schedule's
``missed`` policy, decided when the overdue occurrence is fired (``advance``):

- ``once`` (default): one frame (the first missed occurrence's) for everything missed, then the first
  occurrence after now.
- ``all``: every missed occurrence fires, oldest first, one per sweep cycle, but at most ``CATCH_UP_MAX``
  of them: when more were missed, only the most recent ``CATCH_UP_MAX`` fire.
- ``skip``: nothing missed fires; the schedule resumes at the first occurrence after now.

An occurrence counts as missed when a later occurrence is already due by the time it fires, or (for
``skip``, which must tell a late fire from a missed one) when it fires more than ``SKIP_GRACE_MS`` late.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from cronsim import CronSim, CronSimError

from broker.timers.status import iso_us

MIN_EVERY_MS = 1_000
# One year: a longer interval cannot be within any plan's horizon anyway (checked against the plan).
MAX_EVERY_MS = 366 * 24 * 3_600_000
CATCH_UP_MAX = 100
SKIP_GRACE_MS = 60_000
MISSED = ("once", "all", "skip")
MAX_CRON = 256
MAX_ZONE = 64
# The first occurrence of a cron schedule is chosen by the database's clock among candidates computed
# here around this broker's clock: every occurrence within SKEW_MS either side, plus the first after.
SKEW_MS = 5_000
MAX_CANDIDATES = 64
_FIELDS = frozenset({"cron", "timeZone", "everyMs", "missed"})
_ONE_US = timedelta(microseconds=1)


class RecurError(ValueError):
    """A ``recur`` object the broker refuses: ``reason`` is the envelope's reason id, ``field`` the wire field."""

    def __init__(self, reason: str, detail: str, field: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.field = field


@dataclass(frozen=True)
class Schedule:
    """One validated schedule: ``cron`` + ``zone`` or ``every_ms``, and the ``missed`` policy."""

    cron: str | None
    zone: str | None
    every_ms: int | None
    missed: str

    # ------------------------------------------------------------------ the wire
    def wire(self) -> dict[str, Any]:
        if self.cron is not None:
            return {"cron": self.cron, "timeZone": self.zone, "missed": self.missed}
        return {"everyMs": self.every_ms, "missed": self.missed}

    def stored(self, base_txn: str) -> str:
        """The ``queen_timers.recur`` value: the schedule and the txn each occurrence's frame txn is built on."""
        return orjson.dumps({**self.wire(), "txn": base_txn}).decode()

    # ------------------------------------------------------------------ occurrences
    def after(self, dt: datetime) -> datetime:
        """The first occurrence strictly after ``dt`` (UTC). Interval schedules are anchored on ``dt``
        itself (``dt`` is always an occurrence when the sweeper asks)."""
        if self.every_ms is not None:
            return dt + timedelta(milliseconds=self.every_ms)
        return _cron_after(self.cron or "", self.zone or "UTC", dt)

    def next_after_now(self, due: datetime, now: datetime) -> datetime:
        """The first occurrence of this schedule's chain through ``due`` strictly after ``now``."""
        if self.every_ms is not None:
            step = timedelta(milliseconds=self.every_ms)
            return due + ((now - due) // step + 1) * step
        return self.after(now)

    def iter_after(self, dt: datetime) -> Iterator[datetime]:
        """Every occurrence strictly after ``dt``, earliest first (one cronsim iterator, not one per step)."""
        if self.every_ms is not None:
            step = timedelta(milliseconds=self.every_ms)
            while True:
                dt = dt + step
                yield dt
        yield from _cron_iter(self.cron or "", self.zone or "UTC", dt)

    def between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """Occurrences in (start, end], earliest first, at most ``limit`` of them."""
        out: list[datetime] = []
        if limit <= 0:
            return out
        for cur in self.iter_after(start):
            if cur > end:
                break
            out.append(cur)
            if len(out) >= limit:
                break
        return out

    def last_at_or_before(self, dt: datetime, count: int) -> datetime:
        """The earliest of the ``count`` most recent occurrences at or before ``dt`` (cron only; an interval
        schedule computes it by arithmetic in ``advance``)."""
        tz = _zone(self.zone or "UTC")
        it = CronSim(self.cron or "", (dt + _ONE_US).astimezone(tz), reverse=True)
        found = dt
        n = 0
        while n < count:
            local = next(it)
            if local.fold == 1 and _is_repeated(local, tz):
                continue  # the second pass of a repeated local time never fires (_cron_after)
            found = _utc(local)
            n += 1
        return found

    def first_candidates(self, now: datetime) -> list[datetime]:
        """Cron: the first occurrence is the earliest candidate after the DATABASE's now (the apply statement
        picks it): every occurrence within ``SKEW_MS`` of this broker's clock, and the first past that."""
        margin = timedelta(milliseconds=SKEW_MS)
        out: list[datetime] = []
        for cur in self.iter_after(now - margin):
            out.append(cur)
            if cur > now + margin or len(out) >= MAX_CANDIDATES:
                break
        return out


def _zone(name: str) -> ZoneInfo:
    return _zone_cached(name)


@lru_cache(maxsize=512)
def _zone_cached(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _utc(dt: datetime) -> datetime:
    return dt.astimezone(UTC)


@lru_cache(maxsize=8192)
def _cron_after(expr: str, zone: str, dt: datetime) -> datetime:
    """cronsim's next instant after ``dt`` in ``zone``, with the repeated-hour rule (``_cron_iter``).
    Cached: schedules that share an expression and a zone are due at the same instants, so a sweep of
    10,000 every-minute schedules asks this once per minute, not 10,000 times (the whole next-occurrence
    step, ids and txns included: 152 -> 41 us per occurrence in the broker, ``queen loadtest recurring
    --mode minute`` with 10,000 schedules on a loaded 2-CPU machine)."""
    for at in _cron_iter(expr, zone, dt):
        return at
    raise RecurError("timers_bad_cron", f"cron expression {expr!r} has no occurrence", "cron")


def _cron_iter(expr: str, zone: str, dt: datetime) -> Iterator[datetime]:
    """cronsim's instants after ``dt`` in ``zone`` (UTC), with the repeated-hour rule applied: cronsim fires
    a step or wildcard hour in both passes of a fall-back hour; the second pass (``fold`` 1) of a local
    time is dropped here, so every local time fires at most once. Ends after 4 * 3600 dropped instants in
    a row (more than one repeated hour of every-second occurrences: an expression that never fires)."""
    tz = _zone(zone)
    it = CronSim(expr, dt.astimezone(tz))
    dropped = 0
    while dropped < 4 * 3600:
        local = next(it)
        if local.fold == 1 and _is_repeated(local, tz):
            dropped += 1
            continue
        dropped = 0
        yield _utc(local)


def _is_repeated(local: datetime, tz: ZoneInfo) -> bool:
    """The wall time exists twice (its fold 0 and fold 1 are different instants)."""
    naive = local.replace(tzinfo=None)
    return naive.replace(tzinfo=tz, fold=0).utcoffset() != naive.replace(tzinfo=tz, fold=1).utcoffset()


@lru_cache(maxsize=4096)
def from_stored(stored: str) -> tuple[Schedule, str]:
    """A ``queen_timers.recur`` value back into its schedule and base txn (cached: the sweeper reads the
    same few schedules over and over)."""
    raw = orjson.loads(stored)
    sched = Schedule(raw.get("cron"), raw.get("timeZone"), raw.get("everyMs"), raw.get("missed") or "once")
    return sched, raw["txn"]


def occurrence_txn(base: str, at: datetime) -> str:
    """The frame txn of one occurrence: the schedule's txn and the occurrence's instant (UTC, microseconds),
    the same text the database writes for the first one (queen_timers_recur_apply). One occurrence, one
    txn: a second fire of an occurrence would meet the log's (partition, txn) idempotency."""
    return f"{base}@{iso_us(at)}"


# ---------------------------------------------------------------------- the policy
@dataclass(frozen=True)
class Advance:
    """What the sweeper does with a due occurrence: ``fire`` it or not, and the row's next occurrence."""

    fire: bool
    next_at: datetime
    skipped: int  # occurrences passed over without a frame (missed ones not fired)


def advance(sched: Schedule, due: datetime, now: datetime) -> Advance:
    """The occurrence ``due`` is being fired at ``now`` (the database's clock): fire it or not, and where
    the schedule goes next, by its missed policy (module docstring)."""
    o1 = sched.after(due)
    if o1 > now:  # the next occurrence is still ahead: nothing else was missed
        if sched.missed == "skip" and now - due > timedelta(milliseconds=SKIP_GRACE_MS):
            return Advance(False, o1, 1)
        return Advance(True, o1, 0)
    if sched.missed == "once":
        nxt = sched.next_after_now(due, now)
        return Advance(True, nxt, _count(sched, due, now) - 1)
    if sched.missed == "skip":
        nxt = sched.next_after_now(due, now)
        return Advance(False, nxt, _count(sched, due, now))
    # all: oldest first, bounded to the CATCH_UP_MAX most recent
    due_count = _count(sched, due, now, cap=CATCH_UP_MAX + 1)
    if due_count <= CATCH_UP_MAX:
        return Advance(True, o1, 0)
    if sched.every_ms is not None:
        step = timedelta(milliseconds=sched.every_ms)
        behind = (now - due) // step  # occurrences after `due` that are due
        first_kept = due + (behind - CATCH_UP_MAX + 1) * step
    else:
        first_kept = sched.last_at_or_before(now, CATCH_UP_MAX)
    return Advance(False, first_kept, _count(sched, due, first_kept) - 1)


def _count(sched: Schedule, due: datetime, now: datetime, cap: int = 10**9) -> int:
    """Occurrences in [due, now] (``due`` itself included), at most ``cap`` (cron walks them: bounded)."""
    if sched.every_ms is not None:
        return min(cap, 1 + (now - due) // timedelta(milliseconds=sched.every_ms))
    return 1 + len(sched.between(due, now, min(cap, CATCH_UP_MAX + 1) - 1))


# ---------------------------------------------------------------------- the wire
def parse(raw: Any, *, has_delay: bool) -> Schedule:
    """The wire's ``recur`` object -> a ``Schedule``, or ``RecurError`` naming the field at fault."""
    if not isinstance(raw, dict):
        raise RecurError("timers_bad_recur", "`recur` must be an object: {cron, timeZone} or {everyMs}", "recur")
    for field in raw:
        if field not in _FIELDS:
            raise RecurError("timers_bad_recur", f"`recur.{field}` is not a field of a recurring schedule", f"recur.{field}")
    cron = raw.get("cron")
    zone = raw.get("timeZone")
    every = raw.get("everyMs")
    missed = raw.get("missed")
    if missed is None:
        missed = "once"
    if missed not in MISSED:
        raise RecurError("timers_bad_missed", f"`recur.missed` must be one of {', '.join(MISSED)}", "recur.missed")
    if (cron is None) == (every is None):
        raise RecurError("timers_recur_conflict", "`recur` carries exactly one of `cron` and `everyMs`", "recur")
    if every is not None:
        if zone is not None:
            raise RecurError("timers_recur_conflict", "`recur.timeZone` belongs to a cron schedule, not to `everyMs`",
                             "recur.timeZone")
        if isinstance(every, bool) or not isinstance(every, int):
            raise RecurError("timers_bad_interval", "`recur.everyMs` must be an integer number of milliseconds",
                             "recur.everyMs")
        if every < MIN_EVERY_MS:
            raise RecurError("timers_interval_too_small", f"`recur.everyMs` must be at least {MIN_EVERY_MS}",
                             "recur.everyMs")
        if every > MAX_EVERY_MS:
            raise RecurError("timers_bad_interval", f"`recur.everyMs` must be at most {MAX_EVERY_MS}", "recur.everyMs")
        return Schedule(None, None, every, missed)
    if has_delay:
        raise RecurError("timers_recur_conflict",
                         "`delayMs` cannot go with a cron schedule: its first occurrence is the next cron instant",
                         "delayMs")
    if not isinstance(cron, str) or not cron.strip() or len(cron) > MAX_CRON or "\x00" in cron:
        raise RecurError("timers_bad_cron", f"`recur.cron` must be a cron expression of at most {MAX_CRON} characters",
                         "recur.cron")
    cron = " ".join(cron.split())
    if zone is None:
        zone = "UTC"
    if not isinstance(zone, str) or not zone or len(zone) > MAX_ZONE or "\x00" in zone:
        raise RecurError("timers_unknown_zone", "`recur.timeZone` must be an IANA time zone name", "recur.timeZone")
    try:
        _zone(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise RecurError("timers_unknown_zone", f"`recur.timeZone` {zone!r} is not an IANA time zone", "recur.timeZone") from None
    _check_cron(cron, zone)
    return Schedule(cron, zone, None, missed)


@lru_cache(maxsize=1024)
def _check_cron(expr: str, zone: str) -> None:
    """Parse, and find a first occurrence (an expression that never fires, such as 30 February, is refused)."""
    if len(expr.split()) not in (5, 6):
        raise RecurError("timers_bad_cron", "`recur.cron` must have 5 fields (or 6, seconds first)", "recur.cron")
    try:
        _cron_after(expr, zone, datetime.now(UTC))
    except (CronSimError, StopIteration, ValueError, OverflowError) as exc:
        detail = str(exc) if isinstance(exc, CronSimError) else "it has no occurrence"
        raise RecurError("timers_bad_cron", f"`recur.cron` {expr!r} is not a valid cron expression: {detail}",
                         "recur.cron") from None
    # A seconds field that fires more often than once a second cannot exist; every-second is the floor.


def first_delay_ms(sched: Schedule, delay_ms: int | None, now: datetime) -> int:
    """For the plan's horizon check: how far ahead (by this broker's clock) the first occurrence is."""
    if sched.every_ms is not None:
        return sched.every_ms if delay_ms is None else delay_ms
    first = sched.after(now)
    return int((first - now) / timedelta(milliseconds=1))


def period_ms(sched: Schedule, now: datetime) -> int:
    """The gap between two occurrences (cron: the first two from now): the horizon bounds it too."""
    if sched.every_ms is not None:
        return sched.every_ms
    first = sched.after(now)
    return int((sched.after(first) - first) / timedelta(milliseconds=1))
