"""Plans, quotas, degradation rungs, the horizon, the payload ceiling and metering.

Rungs are switched on through the admin API for tenant A (or the cell), checked, and switched off in a
``finally``; since brokers may cache plans and switches for a bounded time, every check polls until the
rung shows (or clears) instead of assuming it is immediate.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from conformance.client import assert_envelope, b64, expect, expect_error, uniq, usage_messages
from conformance.plugin import cluster_wide

contract = pytest.mark.contract

HINT = "x-queen-timers-hint"
DAY_MS = 86_400_000
RUNG_TIMEOUT = 6.0


def until_status(fn: Callable[[], httpx.Response], statuses: tuple[int, ...], what: str) -> httpx.Response:
    deadline = time.monotonic() + RUNG_TIMEOUT
    while True:
        resp = fn()
        if resp.status_code in statuses:
            return resp
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: expected HTTP {statuses}, still {resp.status_code} {resp.text[:200]}")
        time.sleep(0.05)


def push_one(api, q: str) -> httpx.Response:
    return api.push(q, [{"probe": uuid.uuid4().hex}])


@contextmanager
def rung(admin, api, name: str, tenant: str) -> Iterator[None]:
    """Turn one rung on for tenant A, yield, turn it off and wait until tenant A produces again."""
    probe_q = uniq("probe")
    if name == "rate":
        admin.set_plan(tenant, rateLimitPerS=1)
    elif name == "quota":
        admin.set_plan(tenant, periodQuotaMessages=1)
    elif name == "storage":
        admin.set_plan(tenant, storageQuotaBytes=1)
    elif name == "timers_quota":
        # one more than what is pending now (the tenant may hold timers of its own on a shared target)
        pending = api.usage().get("timersPending")
        admin.set_plan(tenant, timersRowQuota=(pending if isinstance(pending, int) else 0) + 1)
    elif name == "paused":
        admin.timers_paused(tenant, True)
    elif name == "suspended":
        admin.cluster_suspended(True)
    elif name == "disabled":
        admin.scheduling(False)
    else:
        raise ValueError(name)
    try:
        yield
    finally:
        if name in ("rate", "quota", "storage", "timers_quota"):
            admin.clear_plan(tenant)
        elif name == "paused":
            admin.timers_paused(tenant, False)
        elif name == "suspended":
            admin.cluster_suspended(False)
        elif name == "disabled":
            admin.scheduling(True)
        until_status(lambda: push_one(api, probe_q), (200, 201), f"tenant produces again after {name}")
        k = uniq("probe")
        until_status(lambda: api.timers([api.schedule_op(probe_q, k, delay_ms=600_000)]), (200,),
                     f"tenant schedules again after {name}")
        api.cancel(probe_q, k)


def until_schedule_refused(api, q: str, statuses: tuple[int, ...], what: str,
                           keep: list[str] | None = None) -> httpx.Response:
    """Poll a one-op schedule until it is refused. What it schedules meanwhile stays pending until the
    refusal (so a row quota fills up) and is cancelled afterwards, or handed to ``keep`` to cancel later."""
    made: list[str] = [] if keep is None else keep

    def attempt() -> httpx.Response:
        k = uniq("k")
        resp = api.timers([api.schedule_op(q, k, delay_ms=600_000)])
        if resp.status_code == 200:
            made.append(k)
        return resp

    try:
        return until_status(attempt, statuses, what)
    finally:
        if keep is None:
            for k in made:
                api.cancel(q, k)


def refused_schedule(api, q: str, status: int, code: str) -> httpx.Response:
    """Poll a one-op schedule until it is refused with status/code; returns the refusal."""
    resp = until_schedule_refused(api, q, (status,), f"schedule refused with {status} {code}")
    expect_error(resp, status, code)
    hint = resp.headers.get(HINT)
    assert hint and "DELETE" in hint, f"a refused schedule ({status} {code}) carries the x-queen-timers-hint header"
    return resp


# ----------------------------------------------------------------------------- rung codes


@contract("LIM-RATE-LIMITED", "TMR-RUNG-CLASSES", "TMR-BLOCKED-HINT")
def test_rate_limited(api, admin, tenant_a):
    q = uniq("q")
    with rung(admin, api, "rate", tenant_a):
        resp = until_status(lambda: push_one(api, q), (429,), "push over the rate limit")
        expect_error(resp, 429, "rate_limited")
        ra = resp.headers.get("retry-after")
        assert ra is not None and ra.strip().isdigit() and int(ra) >= 0, f"429 without a Retry-After in seconds: {resp.headers}"
        resp = refused_schedule(api, q, 429, "rate_limited")
        assert resp.headers.get("retry-after"), "a 429 on the timer route carries Retry-After"


@contract("LIM-QUOTA-EXCEEDED", "TMR-RUNG-CLASSES")
def test_period_quota(api, admin, tenant_a):
    q = uniq("q")
    expect(push_one(api, q), (200, 201))
    with rung(admin, api, "quota", tenant_a):
        resp = until_status(lambda: push_one(api, q), (429,), "push over the period quota")
        expect_error(resp, 429, "quota_exceeded")
        ra = resp.headers.get("retry-after")
        assert ra is not None and ra.strip().isdigit(), f"quota_exceeded without Retry-After seconds: {resp.headers}"


@contract("LIM-STORAGE-QUOTA", "LIM-REFUSAL-CHANGES-NOTHING", "TMR-BLOCKED-HINT")
def test_storage_quota(api, admin, tenant_a):
    q = uniq("q")
    expect(push_one(api, q), (200, 201))
    with rung(admin, api, "storage", tenant_a):
        txns: list[str] = []

        def push() -> httpx.Response:
            # Each attempt its own transaction id: an attempt answered before the plan reached the worker
            # that took it is accepted and stored, which says nothing about the refused one (with one id
            # for all attempts, the lookup below found that earlier message).
            txns.append(uuid.uuid4().hex)
            item = {"queue": q, "partition": "Default", "payload": {"x": 1}, "transactionId": txns[-1]}
            return api.http.post("/api/v1/push", json={"items": [item]})

        resp = until_status(push, (403,), "push over the storage quota")
        expect_error(resp, 403, "storage_quota_exceeded")
        assert api.lookup(q, txns[-1])["found"] is False, "a refused push stores nothing"
        refused_schedule(api, q, 403, "storage_quota_exceeded")
        ns = f"cf-{uuid.uuid4().hex[:8]}"
        kv = api.kv([{"op": "put", "ns": ns, "key": "k", "value": 1, "forever": True}])
        expect_error(kv, 403, "storage_quota_exceeded")
        assert api.kv_ok([{"op": "get", "ns": ns, "key": "k"}])[0]["found"] is False, "reads pass, nothing written"


@contract("LIM-TIMERS-QUOTA", "TMR-BLOCKED-HINT")
def test_timer_row_quota(api, admin, tenant_a):
    q = uniq("q")
    with rung(admin, api, "timers_quota", tenant_a):
        made: list[str] = []
        deadline = time.monotonic() + RUNG_TIMEOUT
        while True:
            k = uniq("k")
            resp = api.timers([api.schedule_op(q, k, delay_ms=600_000)])
            if resp.status_code == 200:
                made.append(k)
            else:
                break
            assert time.monotonic() < deadline, "the timer-row quota never refused"
            time.sleep(0.05)
        expect_error(resp, 403, "timers_quota_exceeded")
        assert resp.headers.get(HINT), "a refused schedule carries the x-queen-timers-hint header"
        expect(push_one(api, q), (200, 201))
        # the quota counts pending rows: cancelling frees it (the quota is cyclic, not permanent)
        for k in made:
            assert expect(api.cancel(q, k), 200)["status"] == "cancelled"
        again = uniq("k")
        until_status(lambda: api.timers([api.schedule_op(q, again, delay_ms=600_000)]), (200,),
                     "scheduling again once the pending rows are cancelled")
        api.cancel(q, again)


@contract("LIM-TIMERS-PAUSED", "TMR-RUNG-CLASSES", "TMR-BLOCKED-HINT")
def test_timers_paused(api, admin, tenant_a):
    q = uniq("q")
    with rung(admin, api, "paused", tenant_a):
        resp = refused_schedule(api, q, 403, "timers_paused")
        assert resp.headers.get(HINT)
        expect(push_one(api, q), (200, 201))  # the timers surface only


@cluster_wide
@contract("LIM-CLUSTER-SUSPENDED", "TMR-BLOCKED-HINT")
def test_cluster_suspended(api, admin, tenant_a):
    q = uniq("q")
    with rung(admin, api, "suspended", tenant_a):
        resp = until_status(lambda: push_one(api, q), (403,), "push on a suspended cluster")
        expect_error(resp, 403, "cluster_suspended")
        refused_schedule(api, q, 403, "cluster_suspended")


@cluster_wide
@contract("TMR-RUNG-CLASSES", "TMR-CANCEL-PASSES-DISABLED", "TMR-BLOCKED-HINT")
def test_scheduling_disabled_is_503(api, admin, tenant_a):
    q, k = uniq("q"), uniq("k")
    api.schedule(q, k, delay_ms=600_000)
    with rung(admin, api, "disabled", tenant_a):
        resp = refused_schedule(api, q, 503, "timers_disabled")
        assert resp.headers.get("retry-after"), "503 timers_disabled carries Retry-After"
        assert resp.headers.get(HINT), "503 timers_disabled carries the x-queen-timers-hint header"
        c = expect(api.cancel(q, k), 200)
        assert c["status"] == "cancelled", c


# ----------------------------------------------------------------------------- the DELETE route passes every rung


@cluster_wide
@contract("LIM-CANCEL-EVERY-RUNG", "TMR-CANCEL-PASSES-PAUSED", "TMR-CANCEL-PASSES-QUOTA")
def test_delete_passes_every_rung(api, admin, tenant_a):
    q = uniq("q")
    names = ["rate", "quota", "storage", "timers_quota", "paused", "suspended"]
    keys = {n: uniq(n) for n in names}
    expect(api.timers([api.schedule_op(q, keys[n], delay_ms=600_000) for n in names]), 200)
    for name in names:
        with rung(admin, api, name, tenant_a):
            # make sure the rung is really on before cancelling under it
            if name in ("rate", "quota", "storage", "suspended"):
                until_status(lambda: push_one(api, q), (403, 429), f"rung {name} on")
            filled: list[str] = []  # the timer-row quota stays full while the DELETE runs
            if name not in ("rate", "quota", "storage", "suspended"):
                until_schedule_refused(api, q, (403,), f"rung {name} on", keep=filled)
            resp = api.cancel(q, keys[name])
            for k in filled:
                api.cancel(q, k)
            assert resp.status_code == 200, f"DELETE refused under rung {name}: {resp.status_code} {resp.text[:200]}"
            c = resp.json()
            assert c["ok"] is True and c["status"] == "cancelled", f"under {name}: {c}"
    assert expect(api.list(q), 200)["rows"] == []


@contract("TMR-BLOCKED-BATCH-WHOLE", "TMR-BLOCKED-HINT")
def test_mixed_batch_refused_whole(api, admin, tenant_a):
    q = uniq("q")
    existing, new = uniq("old"), uniq("new")
    api.schedule(q, existing, delay_ms=600_000)
    with rung(admin, api, "paused", tenant_a):
        until_schedule_refused(api, uniq("probe"), (403,), "the paused schedule in force")
        mixed = [{"op": "cancel", "queue": q, "timerKey": existing}, api.schedule_op(q, new, delay_ms=600_000)]
        resp = api.timers(mixed)
        assert resp.status_code == 403, f"mixed batch on a paused schedule: {resp.status_code} {resp.text[:200]}"
        assert_envelope(resp)
        hint = resp.headers.get(HINT)
        assert hint and "DELETE" in hint and "/api/v1/timers" in hint, f"the hint names the DELETE route: {hint!r}"
        assert api.peek_ok(q, existing)["found"] is True, "the cancel half must not be applied silently"
        assert api.peek_ok(q, new)["found"] is False, "the schedule half must not be applied"
        only_cancel = api.timers([{"op": "cancel", "queue": q, "timerKey": existing}])
        assert only_cancel.status_code == 403, "a cancel-only batch has the schedule route's authorization"
        assert only_cancel.headers.get(HINT)
        assert expect(api.cancel(q, existing), 200)["status"] == "cancelled"


# ----------------------------------------------------------------------------- horizon and payload ceiling


@contract("TMR-HORIZON-403", "TMR-HORIZON-90D")
def test_horizon(api):
    q = uniq("q")
    within, beyond = uniq("in"), uniq("out")
    r = api.schedule(q, within, delay_ms=90 * DAY_MS - 60_000)
    assert r["ok"] is True, r
    resp = api.timers([api.schedule_op(q, beyond, delay_ms=90 * DAY_MS + 60_000)])
    expect_error(resp, 403, "timer_horizon_exceeded")
    assert api.peek_ok(q, beyond)["found"] is False
    # a reschedule past the horizon is the same verdict, and leaves the timer as it was
    before = api.peek_ok(q, within)
    resp = api.timers([api.schedule_op(q, within, delay_ms=90 * DAY_MS + 60_000, op="reschedule")])
    expect_error(resp, 403, "timer_horizon_exceeded")
    assert api.peek_ok(q, within)["deliverAt"] == before["deliverAt"]
    expect(api.cancel(q, within), 200)


@contract("TMR-HORIZON-NARROWS")
def test_tenant_horizon_narrows(api, admin, tenant_a):
    q = uniq("q")
    admin.set_plan(tenant_a, timersHorizonMs=60_000)
    try:
        resp = until_status(lambda: api.timers([api.schedule_op(q, uniq("k"), delay_ms=120_000)]), (403,),
                            "a narrowed horizon")
        expect_error(resp, 403, "timer_horizon_exceeded")
        ok = api.schedule(q, uniq("k"), delay_ms=30_000)
        api.cancel(q, ok["timerKey"])
        # a wider tenant horizon is refused or ignored: never effective
        wide = admin.api.http.put(f"/api/v1/admin/tenants/{tenant_a}/plan", json={"timersHorizonMs": 200 * DAY_MS})
        assert wide.status_code in (200, 201, 204, 400), wide.text
        if wide.status_code == 400:
            assert_envelope(wide)
        time.sleep(0.2)
        resp = api.timers([api.schedule_op(q, uniq("k"), delay_ms=91 * DAY_MS)])
        expect_error(resp, 403, "timer_horizon_exceeded")
    finally:
        admin.clear_plan(tenant_a)


@contract("TMR-PAYLOAD-CEILING")
def test_payload_ceiling(api, admin, tenant_a):
    q = uniq("q")
    big = b"x" * (1024 * 1024 + 1)
    op = api.schedule_op(q, uniq("k"), delay_ms=600_000)
    import base64

    op["payload"] = base64.b64encode(big).decode()
    expect_error(api.timers([op]), 413, "payload_too_large")
    admin.set_plan(tenant_a, maxPayloadBytes=1000)
    try:
        small_op = api.schedule_op(q, uniq("k"), delay_ms=600_000)
        small_op["payload"] = base64.b64encode(b'"' + b"y" * 1200 + b'"').decode()
        resp = until_status(lambda: api.timers([small_op]), (413,), "timer payload over the plan's max payload")
        expect_error(resp, 413, "payload_too_large")
        fits = api.schedule_op(q, uniq("k"), delay_ms=600_000)
        fits["payload"] = b64({"y": "z" * 100})
        assert expect(api.timers([fits]), 200)["results"][0]["ok"] is True
        api.cancel(q, fits["timerKey"])
    finally:
        admin.clear_plan(tenant_a)


@contract("TMR-MAX-OPS-256")
def test_max_256_ops(api):
    q = uniq("q")
    ops = [api.schedule_op(q, f"k{i:03d}", delay_ms=600_000) for i in range(257)]
    expect_error(api.timers(ops), 400)
    assert expect(api.list(q), 200)["rows"] == []
    res = expect(api.timers(ops[:256]), 200)["results"]
    assert len(res) == 256 and all(r["ok"] for r in res)
    cancels = [{"op": "cancel", "queue": q, "timerKey": o["timerKey"]} for o in ops[:256]]
    assert all(r["status"] == "cancelled" for r in expect(api.timers(cancels), 200)["results"])


# ----------------------------------------------------------------------------- metering


def _messages(api) -> int:
    return usage_messages(api.usage())


@contract("MET-SCHEDULE-COUNTS", "MET-PER-OPERATION", "MET-CANCEL-ZERO", "MET-FIRE-ZERO")
def test_billed_for_the_promise(api, pytestconfig, target):
    # tenant B (when given) does little else in a run, so its meter moves only by what this test does
    api_b = api
    if pytestconfig.getoption("--queen-token-b"):
        api_b = target.api(pytestconfig.getoption("--queen-token-b"), label="B", tenant=None, sub=None)
    q = uniq("q")
    keys = [uniq("k") for _ in range(5)]
    before = _messages(api_b)
    expect(api_b.timers([api_b.schedule_op(q, k, delay_ms=600_000) for k in keys]), 200)
    assert _messages(api_b) - before == 5, "each schedule op counts one message, per operation not per call"
    expect(api_b.timers([api_b.schedule_op(q, keys[0], delay_ms=600_000, op="reschedule"),
                         api_b.schedule_op(q, keys[1], delay_ms=600_000)]), 200)
    assert _messages(api_b) - before == 7, "each reschedule counts another"
    for k in keys[:3]:
        expect(api_b.cancel(q, k), 200)
    expect(api_b.timers([{"op": "cancel", "queue": q, "timerKey": keys[3]}]), 200)
    assert _messages(api_b) - before == 7, "a cancel counts zero and does not refund"
    txn = uuid.uuid4().hex
    expect(api_b.timers([api_b.schedule_op(q, keys[4], delay_ms=0, txn=txn, op="reschedule")]), 200)
    assert _messages(api_b) - before == 8
    api_b.wait_delivered(q, txn)
    time.sleep(0.1)
    assert _messages(api_b) - before == 8, "the fire counts zero"
    # a timers rider of a transaction is a batch too: each schedule op counts one
    data = expect(api_b.http.post("/api/v1/transaction", json={
        "operations": [], "timers": [api_b.schedule_op(q, uniq("k"), delay_ms=600_000),
                                     api_b.schedule_op(q, uniq("k"), delay_ms=600_000)]}), 200)
    assert data.get("success") is True, data
    assert _messages(api_b) - before == 10, "schedule ops in a transaction are billed like any other"
    expect(api_b.timers([{"op": "cancel", "queue": q, "timerKey": r["timerKey"]} for r in data["results"]]), 200)

