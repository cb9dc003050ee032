"""/health follows the database: stop PostgreSQL under a running broker and /health turns 503 within
seconds on every worker; start it again and the same workers recover, no restart."""

from __future__ import annotations

import time

from broker.process.localserver import http_get


def _until_every_worker(url: str, want: int, workers: int, timeout: float) -> tuple[float, dict[int, dict]]:
    """Poll /health until every worker answered ``want``; return the time it took and the answers."""
    seen: dict[int, dict] = {}
    started = time.monotonic()
    while len(seen) < workers:
        assert time.monotonic() - started < timeout, f"workers {sorted(seen)} answered {want} after {timeout}s"
        status, body = http_get(url + "/health", timeout=5.0)
        if status == want:
            seen[int(body["worker_id"])] = body
        else:
            seen.pop(int(body["worker_id"]), None)
            time.sleep(0.05)
    return time.monotonic() - started, seen


def test_health_turns_503_and_recovers(controlled_pg, start_broker):
    ctl = controlled_pg.controller
    b = start_broker(dsn=controlled_pg.new_db(template=False))
    workers = sorted(b.worker_pids())
    _, healthy = _until_every_worker(b.url, 200, 2, 5)
    assert all(h["database"] == "connected" for h in healthy.values())
    # Which server the pool reached and what it is (a standby is tests/test_failover.py's case).
    assert all((h["role"], h["writable"]) == ("primary", True) for h in healthy.values()), healthy
    # A nested pytest session (the conformance and bench gates run some) resets /tmp/pytest-of-<user>
    # to 0700; pg_ctl, run as pgserver's unprivileged user when we are root, must still get through.
    ctl.pgdata.parent.parent.chmod(0o700)
    ctl.pg_ctl("stop")
    try:
        down_s, down = _until_every_worker(b.url, 503, 2, 10)
        for body in down.values():
            assert body["status"] == "unhealthy" and body["database"] == "unreachable", body
    finally:
        ctl.pg_ctl("start")
        ctl.refresh()
    up_s, up = _until_every_worker(b.url, 200, 2, 20)
    assert all(h["status"] == "healthy" for h in up.values())
    assert sorted(b.worker_pids()) == workers and b.proc.poll() is None
    print(f"/health 503 after {down_s:.2f}s, 200 again after {up_s:.2f}s")
