"""Limits hold across brokers: two ``queen serve`` on one database share the rate bucket, the usage and
the switches, because all of them live in PostgreSQL (each broker only caches, within the bound)."""

from __future__ import annotations

import time

import httpx

REFRESH_MS = 150


def kv_put(c, key):
    return c.post("/api/v1/kv", json={"operations": [{"op": "put", "ns": "cl", "key": key, "value": "x" * 400,
                                                       "forever": True}]})


def test_two_brokers_one_database_share_every_limit(pg, start_broker):
    dsn = pg.new_db()
    env = {"QUEEN_LIMITS_REFRESH_MS": str(REFRESH_MS)}
    a = start_broker(env=env, workers=1, dsn=dsn)
    b = start_broker(env=env, workers=1, dsn=dsn)
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url, timeout=30) as cb:
        # the rate bucket is one row: alternating brokers cannot double the rate
        assert ca.put("/api/v1/admin/tenants/default/plan", json={"rateLimitPerS": 4}).status_code == 200
        started = time.monotonic()
        statuses = [kv_put(c, f"r{i}").status_code for i in range(8) for c in (ca, cb)]
        elapsed = time.monotonic() - started
        # 4 in the bucket + what refilled meanwhile (rate x elapsed), whichever broker answered
        assert statuses.count(200) <= 4 + int(4 * elapsed) + 1
        assert 429 in statuses and set(statuses) == {200, 429}
        time.sleep(1.1)
        # storage written through broker a refuses broker b's writes once b's cache is past the bound
        assert ca.put("/api/v1/admin/tenants/default/plan", json={"storageQuotaBytes": 1000}).status_code == 200
        for i in range(3):
            r = kv_put(ca, f"s{i}")
            if r.status_code == 403:
                break
        time.sleep(REFRESH_MS / 1000 * 2)
        r = kv_put(cb, "from-b")
        assert r.status_code == 403 and r.json()["error"] == "storage_quota_exceeded"
        # an operator switch set on broker b holds on broker a at once (NOTIFY reaches every broker)
        ca.delete("/api/v1/admin/tenants/default/plan")
        assert cb.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).status_code == 200
        time.sleep(0.05)
        r = kv_put(ca, "after")
        assert r.status_code == 403 and r.json()["error"] == "cluster_suspended"
        cb.post("/api/v1/admin/cluster/suspended", json={"suspended": False})
        time.sleep(0.05)
        assert kv_put(ca, "after").status_code == 200
