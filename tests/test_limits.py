"""Limits: plans (narrow only), every degradation rung with its code and status, the operator switches,
"DELETE still cancels while every rung is on", and the staleness bound of the per-worker cache.

One dedicated broker with authentication on (so tenants are real and isolated), 2 workers, a short
refresh interval. Each test uses its own tenants; the cluster switch is restored by the test that sets it.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest
from conftest import uniq
from helpers import authed, db_fetch, dedicated_broker, kv_put, refused, timer_op, wait_for

SECRET = "limits-test-secret"
REFRESH_MS = 150
PERIOD_S = 3600
sched = partial(timer_op, delay=600_000)


@pytest.fixture(scope="module")
def lb(pg, tmp_path_factory):
    env = {
        "QUEEN_JWT_SECRET": SECRET,
        "QUEEN_LIMITS_REFRESH_MS": str(REFRESH_MS),
        "QUEEN_PERIOD_SECONDS": str(PERIOD_S),
        "QUEEN_STORAGE_QUOTA_BYTES": str(10 * 1024 * 1024),
        "QUEEN_RATE_LIMIT_PER_S": "1000",
    }
    with dedicated_broker(pg, tmp_path_factory, "limits", env) as b:
        yield b


@pytest.fixture
def admin(lb):
    with authed(SECRET, lb, "ops", grants=("admin",)) as c:
        yield c


def settle():
    """Wait out the staleness bound, so the change is known to every worker whether or not its NOTIFY
    has arrived yet (the NOTIFY path is tested on its own in test_limits_cluster.py)."""
    time.sleep(REFRESH_MS / 1000 + 0.1)


def set_plan(admin, tenant, **plan):
    r = admin.put(f"/api/v1/admin/tenants/{tenant}/plan", json=plan)
    assert r.status_code == 200, r.text
    settle()
    return r.json()


def test_plan_admin_api_narrows_only(lb, admin):
    t = uniq("plan")
    r = admin.get(f"/api/v1/admin/tenants/{t}/plan")
    assert r.status_code == 200
    body = r.json()
    assert body["plan"] is None and body["effective"] == body["cell"]
    assert body["cell"]["storageQuotaBytes"] == 10 * 1024 * 1024 and body["cell"]["periodQuotaMessages"] == 0
    got = set_plan(admin, t, maxPayloadBytes=1000, periodQuotaMessages=50, storageQuotaBytes=None)
    assert got["plan"]["maxPayloadBytes"] == 1000 and got["plan"]["storageQuotaBytes"] is None
    assert got["effective"]["maxPayloadBytes"] == 1000
    assert got["effective"]["periodQuotaMessages"] == 50  # a limit narrows the cell's 0 = unlimited
    assert got["effective"]["storageQuotaBytes"] == 10 * 1024 * 1024  # null inherits
    # widening is refused and stores nothing
    for field, value in (("maxPayloadBytes", 10**9), ("storageQuotaBytes", 0), ("storageQuotaBytes", 10**9),
                         ("rateLimitPerS", 0), ("timersHorizonMs", 10**12)):
        r = admin.put(f"/api/v1/admin/tenants/{t}/plan", json={field: value})
        assert r.status_code == 400 and r.json()["reason"] == "plan_widens_cell", (field, r.text)
    assert admin.get(f"/api/v1/admin/tenants/{t}/plan").json()["plan"]["maxPayloadBytes"] == 1000
    for bad in ({"nope": 1}, {"maxPayloadBytes": -1}, {"maxPayloadBytes": "1"}, {"maxPayloadBytes": True}):
        r = admin.put(f"/api/v1/admin/tenants/{t}/plan", json=bad)
        assert r.status_code == 400, bad
    # the tenant sees its effective plan in its usage
    with authed(SECRET, lb, t) as c:
        assert c.get("/api/v1/usage").json()["plan"]["maxPayloadBytes"] == 1000
    r = admin.delete(f"/api/v1/admin/tenants/{t}/plan")
    assert r.json() == {"tenant": t, "deleted": True}
    assert admin.delete(f"/api/v1/admin/tenants/{t}/plan").json()["deleted"] is False
    assert admin.get(f"/api/v1/admin/tenants/{t}/plan").json()["plan"] is None


def test_admin_routes_need_the_admin_grant(lb):
    t = uniq("plan")
    with authed(SECRET, lb, t) as c:
        for method, path, body in (
            ("GET", f"/api/v1/admin/tenants/{t}/plan", None),
            ("PUT", f"/api/v1/admin/tenants/{t}/plan", {"maxPayloadBytes": 1}),
            ("POST", f"/api/v1/admin/tenants/{t}/timers-paused", {"paused": True}),
            ("POST", "/api/v1/admin/cluster/suspended", {"suspended": True}),
            ("GET", "/api/v1/admin/usage", None),
        ):
            r = c.request(method, path, json=body)
            assert r.status_code == 403 and r.json()["reason"] == "missing_grant", (method, path, r.text)
    with authed(SECRET, lb, "x") as anon_admin:
        r = anon_admin.post("/api/v1/admin/cluster/suspended", json={"suspended": "yes"})
        assert r.status_code == 403


def test_timers_paused_rung(lb, admin):
    t, other = uniq("tp"), uniq("tp")
    with authed(SECRET, lb, t) as c, authed(SECRET, lb, other) as o:
        assert c.timers(sched("q", "before")).status_code == 200
        r = admin.post(f"/api/v1/admin/tenants/{t}/timers-paused", json={"paused": True})
        assert r.json() == {"tenant": t, "paused": True}
        settle()
        assert admin.get(f"/api/v1/admin/tenants/{t}/timers-paused").json()["paused"] is True
        r = c.timers(sched("q", "k"))
        refused(r, 403, "timers_paused")
        assert r.headers["x-queen-timers-hint"].startswith("DELETE /api/v1/timers/")
        # only the schedule route: KV writes and pushes go on; other tenants are untouched
        assert c.kv(kv_put("lim", "k", "v")).status_code == 200
        assert c.push_n(uniq("q")).status_code in (200, 201)
        assert o.timers(sched("q", "k")).status_code == 200
        # the cancel route is not refused
        r = c.delete("/api/v1/timers/q/before")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        admin.post(f"/api/v1/admin/tenants/{t}/timers-paused", json={"paused": False})
        settle()
        assert c.timers(sched("q", "k")).status_code == 200
    r = admin.post(f"/api/v1/admin/tenants/{t}/timers-paused", json={"paused": 1})
    assert r.status_code == 400


def test_storage_quota_rung(lb, admin):
    t, other = uniq("st"), uniq("st")
    set_plan(admin, t, storageQuotaBytes=2000)
    with authed(SECRET, lb, t) as c, authed(SECRET, lb, other) as o:
        assert c.kv(kv_put("lim", "a", "x" * 1500)).status_code == 200
        assert c.kv(kv_put("lim", "b", "x" * 1000)).status_code == 200  # admitted: 1.5 KB < 2 KB when judged
        r = wait_for(lambda: (r := c.kv(kv_put("lim", "c", "v"))).status_code == 403 and r, timeout=3.0)
        refused(r, 403, "storage_quota_exceeded")
        refused(c.push_n(uniq("q")), 403, "storage_quota_exceeded")
        refused(c.timers(sched("q", "k")), 403, "storage_quota_exceeded")
        assert o.kv(kv_put("lim", "a", "v")).status_code == 200
        # reads and deletes are not produce-class; deleting frees the bytes and writes work again
        assert c.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "lim", "key": "a"}]}).status_code == 200
        r = c.post("/api/v1/kv", json={"operations": [{"op": "delete", "ns": "lim", "key": "a"}]})
        assert r.status_code == 403  # a KV delete is a write: refused like the others
        u = c.get("/api/v1/usage").json()
        assert u["storageBytes"] >= 2000


def test_storage_gauge_follows_writes_and_deletes(lb, admin):
    t = uniq("sg")
    with authed(SECRET, lb, t) as c:
        assert c.kv(kv_put("lim", "a", "x" * 3000)).status_code == 200
        assert c.get("/api/v1/usage").json()["storageBytes"] == len("a") + 3002  # key + JSON text
        c.post("/api/v1/kv", json={"operations": [{"op": "delete", "ns": "lim", "key": "a"}]})
        assert c.get("/api/v1/usage").json()["storageBytes"] == 0


def test_timer_row_quota_rung(lb, admin):
    t = uniq("tq")
    set_plan(admin, t, timersRowQuota=2)
    with authed(SECRET, lb, t) as c:
        assert c.timers(sched("q", "a")).status_code == 200
        assert c.timers(sched("q", "b")).status_code == 200
        time.sleep(REFRESH_MS / 1000 * 2)  # past the bound, every worker knows both rows
        r = c.timers(sched("q", "c"))
        refused(r, 403, "timers_quota_exceeded")
        assert r.headers["x-queen-timers-hint"]
        assert c.get("/api/v1/usage").json()["timersPending"] == 2
        assert c.delete("/api/v1/timers/q/a").json()["status"] == "cancelled"
        assert c.get("/api/v1/usage").json()["timersPending"] == 1
        wait_for(lambda: c.timers(sched("q", "c")).status_code == 200, timeout=3.0)


def test_period_quota_rung_and_retry_after(lb, admin):
    t = uniq("pq")
    set_plan(admin, t, periodQuotaMessages=5)
    q = uniq("q")
    with authed(SECRET, lb, t) as c:
        assert c.push_n(q, 4).status_code in (200, 201)
        time.sleep(REFRESH_MS / 1000 * 2)
        # 4 used: a call of 2 would pass the quota and is refused whole
        r = c.push_n(q, 2)
        body = refused(r, 429, "quota_exceeded")
        assert body["reason"] == "quota_exceeded"
        retry = int(r.headers["Retry-After"])
        assert 1 <= retry <= PERIOD_S
        assert c.timers(sched("q", "one")).status_code == 200  # 5th unit: a schedule is a message
        time.sleep(REFRESH_MS / 1000 * 2)
        refused(c.push_n(q, 1), 429, "quota_exceeded")
        refused(c.timers(sched("q", "two")), 429, "quota_exceeded")
        # spent: KV writes are refused too, reads are not
        refused(c.kv(kv_put("lim", "k", "v")), 429, "quota_exceeded")
        assert c.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "lim", "key": "k"}]}).status_code == 200
        assert c.get("/api/v1/usage").json()["messages"] == 5


def test_rate_limit_rung(lb, admin):
    t = uniq("rl")
    set_plan(admin, t, rateLimitPerS=3)
    with authed(SECRET, lb, t) as c:
        codes = [c.kv(kv_put("lim", f"k{i}", "v")).status_code for i in range(8)]
        assert codes[:3] == [200, 200, 200]
        assert 429 in codes
        r = wait_for(lambda: (r := c.kv(kv_put("lim", "z", "v"))).status_code == 429 and r, timeout=1)
        body = refused(r, 429, "rate_limited")
        assert body["reason"] == "kv_rate_limited" and int(r.headers["Retry-After"]) >= 1
        r = c.push_n(uniq("q"), 50)
        assert r.status_code == 429 and r.json()["reason"] == "rate_limited"
        time.sleep(1.1)  # the bucket refills by the database clock
        assert c.kv(kv_put("lim", "after", "v")).status_code == 200


def test_cluster_suspended_rung(lb, admin):
    t = uniq("cs")
    with authed(SECRET, lb, t) as c:
        assert c.timers(sched("q", "keep")).status_code == 200
        assert c.kv(kv_put("lim", "k", "v")).status_code == 200
        try:
            assert admin.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).json() == {"suspended": True}
            settle()
            assert admin.get("/api/v1/admin/cluster/suspended").json() == {"suspended": True}
            refused(c.kv(kv_put("lim", "k2", "v")), 403, "cluster_suspended")
            refused(c.push_n(uniq("q")), 403, "cluster_suspended")
            r = c.timers(sched("q", "new"))
            refused(r, 403, "cluster_suspended")
            assert r.headers["x-queen-timers-hint"]
            # reads go on, the cancel route goes on
            r = c.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "lim", "key": "k"}]})
            assert r.json()["results"][0]["found"] is True
            assert c.delete("/api/v1/timers/q/keep").json()["status"] == "cancelled"
        finally:
            admin.post("/api/v1/admin/cluster/suspended", json={"suspended": False})
            settle()
        assert c.kv(kv_put("lim", "k3", "v")).status_code == 200


def test_delete_still_cancels_while_every_rung_is_on(lb, admin):
    t = uniq("all")
    with authed(SECRET, lb, t, grants=("produce",)) as c:
        for key in ("a", "b/c"):
            assert c.timers(sched("q", key)).status_code == 200
        assert c.kv(kv_put("lim", "big", "x" * 500)).status_code == 200
        set_plan(admin, t, timersRowQuota=1, periodQuotaMessages=1, storageQuotaBytes=1, rateLimitPerS=1)
        admin.post(f"/api/v1/admin/tenants/{t}/timers-paused", json={"paused": True})
        admin.post("/api/v1/admin/cluster/suspended", json={"suspended": True})
        settle()
        try:
            # the schedule route refuses the whole batch, even a batch of only a cancel
            r = c.post("/api/v1/timers", json={"operations": [{"op": "cancel", "queue": "q", "timerKey": "a"}]})
            assert r.status_code == 403 and r.headers["x-queen-timers-hint"]
            r = c.delete("/api/v1/timers/q/a")
            assert r.status_code == 200 and r.json()["ok"] is True and r.json()["status"] == "cancelled"
            r = c.delete("/api/v1/timers/q/b/c?txn=t1")
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            r = c.delete("/api/v1/timers/q/a?txn=t2")
            assert r.json() == {"ok": False, "status": "absent", "queue": "q", "timerKey": "a", "txn": "t2"}
        finally:
            admin.post("/api/v1/admin/cluster/suspended", json={"suspended": False})
            settle()


def test_staleness_bound(lb, admin):
    """A change written to the database WITHOUT the admin route's NOTIFY (as another broker's usage or
    a manual fix would be) is honoured by every worker within QUEEN_LIMITS_REFRESH_MS (+ slack)."""
    t = uniq("sb")
    with authed(SECRET, lb, t) as c:
        # warm both workers' caches for this tenant
        for i in range(6):
            assert c.kv(kv_put("lim", f"w{i}", "v")).status_code == 200
        db_fetch(lb.dsn, "INSERT INTO queen_tenant_switches (tenant, timers_paused) VALUES ($1, true)", t)
        written = time.monotonic()
        first_refusal = wait_for(lambda: c.timers(sched("q", uniq("k"))).status_code == 403 and time.monotonic(), timeout=3.0)
        assert first_refusal - written < REFRESH_MS / 1000 + 1.0
        # past the bound, every worker refuses: many calls, none admitted
        time.sleep(REFRESH_MS / 1000 + 0.1)
        statuses = {c.timers(sched("q", uniq("k"))).status_code for _ in range(12)}
        assert statuses == {403}
        # and the way back
        db_fetch(lb.dsn, "UPDATE queen_tenant_switches SET timers_paused = false WHERE tenant = $1", t)
        time.sleep(REFRESH_MS / 1000 + 0.3)
        statuses = {c.timers(sched("q", uniq("k"))).status_code for _ in range(12)}
        assert statuses == {200}


def test_unknown_surface_is_a_programming_error():
    from broker import limits

    class B:
        services: dict = {}

    with pytest.raises(ValueError):
        asyncio.run(limits.admit(B(), None, "pop", 1))


def test_effective_plan_is_the_stricter_value():
    from broker import limits
    from broker.config import Settings

    cell = limits.cell_plan(Settings(rate_limit_per_s=0, period_quota_messages=100, storage_quota_bytes=0))
    assert limits.effective(cell, None) == cell
    eff = limits.effective(cell, {"rate_limit_per_s": 5, "period_quota_messages": 10, "max_payload_bytes": None,
                                  "storage_quota_bytes": 0})
    assert eff.rate_limit_per_s == 5 and eff.period_quota_messages == 10 and eff.storage_quota_bytes == 0
    assert eff.max_payload_bytes == cell.max_payload_bytes
    # a stored plan wider than the cell (the cell was narrowed later) has no effect
    wide = limits.effective(cell, {"period_quota_messages": 1000, "timers_horizon_ms": cell.timers_horizon_ms * 2,
                                   "rate_limit_per_s": 0})
    assert wide.period_quota_messages == 100 and wide.timers_horizon_ms == cell.timers_horizon_ms
    assert wide.rate_limit_per_s == 0
    assert not limits.narrows("period_quota_messages", 100, 0)  # 0 = unlimited widens a limit
    assert limits.narrows("rate_limit_per_s", 0, 0) and limits.narrows("rate_limit_per_s", 0, 7)
    assert eff.timer_payload_ceiling == min(1024 * 1024, eff.max_payload_bytes)


def test_kv_kill_switch(lb, admin):
    t = uniq("ks")
    with authed(SECRET, lb, t) as c:
        assert c.kv(kv_put("lim", "k", "v")).status_code == 200
        try:
            assert admin.post("/api/v1/admin/kv", json={"enabled": False}).json() == {"enabled": False}
            assert admin.get("/api/v1/admin/kv").json() == {"enabled": False}
            settle()
            for r in (c.kv(kv_put("lim", "k2", "v")), c.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "lim", "key": "k"}]}),
                      c.get("/api/v1/kv/lim/k"), c.put("/api/v1/kv/lim/k?forever=true", content=b"1")):
                body = refused(r, 503, "kv_disabled")
                assert body["reason"] == "kv_disabled" and int(r.headers["Retry-After"]) >= 1
            r = c.post("/api/v1/transaction", json={"operations": [], "kv": [{"op": "get", "ns": "lim", "key": "k"}]})
            refused(r, 403, "kv_disabled")
            # the rest of the product is not switched off
            assert c.timers(sched("q", "k")).status_code == 200
        finally:
            admin.post("/api/v1/admin/kv", json={"enabled": True})
            settle()
        assert c.kv(kv_put("lim", "k3", "v")).status_code == 200


class _Read:
    """A stand-in pool for ``LimitsCache.refresh``: the limits read returns ``messages`` used for tenant
    "t" once ``go`` is set (set from the start unless ``held``), as a read in flight would."""

    def __init__(self, messages: int, held: bool = False) -> None:
        from broker import limits

        self.go = asyncio.Event()
        if not held:
            self.go.set()
        self.row = {"suspended": False, "kv_enabled": True, "period_left_s": 60.0, "tenant": "t",
                    "timers_paused": False, "messages": messages, "storage_bytes": 0, "timers_pending": messages,
                    **{name: None for name in limits.PLAN_FIELDS}}

    async def fetch(self, *args):
        await self.go.wait()
        return [self.row]


def test_what_a_worker_admitted_survives_a_read_that_cannot_see_it_yet():
    """The race behind a quota that let one push too many through: a re-read whose snapshot predates a
    write this worker admitted must not forget it, and a write it already sees is not counted twice."""
    from broker import limits
    from broker.config import Settings

    def used(cache):
        st = cache.tenants["t"]
        return st.messages + st.local_messages, st.timers_pending + st.local_timers

    async def main():
        cache = limits.LimitsCache(Settings())
        await cache.refresh(_Read(1), ["t"])
        with limits.admission_scope():  # a request that ended: its write committed before the next read
            cache.count("t", cache.tenants["t"], 1, 1)
        await cache.refresh(_Read(2), ["t"])
        assert used(cache) == (2, 2)
        with limits.admission_scope():
            cache.count("t", cache.tenants["t"], 2, 2)  # admitted; the write has not committed yet
            read = _Read(2, held=True)  # a read whose snapshot does not hold it
            task = asyncio.create_task(cache.refresh(read, ["t"]))
            await asyncio.sleep(0)
            cache.count("t", cache.tenants["t"], 3, 0)  # admitted while the read runs
            read.go.set()
            await task
            assert used(cache) == (2 + 2 + 3, 2 + 2)
        # the request ended, both writes committed: the next read holds them and nothing is counted twice
        await cache.refresh(_Read(7), ["t"])
        assert used(cache) == (7, 7)
        # admissions outside any request scope count until the next read, as before
        cache.count("t", cache.tenants["t"], 1, 0)
        assert used(cache) == (8, 7)
        # admit held an entry that a read replaced while it awaited the rate: it counts on the current one
        held = cache.tenants["t"]
        await cache.refresh(_Read(8), ["t"])
        cache.count("t", held, 1, 0)
        assert used(cache) == (9, 8)

    asyncio.run(main())


def test_a_quota_never_refuses_because_of_the_double_count():
    """An op in flight at a read that committed before its snapshot is carried AND in the read: a call
    that passes the quota only on that double count is admitted (after a re-read), one that passes it on
    the fresh view is refused."""
    from types import SimpleNamespace

    from broker import limits
    from broker.config import Settings
    from broker.errors import ApiError

    async def main():
        cache = limits.LimitsCache(Settings(timers_row_quota=10))
        broker = SimpleNamespace(services=SimpleNamespace(limits=cache), pool=None)
        broker.require_pool = lambda: broker.pool
        principal = SimpleNamespace(tenant="t")
        await cache.refresh(_Read(4), ["t"])
        with limits.admission_scope():
            cache.count("t", cache.tenants["t"], 4, 4)  # a call of 4 timers, in flight
            await cache.refresh(_Read(8), ["t"])  # a read whose snapshot holds its commit already
        st = cache.tenants["t"]
        assert st.timers_pending + st.local_timers == 12  # 8 read + 4 carried: counted twice
        broker.pool = _Read(8)
        with limits.admission_scope():
            await limits.admit(broker, principal, "timers", 2)  # 8 + 2 is the quota, not over it
        st = cache.tenants["t"]
        assert st.timers_pending + st.local_timers == 10
        with pytest.raises(ApiError) as refused, limits.admission_scope():
            await limits.admit(broker, principal, "timers", 1)
        assert refused.value.code == "timers_quota_exceeded"

    asyncio.run(main())
