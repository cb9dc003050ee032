"""Recurring timers (docs/timer-routes.md §15, docs/concepts/recurring-schedules.md): the wire of this
broker's extension. The official client has no call for them, so these are HTTP-only contracts of the
extensions profile."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from conformance.client import expect, expect_error, uniq

contract = pytest.mark.contract


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _every(api, queue: str, key: str, ms: int, **recur_extra) -> dict:
    """An interval schedule whose first occurrence is one interval away (no delayMs)."""
    op = api.schedule_op(queue, key, payload={"r": key}, recur={"everyMs": ms, **recur_extra})
    op.pop("delayMs")
    return op


def _cron(api, queue: str, key: str, expr: str, zone: str) -> dict:
    op = api.schedule_op(queue, key, payload={}, recur={"cron": expr, "timeZone": zone})
    op.pop("delayMs")  # a cron schedule's first occurrence is its next instant
    return op


@contract("REC-SCHEDULE-SHAPE")
def test_recurring_schedule_answer(api):
    q, k = uniq("q"), uniq("k")
    op = _every(api, q, k, 60_000)
    [res] = expect(api.timers([op]), 200)["results"]
    assert res["ok"] is True and res["status"] == "scheduled", res
    assert res["recur"] == {"everyMs": 60_000, "missed": "once"}, res
    assert res["txn"] == f"{op['txn']}@{res['deliverAt']}", res
    p = api.peek_ok(q, k)
    assert p["recur"] == res["recur"] and p["paused"] is False and p["occurrences"] == 0, p
    assert p["deliverAt"] == res["deliverAt"] and p["messageId"] == res["messageId"], p
    row = [r for r in expect(api.list(q), 200)["rows"] if r["timerKey"] == k]
    assert row and row[0]["recur"] == res["recur"], row
    expect(api.cancel(q, k), 200)


@contract("REC-FIRES-ON-SCHEDULE")
def test_each_occurrence_fires_once_from_the_schedule(api):
    q, k = uniq("q"), uniq("k")
    op = _every(api, q, k, 1_000, missed="all")
    op["delayMs"] = 0
    [res] = expect(api.timers([op]), 200)["results"]
    first = _ts(res["deliverAt"])
    got: list[str] = []
    deadline = time.monotonic() + 15
    while len(got) < 3 and time.monotonic() < deadline:
        got += [m["transactionId"] for m in api.pop(q, wait_ms=1000)]
    expect(api.cancel(q, k), 200)
    got += [m["transactionId"] for m in api.drain(q, settle_ms=300)]
    assert len(got) == len(set(got)), f"an occurrence fired twice: {got}"
    instants = sorted(_ts(t.split("@", 1)[1]) for t in got)
    assert len(instants) >= 3, got
    assert instants == [first + timedelta(seconds=i) for i in range(len(instants))], got


@contract("REC-PAUSE-RESUME")
def test_pause_and_resume(api):
    q, k = uniq("q"), uniq("k")
    [res] = expect(api.timers([_every(api, q, k, 60_000)]), 200)["results"]
    [p] = expect(api.timers([{"op": "pause", "queue": q, "timerKey": k}]), 200)["results"]
    assert p["ok"] is True and p["status"] == "paused" and p["deliverAt"] == res["deliverAt"], p
    assert api.peek_ok(q, k)["paused"] is True
    [r] = expect(api.timers([{"op": "resume", "queue": q, "timerKey": k}]), 200)["results"]
    assert r["ok"] is True and r["status"] == "resumed", r
    assert api.peek_ok(q, k)["paused"] is False
    once = api.schedule_op(q, uniq("once"), delay_ms=600_000)
    expect(api.timers([once]), 200)
    res2 = expect(api.timers([{"op": "pause", "queue": q, "timerKey": once["timerKey"]},
                              {"op": "resume", "queue": q, "timerKey": uniq("none")}]), 200)["results"]
    assert [(x["ok"], x["status"]) for x in res2] == [(False, "not_recurring"), (False, "absent")], res2
    expect(api.cancel(q, k), 200)
    expect(api.cancel(q, once["timerKey"]), 200)


@contract("REC-REPLACE")
def test_replace_by_key(api):
    q, k = uniq("q"), uniq("k")
    [a] = expect(api.timers([_every(api, q, k, 60_000)]), 200)["results"]
    [b] = expect(api.timers([_cron(api, q, k, "0 9 * * *", "Europe/Berlin")]), 200)["results"]
    assert b["status"] == "rescheduled" and b["messageId"] != a["messageId"], b
    assert api.peek_ok(q, k)["recur"]["cron"] == "0 9 * * *"
    [c] = expect(api.timers([api.schedule_op(q, k, delay_ms=600_000)]), 200)["results"]
    assert c["status"] == "rescheduled" and "recur" not in api.peek_ok(q, k), c
    expect(api.cancel(q, k), 200)


@contract("REC-BAD-INPUT")
@pytest.mark.parametrize("recur,extra", [
    ({"cron": "0 25 * * *"}, {}),
    ({"cron": "0 9 * * *", "timeZone": "Nowhere/Atlantis"}, {}),
    ({"everyMs": 10}, {}),
    ({"everyMs": 1000, "cron": "* * * * *"}, {}),
    ({"cron": "* * * * *"}, {"delayMs": 5}),
    ({"everyMs": 1000, "missed": "whenever"}, {}),
])
def test_bad_schedule_is_400_and_applies_nothing(api, recur, extra):
    q = uniq("q")
    good = _every(api, q, uniq("good"), 60_000)
    bad = {**api.schedule_op(q, uniq("bad")), "recur": recur, **extra}
    if "delayMs" not in extra and "cron" in recur:
        bad.pop("delayMs")
    expect_error(api.timers([good, bad]), 400)
    assert expect(api.list(q), 200)["rows"] == []


@contract("REC-CANCEL")
def test_cancel_stops_the_schedule(api):
    q, k = uniq("q"), uniq("k")
    op = _every(api, q, k, 1_000)
    op["delayMs"] = 0
    expect(api.timers([op]), 200)
    deadline = time.monotonic() + 10
    while not api.drain(q) and time.monotonic() < deadline:
        time.sleep(0.2)
    res = expect(api.cancel(q, k), 200)
    assert res["status"] == "cancelled", res
    api.drain(q, settle_ms=300)
    time.sleep(1.5)
    assert api.drain(q) == [], "a cancelled schedule fired again"
    assert api.peek_ok(q, k)["found"] is False
