"""Recurring timers end to end through HTTP (docs/concepts/recurring-schedules.md): create, replace,
pause, resume, cancel, peek and list; bad input; the fires at a consumer, missed-fire policies after a
pause, metering, encryption; and two ``queen serve`` on one database firing an every-second schedule
with no occurrence missed or doubled."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest
from conftest import uniq
from helpers import authed, b64, db_fetch, dedicated_broker, refused, wait_for

from broker.errors import TIMERS_HINT_HEADER, TIMERS_HINT_VALUE
from broker.store.queries import Q
from broker.timers.calls import TimersRecurApply


def every(queue: str, key: str, ms: int = 1_000, *, txn: str | None = None, missed: str | None = None,
          delay: int | None = None, payload: bytes = b'{"tick": true}', op: str = "schedule", **extra: object) -> dict:
    recur: dict = {"everyMs": ms}
    if missed:
        recur["missed"] = missed
    body = {"op": op, "queue": queue, "timerKey": key, "txn": txn or uniq("rt"), "payload": b64(payload),
            "recur": recur, **extra}
    if delay is not None:
        body["delayMs"] = delay
    return body


def cron(queue: str, key: str, expr: str, zone: str | None = None, **extra: object) -> dict:
    recur: dict = {"cron": expr}
    if zone:
        recur["timeZone"] = zone
    return {"op": "schedule", "queue": queue, "timerKey": key, "txn": uniq("rc"), "payload": b64(b'{"c": 1}'),
            "recur": recur, **extra}


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def occurrences(dsn: str, txn_base: str) -> list[str]:
    """The frames of one schedule in the log, by their occurrence txn."""
    return [r["txn"] for r in db_fetch(dsn, "SELECT txn FROM queen_messages WHERE txn LIKE $1 ORDER BY txn",
                                       txn_base + "@%")]


# ------------------------------------------------------------------ create, peek, fire
def test_interval_schedule_fires_each_occurrence_from_the_schedule(api, broker):
    q, txn = uniq("rq"), uniq("base")
    [res] = api.timer_results(every(q, "tick", 1_000, txn=txn, delay=0, missed="all"))
    assert res["ok"] and res["status"] == "scheduled"
    assert res["recur"] == {"everyMs": 1000, "missed": "all"}
    assert res["txn"].startswith(txn + "@")
    first = ts(res["deliverAt"])
    got = wait_for(lambda: len(o := occurrences(broker.dsn, txn)) >= 3 and o, timeout=10, what="three occurrences")
    instants = [ts(t.split("@", 1)[1]) for t in got]
    # anchored on the schedule: first, first + 1 s, first + 2 s, exactly (no drift from fire times)
    assert instants[:3] == [first + timedelta(seconds=k) for k in range(3)]
    body = api.peek(q, "tick").json()
    assert body["found"] and body["recur"] == {"everyMs": 1000, "missed": "all"} and body["recurTxn"] == txn
    assert body["occurrences"] >= 3 and body["paused"] is False and body["lastFiredAt"]
    assert ts(body["deliverAt"]) > instants[2] and body["txn"] == f"{txn}@{body['deliverAt']}"
    msgs = api.pop_until(q, 3)
    assert {m["data"]["tick"] for m in msgs} == {True}
    assert api.cancel(q, "tick").json()["status"] == "cancelled"
    n = len(occurrences(broker.dsn, txn))
    time.sleep(1.5)
    assert len(occurrences(broker.dsn, txn)) == n  # cancelled: nothing more
    assert api.peek(q, "tick").json()["found"] is False


def test_cron_schedule_with_seconds_and_zone(api, broker):
    q = uniq("rq")
    op = cron(q, "c", "* * * * * *", "Europe/Berlin")
    [res] = api.timer_results(op)
    assert res["status"] == "scheduled" and res["recur"] == {"cron": "* * * * * *", "timeZone": "Europe/Berlin",
                                                             "missed": "once"}
    assert ts(res["deliverAt"]).microsecond == 0  # a cron instant: a whole second
    wait_for(lambda: len(occurrences(broker.dsn, op["txn"])) >= 2, timeout=10, what="two cron occurrences")
    api.cancel(q, "c")


def test_list_shows_recurring_beside_one_shot(api):
    q = uniq("rq")
    api.timer_results(every(q, "a-rec", 60_000), {"op": "schedule", "queue": q, "timerKey": "b-once",
                                                    "txn": uniq("o"), "payload": b64(b"{}"), "delayMs": 60_000})
    rows = api.list_timers(q).json()["rows"]
    assert [r["timerKey"] for r in rows] == ["a-rec", "b-once"]
    assert rows[0]["recur"] == {"everyMs": 60000, "missed": "once"} and rows[0]["paused"] is False
    assert "recur" not in rows[1]  # a one-shot timer's row is as it was


# ------------------------------------------------------------------ replace, pause, resume
def test_replace_pause_resume_and_their_statuses(api, broker):
    q = uniq("rq")
    [a] = api.timer_results(every(q, "k", 60_000))
    [b] = api.timer_results(every(q, "k", 2_000, missed="skip", delay=100_000))
    assert b["status"] == "rescheduled" and b["messageId"] != a["messageId"]
    assert api.peek(q, "k").json()["recur"] == {"everyMs": 2000, "missed": "skip"}
    [p] = api.timer_results({"op": "pause", "queue": q, "timerKey": "k"})
    assert p == {"ok": True, "status": "paused", "queue": q, "timerKey": "k", "txn": b["txn"],
                 "messageId": b["messageId"], "deliverAt": b["deliverAt"]}
    assert api.peek(q, "k").json()["paused"] is True
    assert api.timer_results({"op": "pause", "queue": q, "timerKey": "k"})[0]["status"] == "paused"  # idempotent
    [r] = api.timer_results({"op": "resume", "queue": q, "timerKey": "k"})
    assert r["ok"] and r["status"] == "resumed" and r["deliverAt"] == b["deliverAt"]
    assert api.peek(q, "k").json()["paused"] is False
    # pause / resume of a one-shot timer or of nothing
    api.timer_results({"op": "schedule", "queue": q, "timerKey": "once", "txn": "o1", "payload": b64(b"{}"),
                       "delayMs": 60_000})
    res = api.timer_results({"op": "pause", "queue": q, "timerKey": "once"},
                            {"op": "resume", "queue": q, "timerKey": "nothing"})
    assert [(x["ok"], x["status"]) for x in res] == [(False, "not_recurring"), (False, "absent")]
    # a one-shot schedule on a recurring key replaces it with a one-shot timer
    [o] = api.timer_results({"op": "schedule", "queue": q, "timerKey": "k", "txn": "plain", "payload": b64(b"{}"),
                             "delayMs": 60_000})
    assert o["status"] == "rescheduled"
    assert "recur" not in api.peek(q, "k").json()


def test_one_batch_answers_every_status_in_its_own_order(api):
    """The apply is set-based (a statement per kind, not per op): the answers still come back in the
    batch's order, not the key order the rows are locked and written in."""
    q = uniq("rq")
    api.timer_results(every(q, "b-old", 60_000), every(q, "d-paused", 60_000))
    api.timer_results({"op": "schedule", "queue": q, "timerKey": "e-plain", "txn": "p", "payload": b64(b"{}"),
                       "delayMs": 60_000})
    api.timer_results({"op": "pause", "queue": q, "timerKey": "d-paused"})
    res = api.timer_results(
        {"op": "resume", "queue": q, "timerKey": "d-paused"},
        every(q, "z-new", 60_000),
        {"op": "pause", "queue": q, "timerKey": "e-plain"},
        {"op": "pause", "queue": q, "timerKey": "c-none"},
        every(q, "b-old", 30_000),
        cron(q, "a-cron", "30 9 * * *", "Asia/Tokyo"),
    )
    assert [r["status"] for r in res] == ["resumed", "scheduled", "not_recurring", "absent", "rescheduled",
                                          "scheduled"]
    assert [r["timerKey"] for r in res] == ["d-paused", "z-new", "e-plain", "c-none", "b-old", "a-cron"]
    assert api.peek(q, "d-paused").json()["paused"] is False
    assert api.peek(q, "b-old").json()["recur"]["everyMs"] == 30_000
    assert ts(res[5]["deliverAt"]).astimezone(ZoneInfo("Asia/Tokyo")).strftime("%H:%M") == "09:30"


def test_concurrent_batches_over_the_same_keys_all_apply(api, broker):
    """Eight callers at once, each one batch over the same 60 keys (some new, some existing, some paused or
    resumed) in its own order: the rows are locked in key order, so every call answers 200 and none waits
    on a deadlock; every key ends up recurring."""
    q = uniq("rq")
    keys = [f"k{i:02d}" for i in range(60)]
    api.timer_results(*[every(q, k, 60_000) for k in keys[::2]])

    def batch(n: int) -> list[dict]:
        order = keys[n % 7:] + keys[:n % 7]
        if n % 2:
            order.reverse()
        ops: list[dict] = []
        for i, k in enumerate(order):
            if i % 5 == 4:
                ops.append({"op": "pause" if n % 2 else "resume", "queue": q, "timerKey": k})
            else:
                ops.append(every(q, k, 60_000 + n))
        return ops

    def post(n: int) -> httpx.Response:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            return c.post("/api/v1/timers", json={"operations": batch(n)})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    assert [a.status_code for a in answers] == [200] * 8, [a.text[:200] for a in answers]
    rows = db_fetch(broker.dsn, "SELECT count(*) AS n, count(recur) AS r FROM queen_timers WHERE queue = $1", q)
    assert (rows[0]["n"], rows[0]["r"]) == (60, 60)


def _cron_apply(keys: list[str], cands: list[tuple[int, datetime]]) -> TimersRecurApply:
    n = len(keys)
    return TimersRecurApply(
        tenant="clock", sub="s", check_switch=False, near_ms=-1, ops=["schedule"] * n, queues=["q"] * n,
        keys=keys, partitions=[None] * n, txns=[f"t-{k}" for k in keys], ids=[str(uuid.uuid4()) for _ in keys],
        payloads=[b"{}"] * n,
        zstd=[False] * n, key_ids=[None] * n, recur=['{"cron": "0 * * * *", "timeZone": "UTC", "missed": "once"}'] * n,
        delays_ms=[None] * n, cand_idx=[i for i, _ in cands], cands=[t for _, t in cands], meter_period_s=0)


async def test_a_cron_first_occurrence_is_chosen_by_the_database_clock(pg):
    """The broker sends candidates around its own clock; the database keeps the earliest after ITS now,
    and refuses the whole call (QT003: 503 timers_clock_skew) when a schedule has none, writing nothing."""
    conn = await asyncpg.connect(pg.new_db())
    try:
        now = await conn.fetchval("SELECT now()")
        past, soon, later = now - timedelta(hours=1), now + timedelta(hours=1), now + timedelta(hours=2)
        call = _cron_apply(["a", "b"], [(1, past), (1, later), (1, soon), (2, past)])
        with pytest.raises(asyncpg.PostgresError) as refused_call:
            await conn.fetch(Q.timers_recur_apply, *call.args())
        assert refused_call.value.sqlstate == "QT003"
        assert await conn.fetchval("SELECT count(*) FROM queen_timers WHERE tenant = 'clock'") == 0
        call = _cron_apply(["a", "b"], [(1, past), (1, later), (1, soon), (2, later)])
        rows = await conn.fetch(Q.timers_recur_apply, *call.args())
        assert [(r["status"], r["deliver_at"]) for r in rows] == [("scheduled", soon), ("scheduled", later)]
        assert rows[0]["txn"].startswith("t-a@")
    finally:
        await conn.close()


def test_paused_schedule_does_not_fire_and_resume_applies_the_missed_policy(api, broker):
    q = uniq("rq")
    ops = {name: every(q, name, 1_000, missed=name, delay=0) for name in ("once", "all", "skip")}
    api.timer_results(*ops.values())
    for name in ops:
        wait_for(lambda n=name: occurrences(broker.dsn, ops[n]["txn"]), timeout=10, what=f"{name} fired")
    api.timer_results(*({"op": "pause", "queue": q, "timerKey": name} for name in ops))
    before = {name: len(occurrences(broker.dsn, op["txn"])) for name, op in ops.items()}
    time.sleep(4.2)  # ~4 occurrences missed while paused
    assert {name: len(occurrences(broker.dsn, op["txn"])) for name, op in ops.items()} == before
    resumed_at = db_fetch(broker.dsn, "SELECT now() AS t")[0]["t"]
    api.timer_results(*({"op": "resume", "queue": q, "timerKey": name} for name in ops))
    time.sleep(2.5)  # the catch-up fires at once; the schedules then go on

    def missed_frames(name: str) -> list[datetime]:
        """Frames since the pause of occurrences that fell while paused (before the resume)."""
        new = occurrences(broker.dsn, ops[name]["txn"])[before[name]:]
        return [t for t in (ts(x.split("@", 1)[1]) for x in new) if t < resumed_at]

    assert len(missed_frames("once")) == 1  # one frame for everything missed
    assert len(missed_frames("all")) >= 4  # every missed occurrence
    assert missed_frames("skip") == []  # nothing missed fires
    for name, op in ops.items():  # and each goes on with its schedule
        assert len(occurrences(broker.dsn, op["txn"])) > before[name] + len(missed_frames(name))
    api.timer_results(*({"op": "cancel", "queue": q, "timerKey": name} for name in ops))


# ------------------------------------------------------------------ bad input: 400, nothing changed
@pytest.mark.parametrize(
    ("recur", "extra", "reason"),
    [
        ({"cron": "0 25 * * *"}, {}, "timers_bad_cron"),
        ({"cron": "0 9 * * *", "timeZone": "Europe/Atlantis"}, {}, "timers_unknown_zone"),
        ({"everyMs": 500}, {}, "timers_interval_too_small"),
        ({"everyMs": 1000, "cron": "* * * * *"}, {}, "timers_recur_conflict"),
        ({"cron": "* * * * *"}, {"delayMs": 1000}, "timers_recur_conflict"),
        ({"everyMs": 1000, "missed": "never"}, {}, "timers_bad_missed"),
        ({"everyMs": 1000}, {"delayMs": -1}, "timers_bad_delay"),
    ],
)
def test_bad_schedules_are_400_and_change_nothing(api, recur, extra, reason):
    q = uniq("rq")
    good = every(q, "fine", 60_000)
    bad = {"op": "schedule", "queue": q, "timerKey": "bad", "txn": "t", "payload": b64(b"{}"), "recur": recur, **extra}
    body = refused(api.timers(good, bad), 400, "timers_bad_request", reason)
    assert body["index"] == 1 and body["detail"]
    assert api.list_timers(q).json()["rows"] == []


def test_recurring_payload_must_be_json_and_pause_takes_no_payload(api):
    q = uniq("rq")
    refused(api.timers(every(q, "k", payload=b"not json")), 400, "timers_bad_request", "timers_payload_not_json")
    refused(api.timers({"op": "pause", "queue": q, "timerKey": "k", "payload": b64(b"{}")}), 400,
            "timers_bad_request", "timers_unknown_field")
    assert api.list_timers(q).json()["rows"] == []


def test_horizon_bounds_a_recurring_schedule(api):
    q = uniq("rq")
    # the default horizon is 90 days: a yearly schedule's period is beyond it
    refused(api.timers(cron(q, "y", "0 0 1 1 *")), 403, "timer_horizon_exceeded")


# ------------------------------------------------------------------ mixed batch, rider
def test_mixed_batch_is_one_transaction(api):
    q = uniq("rq")
    once = {"op": "schedule", "queue": q, "timerKey": "o", "txn": "o", "payload": b64(b"{}"), "delayMs": 60_000}
    res = api.timer_results(once, every(q, "r", 60_000), {"op": "pause", "queue": q, "timerKey": "none"})
    assert [x["status"] for x in res] == ["scheduled", "scheduled", "absent"]
    assert "recur" not in res[0] and res[1]["recur"]


def test_transaction_rider_schedules_a_recurring_timer(api):
    q = uniq("rq")
    body = api.tx({"operations": [{"type": "push", "items": [{"queue": q, "payload": {"p": 1}, "transactionId": uniq()}]}],
                   "timers": [every(q, "rid", 60_000)]})
    timer = [r for r in body["results"] if r.get("type") == "timer"]
    assert timer and timer[0]["status"] == "scheduled" and timer[0]["recur"]["everyMs"] == 60_000


# ------------------------------------------------------------------ two brokers
def test_two_brokers_fire_every_second_schedules_once_each(start_broker):
    """Two ``queen serve`` (2 workers each: four sweepers) on one database; 5 every-second schedules for
    ~6 s; every occurrence between the first and the last reaches the consumer exactly once."""
    env = {"QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}
    one = start_broker(env=env)
    two = start_broker(env=env, dsn=one.dsn)
    q = uniq("rq2")
    with httpx.Client(base_url=one.url, timeout=30) as h1, httpx.Client(base_url=two.url, timeout=30) as h2:
        bases = [uniq(f"s{i}") for i in range(5)]
        r = h1.post("/api/v1/timers", json={"operations": [
            every(q, f"k{i}", 1_000, txn=b, delay=0, missed="all") for i, b in enumerate(bases)]})
        assert r.status_code == 200, r.text
        seen: list[str] = []
        deadline = time.monotonic() + 6.5
        while time.monotonic() < deadline:  # a long-polling consumer, alternating brokers
            client = h1 if len(seen) % 2 else h2
            ans = client.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": "500", "batch": "100",
                                                                "autoAck": "true"})
            if ans.status_code == 200:
                seen += [m["transactionId"] for m in ans.json()["messages"]]
        r = h2.post("/api/v1/timers", json={"operations": [
            {"op": "cancel", "queue": q, "timerKey": f"k{i}"} for i in range(5)]})
        assert [x["status"] for x in r.json()["results"]] == ["cancelled"] * 5
        while True:  # what fired before the cancel
            ans = h1.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": "500", "batch": "100",
                                                            "autoAck": "true"})
            if ans.status_code == 204:
                break
            seen += [m["transactionId"] for m in ans.json()["messages"]]
    for b in bases:
        mine = sorted(t for t in seen if t.startswith(b + "@"))
        assert len(mine) == len(set(mine)), f"double occurrence of {b}"
        instants = [ts(t.split("@", 1)[1]) for t in mine]
        assert len(instants) >= 5, mine
        steps = {(y - x) for x, y in zip(instants, instants[1:], strict=False)}
        assert steps == {timedelta(seconds=1)}, f"missed occurrence of {b}: {mine}"
    assert db_fetch(one.dsn, "SELECT count(*) AS n FROM queen_messages m JOIN queen_partitions p "
                                   "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.queue = $1", q)[0]["n"] == len(seen)


# ------------------------------------------------------------------ metering, encryption
def test_later_occurrences_are_metered_at_the_fire(start_broker):
    b = start_broker(env={"QUEEN_SWEEPER_MAX_SLEEP_MS": "200"})
    with httpx.Client(base_url=b.url, timeout=30) as h:
        q = uniq("rq")
        r = h.post("/api/v1/timers", json={"operations": [every(q, "m", 1_000, delay=0, missed="all")]})
        assert r.status_code == 200
        wait_for(lambda: db_fetch(b.dsn, "SELECT occurrences FROM queen_timers")[0]["occurrences"] >= 3, timeout=10)
        h.post("/api/v1/timers", json={"operations": [{"op": "pause", "queue": q, "timerKey": "m"}]})
        fired = db_fetch(b.dsn, "SELECT occurrences FROM queen_timers")[0]["occurrences"]
        metered = db_fetch(b.dsn, "SELECT coalesce(sum(messages), 0)::bigint AS n FROM queen_usage")[0]["n"]
        # one at schedule (the promise of the first occurrence), one per later occurrence at its fire
        assert metered == fired


def test_encrypted_queue_gets_sealed_occurrences(start_broker):
    import base64 as b64mod
    import os

    key = b64mod.b64encode(os.urandom(32)).decode()
    b = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{key}", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"})
    with httpx.Client(base_url=b.url, timeout=30) as h:
        q = uniq("rq")
        assert h.post("/api/v1/configure", json={"queue": q, "options": {"encryptionEnabled": True}}).status_code == 200
        r = h.post("/api/v1/timers", json={"operations": [every(q, "e", 1_000, delay=0, payload=b'{"secret": 7}')]})
        assert r.status_code == 200, r.text
        peek = h.get(f"/api/v1/timers/{q}/e").json()
        assert peek["encrypted"] is True and b"secret" not in b64mod.b64decode(peek["payload"])
        got: list = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            ans = h.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": "1000", "autoAck": "true"})
            if ans.status_code == 200:
                got += ans.json()["messages"]
        assert len(got) >= 2 and all(m["data"] == {"secret": 7} for m in got)
        stored = db_fetch(b.dsn, "SELECT m.key_id FROM queen_messages m JOIN queen_partitions p "
                          "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.queue = $1", q)
        assert stored and all(r["key_id"] for r in stored)


# ------------------------------------------------------------------ tenants, grants, rungs
SECRET = "recurring-timers-test-secret"


@pytest.fixture(scope="module")
def srv(pg, tmp_path_factory):
    env = {"QUEEN_JWT_SECRET": SECRET, "QUEEN_LIMITS_REFRESH_MS": "50", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}
    with dedicated_broker(pg, tmp_path_factory, "recurring-auth", env) as b:
        yield b


def test_tenants_are_isolated_and_pause_needs_the_produce_grant(srv):
    q = uniq("rq")
    a = authed(SECRET, srv, "tenant-a", "a", ["produce", "consume"])
    b = authed(SECRET, srv, "tenant-b", "b", ["produce", "consume"])
    reader = authed(SECRET, srv, "tenant-a", "reader", ["consume"])
    [res] = a.timer_results(every(q, "shared", 1_000, delay=0, missed="all"))
    assert res["status"] == "scheduled"
    assert b.peek(q, "shared").json()["found"] is False and b.list_timers(q).json()["rows"] == []
    assert b.timer_results({"op": "pause", "queue": q, "timerKey": "shared"})[0]["status"] == "absent"
    assert b.cancel(q, "shared").json()["status"] == "absent"
    assert reader.timers({"op": "pause", "queue": q, "timerKey": "shared"}).status_code == 403
    assert a.pop_until(q, 2)  # tenant a's schedule keeps firing into tenant a's queue
    assert b.messages(q, wait="true", timeout="1200") == []  # and nothing reaches tenant b's queue of that name
    assert a.peek(q, "shared").json()["paused"] is False
    assert a.cancel(q, "shared").json()["status"] == "cancelled"


def test_a_suspended_cluster_refuses_schedules_but_cancel_works_and_the_fire_goes_on(srv):
    q = uniq("rq")
    admin = authed(SECRET, srv, "ops", "operator", ["admin"])
    c = authed(SECRET, srv, "acme", "svc", ["produce", "consume"])
    base = uniq("susp")
    c.timer_results(every(q, "r", 1_000, txn=base, delay=0, missed="all"))
    wait_for(lambda: occurrences(srv.dsn, base), timeout=10, what="first occurrence")
    assert admin.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).status_code == 200
    try:
        r = wait_for(lambda: (x := c.timers(every(q, "new", 60_000))).status_code == 403 and x)
        assert r.headers[TIMERS_HINT_HEADER] == TIMERS_HINT_VALUE
        assert c.timers({"op": "pause", "queue": q, "timerKey": "r"}).status_code == 403  # pause is schedule-class
        n = len(occurrences(srv.dsn, base))
        wait_for(lambda: len(occurrences(srv.dsn, base)) >= n + 2, timeout=10, what="the fire goes on")
        assert c.cancel(q, "r").json()["status"] == "cancelled"  # the DELETE route always works
        assert c.peek(q, "new").json()["found"] is False
    finally:
        admin.post("/api/v1/admin/cluster/suspended", json={"suspended": False})


# ------------------------------------------------------------------ failed and held fires (test hooks)
def test_a_failed_occurrence_backs_off_and_the_schedule_keeps_its_instants(api, broker):
    q, base = uniq("rq"), uniq("fail")
    assert api.post("/api/v1/test/timers/fail", json={"queue": q, "count": 1, "class": "transient"}).status_code == 200
    [res] = api.timer_results(every(q, "f", 2_000, txn=base, delay=0, missed="all"))
    first = ts(res["deliverAt"])
    got = wait_for(lambda: len(o := occurrences(broker.dsn, base)) >= 2 and o, timeout=10, what="two occurrences")
    instants = [ts(t.split("@", 1)[1]) for t in got]
    assert instants[:2] == [first, first + timedelta(seconds=2)]  # the retried one kept its instant and its place
    assert len(got) == len(set(got))
    api.cancel(q, "f")


def test_a_held_occurrence_answers_too_late_then_fires_once(api, broker):
    q, base = uniq("rq"), uniq("held")
    assert api.post("/api/v1/test/timers/fail", json={"queue": q, "count": 1, "class": "stall", "ms": 1500}).status_code == 200
    [res] = api.timer_results(every(q, "h", 60_000, txn=base, delay=0))
    wait_for(lambda: api.peek(q, "h").json().get("claimed"), timeout=10, what="the occurrence leased")
    assert api.timer_results({"op": "pause", "queue": q, "timerKey": "h"})[0]["status"] == "too_late"
    got = wait_for(lambda: occurrences(broker.dsn, base), timeout=10, what="the held occurrence fired")
    assert got == [res["txn"]]
    body = api.peek(q, "h").json()
    assert body["claimed"] is False and body["occurrences"] == 1
    assert ts(body["deliverAt"]) == ts(res["deliverAt"]) + timedelta(seconds=60)
    api.cancel(q, "h")


def test_an_occurrence_out_of_attempts_goes_to_the_dlq_and_ends_the_schedule(start_broker):
    b = start_broker(env={"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_ATTEMPTS": "2",
                          "QUEEN_SWEEPER_BACKOFF_BASE_MS": "100", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"})
    q, base = uniq("rq"), uniq("dead")
    with httpx.Client(base_url=b.url, timeout=30) as c:
        assert c.post("/api/v1/test/timers/fail", json={"queue": q, "count": 2, "class": "permanent"}).status_code == 200
        r = c.post("/api/v1/timers", json={"operations": [every(q, "d", 1_000, txn=base, delay=0)]})
        first_txn = r.json()["results"][0]["txn"]
        [row] = wait_for(lambda: c.get("/api/v1/dlq", params={"queue": q}).json()["messages"], timeout=15)
        assert row["transactionId"] == first_txn
        assert c.get(f"/api/v1/timers/{q}/d").json()["found"] is False
        assert occurrences(b.dsn, base) == []
