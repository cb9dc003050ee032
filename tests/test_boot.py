"""The boot flag: a broker started before its database is up answers 503 ``booting`` on /health and on
every /api route (with Retry-After), and turns ready by itself once the database comes up: no restart,
same worker processes, migrations applied at boot."""

from __future__ import annotations

import time

import httpx

from broker.process.localserver import http_get


def _booting_on_every_worker(url: str, workers: int, timeout: float = 20.0) -> dict[int, dict]:
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < workers and time.monotonic() < deadline:
        try:
            status, body = http_get(url + "/health", timeout=1.0)
        except OSError:
            time.sleep(0.05)
            continue
        assert status == 503, body
        seen[int(body["worker_id"])] = body
    assert len(seen) == workers, f"only workers {sorted(seen)} answered /health while booting"
    return seen


def test_booting_until_the_database_comes_up(controlled_pg, start_broker):
    ctl = controlled_pg.controller
    dsn = controlled_pg.new_db(template=False)  # empty: the broker must migrate it at boot
    ctl.pg_ctl("stop")
    try:
        b = start_broker(dsn=dsn, wait=False)
        for body in _booting_on_every_worker(b.url, 2).values():
            assert body["status"] == "booting"
            assert body["reason"] == "booting"
            assert "database not ready" in body["detail"] or body["detail"] == "starting"
        with httpx.Client(base_url=b.url, timeout=5) as c:
            h = c.get("/health")
            assert h.status_code == 503 and h.headers["Retry-After"].isdigit()
            for method, path in (("GET", "/api/v1/whoami"), ("POST", "/api/v1/admin/ping"), ("GET", "/api/v1/no-such-route"), ("GET", "//api/v1/whoami"),
                                 ("POST", "/streams/v1/cycle")):
                r = c.request(method, b.url + path)  # absolute: a base_url client would eat the "//"
                assert r.status_code == 503, (path, r.text)
                assert r.json()["error"] == "booting"
                assert r.json()["reason"] == "booting"
                assert int(r.headers["Retry-After"]) >= 1
            # Still booting a little later: the flag does not flip on its own.
            time.sleep(0.5)
            assert c.get("/api/v1/whoami").json()["error"] == "booting"
        master, workers = b.proc.pid, sorted(b.worker_pids())
        assert len(workers) == 2
    finally:
        ctl.pg_ctl("start")
        ctl.refresh()
    started = time.monotonic()
    b.wait_ready(timeout=30)
    recovered_s = time.monotonic() - started
    assert b.proc.poll() is None and b.proc.pid == master
    assert sorted(b.worker_pids()) == workers, "the broker recovered by restarting workers"
    assert recovered_s < 15
    print(f"recovered {recovered_s:.2f}s after the database came up")
    with httpx.Client(base_url=b.url, timeout=5) as c:
        r = c.get("/api/v1/whoami")
        assert r.status_code == 200 and r.json()["tenant"] == "default"
    assert "died" not in b.tail(200)


def test_two_brokers_start_at_once_on_one_empty_database(pg, start_broker):
    """Many brokers, one database: both boot against an unmigrated database at the same moment, one
    applies the migrations under the advisory lock, both serve."""
    dsn = pg.new_db(template=False)
    first, second = start_broker(dsn=dsn, wait=False), start_broker(dsn=dsn, wait=False)
    first.wait_ready(30)
    second.wait_ready(30)
    logs = first.tail(400) + "\n" + second.tail(400)
    assert logs.count("applied migrations") == 1, logs
    for b in (first, second):
        r = httpx.get(b.url + "/api/v1/whoami", timeout=10)
        assert r.status_code == 200 and r.json()["tenant"] == "default"


def test_a_booted_worker_freezes_its_heap_and_raises_the_collector_thresholds():
    """settle_heap (the last step of a worker's boot): what boot built leaves the collector's view and
    the thresholds become GC_THRESHOLDS, so young collections stop rescanning requests in flight and
    full collections stop stalling the worker about once a second under load."""
    import gc

    from broker.app import GC_THRESHOLDS, settle_heap

    before = gc.get_threshold()
    try:
        kept = [[i] for i in range(1000)]  # live containers built "at boot"
        settle_heap()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() >= len(kept)
        seen = {id(o) for o in gc.get_objects()}  # what a collection would scan
        assert not any(id(x) in seen for x in kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
