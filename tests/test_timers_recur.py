"""broker/timers/recur.py: parsing the wire's ``recur`` object, next occurrences (DST gap and overlap in
Europe/Berlin and America/New_York), the missed-fire policies and their bound. No database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from broker.timers import recur
from broker.timers.recur import (
    CATCH_UP_MAX,
    SKIP_GRACE_MS,
    RecurError,
    Schedule,
    advance,
    occurrence_txn,
    parse,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


def cron(expr: str, zone: str = "UTC", missed: str = "once") -> Schedule:
    return parse({"cron": expr, "timeZone": zone, "missed": missed}, has_delay=False)


def every(ms: int, missed: str = "once") -> Schedule:
    return parse({"everyMs": ms, "missed": missed}, has_delay=False)


def walk(s: Schedule, start: datetime, n: int) -> list[datetime]:
    out, cur = [], start
    for _ in range(n):
        cur = s.after(cur)
        out.append(cur)
    return out


# ------------------------------------------------------------------ next occurrences
def test_cron_next_is_strictly_after_and_from_the_schedule() -> None:
    s = cron("*/15 * * * *")
    assert s.after(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 10, 15)
    assert s.after(utc(2026, 1, 1, 10, 0, 0) + timedelta(microseconds=1)) == utc(2026, 1, 1, 10, 15)
    # from the occurrence, never from a late fire: the chain is the same whenever each one fired
    assert walk(s, utc(2026, 1, 1, 10, 0), 4) == [utc(2026, 1, 1, 10, m) for m in (15, 30, 45)] + [utc(2026, 1, 1, 11)]


def test_six_fields_have_seconds_first() -> None:
    s = cron("*/20 * * * * *")
    assert walk(s, utc(2026, 1, 1), 3) == [utc(2026, 1, 1, 0, 0, 20), utc(2026, 1, 1, 0, 0, 40), utc(2026, 1, 1, 0, 1)]


def test_zone_is_applied() -> None:
    s = cron("0 9 * * *", "Europe/Berlin")
    assert s.after(utc(2026, 1, 15, 12)) == utc(2026, 1, 16, 8)  # CET = UTC+1
    assert s.after(utc(2026, 7, 15, 12)) == utc(2026, 7, 16, 7)  # CEST = UTC+2


def test_interval_is_anchored_on_the_occurrence() -> None:
    s = every(1_500)
    t0 = utc(2026, 1, 1, 0, 0, 0)
    assert walk(s, t0, 3) == [t0 + timedelta(milliseconds=1_500 * k) for k in (1, 2, 3)]


# ------------------------------------------------------------------ DST
def test_berlin_gap_fires_once_at_the_next_valid_instant() -> None:
    # 2026-03-29: 02:00 CET -> 03:00 CEST; 02:30 does not exist that day.
    s = cron("30 2 * * *", "Europe/Berlin")
    got = walk(s, datetime(2026, 3, 28, 12, tzinfo=BERLIN).astimezone(UTC), 3)
    assert got[0] == utc(2026, 3, 29, 1, 0)  # 03:00 CEST, the first valid instant after the gap
    assert got[1] == utc(2026, 3, 30, 0, 30)  # 02:30 CEST
    assert got[2] == utc(2026, 3, 31, 0, 30)


def test_berlin_overlap_fires_once() -> None:
    # 2026-10-25: 03:00 CEST -> 02:00 CET; 02:30 happens twice. It fires once, at its first pass (CEST).
    s = cron("30 2 * * *", "Europe/Berlin")
    got = walk(s, utc(2026, 10, 24, 12), 2)
    assert got == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_repeated_hour_fires_each_local_time_once_even_with_a_step() -> None:
    # */30 in the repeated hour of New York (2026-11-01, 02:00 EDT -> 01:00 EST): 01:00 and 01:30 local
    # exist twice; each fires once (first pass), then 02:00 EST.
    s = cron("*/30 * * * *", "America/New_York")
    start = datetime(2026, 11, 1, 0, 30, tzinfo=NEW_YORK).astimezone(UTC)
    got = [d.astimezone(NEW_YORK) for d in walk(s, start, 4)]
    assert [(d.hour, d.minute, d.utcoffset()) for d in got] == [
        (1, 0, timedelta(hours=-4)), (1, 30, timedelta(hours=-4)), (2, 0, timedelta(hours=-5)),
        (2, 30, timedelta(hours=-5))]


def test_new_york_gap() -> None:
    # 2026-03-08: 02:00 EST -> 03:00 EDT; 02:15 does not exist: it fires at 03:00 EDT.
    s = cron("15 2 * * *", "America/New_York")
    got = walk(s, utc(2026, 3, 7, 12), 2)
    assert got == [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 15)]


# ------------------------------------------------------------------ missed policies
def test_on_time_fires_and_moves_to_the_next() -> None:
    s = every(1_000, "all")
    due = utc(2026, 1, 1)
    a = advance(s, due, due + timedelta(milliseconds=3))
    assert a.fire and a.next_at == due + timedelta(seconds=1) and a.skipped == 0


def test_once_fires_one_for_everything_missed() -> None:
    s = cron("* * * * *", missed="once")
    due = utc(2026, 1, 1, 10, 0)
    now = utc(2026, 1, 1, 10, 7, 30)
    a = advance(s, due, now)
    assert a.fire and a.next_at == utc(2026, 1, 1, 10, 8) and a.skipped == 7


def test_skip_fires_nothing_missed() -> None:
    s = every(60_000, "skip")
    due = utc(2026, 1, 1, 10, 0)
    a = advance(s, due, utc(2026, 1, 1, 10, 5, 1))
    assert not a.fire and a.next_at == utc(2026, 1, 1, 10, 6) and a.skipped == 6


def test_skip_tells_a_late_fire_from_a_missed_one() -> None:
    s = cron("0 3 * * *", missed="skip")
    due = utc(2026, 1, 1, 3)
    assert advance(s, due, due + timedelta(milliseconds=SKIP_GRACE_MS - 1)).fire
    late = advance(s, due, due + timedelta(milliseconds=SKIP_GRACE_MS + 1))
    assert not late.fire and late.next_at == utc(2026, 1, 2, 3)


def test_all_fires_each_missed_oldest_first() -> None:
    s = cron("* * * * *", missed="all")
    due, now = utc(2026, 1, 1, 10, 0), utc(2026, 1, 1, 10, 3, 10)
    fired = []
    while due <= now:
        a = advance(s, due, now)
        if a.fire:
            fired.append(due)
        due = a.next_at
    assert fired == [utc(2026, 1, 1, 10, m) for m in range(4)] and due == utc(2026, 1, 1, 10, 4)


@pytest.mark.parametrize("sched", [every(1_000, "all"), cron("* * * * * *", missed="all")], ids=["every", "cron"])
def test_all_is_bounded_to_the_most_recent(sched: Schedule) -> None:
    due = utc(2026, 1, 1)
    now = due + timedelta(seconds=10_000, milliseconds=500)  # 10,001 occurrences due
    fired = []
    while due <= now:
        a = advance(sched, due, now)
        if a.fire:
            fired.append(due)
        due = a.next_at
    assert len(fired) == CATCH_UP_MAX
    assert fired[-1] == utc(2026, 1, 1) + timedelta(seconds=10_000)
    assert fired == sorted(set(fired))  # each once, oldest first
    assert due == utc(2026, 1, 1) + timedelta(seconds=10_001)


# ------------------------------------------------------------------ the wire
@pytest.mark.parametrize(
    ("raw", "has_delay", "reason"),
    [
        ({"cron": "61 * * * *"}, False, "timers_bad_cron"),
        ({"cron": "* * *"}, False, "timers_bad_cron"),
        ({"cron": "0 0 30 2 *"}, False, "timers_bad_cron"),
        ({"cron": 5}, False, "timers_bad_cron"),
        ({"cron": "* * * * *", "timeZone": "Mars/Olympus"}, False, "timers_unknown_zone"),
        ({"cron": "* * * * *", "timeZone": "../../etc/passwd"}, False, "timers_unknown_zone"),
        ({"cron": "* * * * *"}, True, "timers_recur_conflict"),
        ({"cron": "* * * * *", "everyMs": 1000}, False, "timers_recur_conflict"),
        ({}, False, "timers_recur_conflict"),
        ({"everyMs": 1000, "timeZone": "UTC"}, False, "timers_recur_conflict"),
        ({"everyMs": 999}, False, "timers_interval_too_small"),
        ({"everyMs": 1.5}, False, "timers_bad_interval"),
        ({"everyMs": True}, False, "timers_bad_interval"),
        ({"everyMs": 1000, "missed": "sometimes"}, False, "timers_bad_missed"),
        ({"everyMs": 1000, "jitter": 3}, False, "timers_bad_recur"),
        ("0 * * * *", False, "timers_bad_recur"),
    ],
)
def test_bad_recur_is_refused_with_its_reason(raw: object, has_delay: bool, reason: str) -> None:
    with pytest.raises(RecurError) as err:
        parse(raw, has_delay=has_delay)
    assert err.value.reason == reason


def test_stored_round_trip_and_occurrence_txn() -> None:
    s = cron("0 9 * * 1-5", "Europe/Berlin", "all")
    back, base = recur.from_stored(s.stored("report"))
    assert back == s and base == "report"
    assert s.wire() == {"cron": "0 9 * * 1-5", "timeZone": "Europe/Berlin", "missed": "all"}
    assert occurrence_txn("report", utc(2026, 1, 5, 8)) == "report@2026-01-05T08:00:00.000000Z"


def test_first_candidates_cover_the_clock_margin() -> None:
    s = cron("* * * * * *")
    now = utc(2026, 1, 1, 12, 0, 0) + timedelta(milliseconds=300)
    c = s.first_candidates(now)
    assert c[0] <= now - timedelta(seconds=4) and c[-1] > now + timedelta(seconds=5)
    assert c == sorted(c) and len(c) <= recur.MAX_CANDIDATES
    yearly = cron("0 0 1 1 *")
    assert yearly.first_candidates(now) == [utc(2027, 1, 1)]
