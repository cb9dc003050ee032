"""The process tree survives its own failures (issue 14): kill -9 of the master leaves no worker
holding the port and a new ``queen serve`` starts cleanly on it; kill -9 of a worker in the middle of
HTTP requests loses nothing that was acknowledged and answers no 5xx."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx

from broker.localserver import LocalBroker
from conftest import uniq


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_9_of_the_master_takes_the_workers_down(pg, tmp_path):
    dsn = pg.new_db()
    first = LocalBroker(dsn=dsn, workers=2, log_path=tmp_path / "first.log").start()
    workers = first.worker_pids()
    assert len(workers) == 2
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers), f"workers outlived their master:\n{first.tail()}"
    second = LocalBroker(dsn=dsn, workers=2, port=first.port, log_path=tmp_path / "second.log")
    try:
        second.start(timeout=60)
        assert httpx.get(second.url + "/health").status_code == 200
    finally:
        second.stop()


def test_kill_9_of_a_worker_mid_requests_loses_nothing_acknowledged(start_broker):
    b = start_broker(workers=2)
    q = uniq("killw")
    acked: list[int] = []
    statuses: list[int] = []

    def pusher(offset: int) -> None:
        with httpx.Client(base_url=b.url, timeout=10) as c:
            for i in range(offset, offset + 150):
                try:
                    r = c.post("/api/v1/push", json={"items": [{"queue": q, "payload": {"n": i}, "transactionId": f"t{i}"}]})
                except httpx.TransportError:
                    continue  # the connection died with the worker: not acknowledged
                statuses.append(r.status_code)
                if r.status_code == 201:
                    acked.append(i)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(pusher, k * 1000) for k in range(4)]
        time.sleep(0.5)
        victim = b.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        for f in futures:
            f.result()
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    # the master restarts the worker
    b.wait_ready(60)
    got: set[int] = set()
    with httpx.Client(base_url=b.url, timeout=10) as c:
        while True:
            r = c.get(f"/api/v1/pop/queue/{q}", params={"batch": 1000, "autoAck": "true"})
            if r.status_code == 204:
                break
            got.update(m["data"]["n"] for m in r.json()["messages"])
    assert set(acked) <= got, sorted(set(acked) - got)[:10]
    assert len(acked) > 100
