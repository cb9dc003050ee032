"""Limits hold across brokers: two ``queen serve`` on one database share the rate bucket and the
switches, because both live in PostgreSQL. The brokers here run with a 60 s refresh interval, so what
is checked is not the staleness bound (tests/test_limits.py) but the two paths that do not wait for it:
the rate bucket (one row, taken by every call) and the admin routes' NOTIFY to every worker of every
broker."""

from __future__ import annotations

import time

import httpx
from helpers import Api, kv_put, wait_for

LONG_REFRESH_MS = 60_000
BIG = "x" * 400  # a value large enough to count against storage


def test_two_brokers_one_database_share_the_bucket_and_the_switches(pg, start_broker):
    dsn = pg.new_db()
    env = {"QUEEN_LIMITS_REFRESH_MS": str(LONG_REFRESH_MS)}
    a = start_broker(env=env, workers=2, dsn=dsn)
    b = start_broker(env=env, workers=1, dsn=dsn)
    with Api(httpx.Client(base_url=a.url, timeout=30)) as ca, Api(httpx.Client(base_url=b.url, timeout=30)) as cb:
        # warm every worker's cache: from here on only NOTIFY (or 60 s) can change what they know
        for i in range(6):
            assert ca.kv(kv_put("cl", f"w{i}", BIG)).status_code == 200 and cb.kv(kv_put("cl", f"w{i}", BIG)).status_code == 200
        # a switch set on broker b reaches every worker of broker a long before the 60 s refresh
        changed = time.monotonic()
        assert cb.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).status_code == 200
        wait_for(lambda: all(ca.kv(kv_put("cl", "s", BIG)).status_code == 403 for _ in range(6)), timeout=2.0, interval=0.02)
        seen = time.monotonic()
        assert seen - changed < 5
        assert cb.post("/api/v1/admin/cluster/suspended", json={"suspended": False}).status_code == 200
        wait_for(lambda: all(ca.kv(kv_put("cl", "s", BIG)).status_code == 200 for _ in range(6)), timeout=2.0, interval=0.02)
        # the rate bucket is one row: alternating brokers cannot double the rate
        assert ca.put("/api/v1/admin/tenants/default/plan", json={"rateLimitPerS": 4}).status_code == 200
        wait_for(lambda: cb.kv(kv_put("cl", "r", BIG)).status_code == 429, timeout=2.0, interval=0.02)
        time.sleep(1.1)  # a full bucket again
        started = time.monotonic()
        statuses = [c.kv(kv_put("cl", f"r{i}", BIG)).status_code for i in range(8) for c in (ca, cb)]
        elapsed = time.monotonic() - started
        # 4 in the bucket + what refilled meanwhile (rate x elapsed), whichever broker answered
        assert statuses.count(200) <= 4 + int(4 * elapsed) + 1
        assert set(statuses) == {200, 429}
