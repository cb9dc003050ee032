"""The master process of ``queen serve``: a worker killed with SIGKILL is restarted (logged) while the
port keeps answering; SIGTERM drains (in-flight requests complete, new connections are refused, exit
0); ``--port`` and ``QUEEN_WORKERS`` are honoured."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from broker.process.localserver import LocalBroker, free_port, http_get


def _pid_to_worker(url: str, workers: int, timeout: float = 10.0) -> dict[int, int]:
    """Map worker pid -> worker index from /health answers (fresh connection each)."""
    seen: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < workers:
        assert time.monotonic() < deadline, f"only {seen} answered"
        status, body = http_get(url + "/health")
        assert status == 200, body
        seen[body["pid"]] = body["worker_id"]
    return seen


def test_killed_worker_is_restarted_while_the_port_keeps_answering(start_broker):
    b = start_broker(workers=2)
    before = _pid_to_worker(b.url, 2)
    assert sorted(before) == sorted(b.worker_pids())
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    # Sequential requests on fresh connections from the moment of the kill until the replacement answers:
    # every one must be answered 200 (the surviving worker serves while the new one boots).
    answers, replacement = 0, None
    deadline = time.monotonic() + 30
    while replacement is None or answers < 20:
        assert time.monotonic() < deadline, f"no replacement answered within 30s:\n{b.tail()}"
        status, body = http_get(b.url + "/health", timeout=5)
        assert status == 200, (status, body)
        answers += 1
        assert body["pid"] != victim
        if body["pid"] not in before:
            replacement = body
    assert replacement["worker_id"] == before[victim], "the replacement took another worker slot"
    assert victim not in b.worker_pids() and len(b.worker_pids()) == 2
    log = b.tail(400)
    assert f"worker {before[victim]} (pid {victim}) died with exit code -9; restarting" in log
    assert f"worker {before[victim]} started (pid {replacement['pid']})" in log
    assert b.stop() == 0


def _refused(port: int) -> bool:
    """True when a new connection is refused or reset at once (not left waiting in a backlog)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(100) == b""  # accepted but closed without an answer
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except TimeoutError:
        return False  # left hanging in a backlog nobody serves


def test_sigterm_drains_in_flight_requests_then_exits_0(start_broker):
    b = start_broker(workers=2, env={"QUEEN_TEST_HOOKS": "1", "QUEEN_DRAIN_TIMEOUT_S": "10"})
    with httpx.Client(timeout=30) as c, c.stream("GET", b.url + "/api/v1/test/sleep", params={"ms": 2500}) as r:
        assert r.status_code == 200  # headers are out: the request is inside a worker, sleeping
        sent = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        while not _refused(b.port):  # each probe waits 0.5 s for an answer that must not come
            assert time.monotonic() - sent < 2, "new connections were still accepted (or left hanging) during the drain"
        assert b.proc.poll() is None, "the master exited before its in-flight request completed"
        body = orjson.loads(r.read())
    assert body["slept_ms"] == 2500
    assert b.proc.wait(20) == 0
    assert time.monotonic() - sent < 10
    assert _refused(b.port)
    log = b.tail(100)
    assert "received SIGTERM: draining" in log and "all workers stopped" in log
    assert "did not drain in time" not in log


def test_port_flag_and_workers_env_are_honoured(pg, tmp_path: Path):
    port, other = free_port(), free_port()
    b = LocalBroker(dsn=pg.new_db(), workers=3, port=port, env={"QUEEN_PORT": str(other)}, log_path=tmp_path / "b.log")
    queen = Path(sys.executable).with_name("queen")
    with open(b.log_path, "ab") as log:
        b.proc = subprocess.Popen(
            [str(queen), "serve", "--port", str(port)], env=b.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        b.wait_ready(30)  # /health 200 from worker ids 0, 1 and 2 on --port
        assert len(b.worker_pids()) == 3
        assert sorted(_pid_to_worker(b.url, 3).values()) == [0, 1, 2]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{other}/health", timeout=2)
        assert f"listening on http://127.0.0.1:{port} with 3 workers" in b.tail()
    finally:
        assert b.stop() == 0
