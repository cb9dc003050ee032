"""The process tree survives its own failures: kill -9 of the master leaves no worker
holding the port and a new ``queen serve`` starts cleanly on it; kill -9 of a worker in the middle of
HTTP requests loses nothing that was acknowledged and answers no 5xx."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import httpx
from conftest import uniq

from broker.process.localserver import LocalBroker
from broker.process.pids import alive


def test_kill_9_of_the_master_takes_the_workers_down(pg, tmp_path):
    dsn = pg.new_db()
    first = LocalBroker(dsn=dsn, workers=2, log_path=tmp_path / "first.log").start()
    workers = first.worker_pids()
    assert len(workers) == 2
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in workers), f"workers outlived their master:\n{first.tail()}"
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


def test_client_disconnect_mid_request_applies_all_or_nothing(broker):
    """Transactions (two pushes and a KV put) whose client hangs up right after sending, or half-way
    through the body: each is applied whole or not at all."""
    import json
    import socket

    q, ns = uniq("disc"), uniq("disc").replace("-", "")
    host, port = broker.url.removeprefix("http://").split(":")
    for i in range(40):
        body = json.dumps({"operations": [
            {"type": "push", "items": [{"queue": q, "payload": {"i": i, "part": 1}}, {"queue": q, "payload": {"i": i, "part": 2}}]},
        ], "kv": [{"op": "put", "ns": ns, "key": f"k{i}", "value": i, "forever": True}]}).encode()
        raw = (b"POST /api/v1/transaction HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
        with socket.create_connection((host, int(port))) as s:
            s.sendall(raw if i % 2 else raw[: len(raw) - len(body) // 2])
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    time.sleep(1.0)
    parts: dict[int, set[int]] = {}
    with httpx.Client(base_url=broker.url, timeout=10) as c:
        while True:
            r = c.get(f"/api/v1/pop/queue/{q}", params={"batch": 1000, "autoAck": "true"})
            if r.status_code == 204:
                break
            for m in r.json()["messages"]:
                parts.setdefault(m["data"]["i"], set()).add(m["data"]["part"])
        kv = c.post("/api/v1/kv", json={"operations": [{"op": "getMany", "ns": ns, "keys": [f"k{i}" for i in range(40)]}]})
        present = {row["value"] for row in kv.json()["results"][0]["rows"]}
    for i in range(40):
        pushed = parts.get(i, set())
        assert pushed in (set(), {1, 2}), (i, pushed)
        assert (i in present) == bool(pushed), (i, pushed, i in present)
        if i % 2 == 0:
            assert not pushed, f"half a body was applied ({i})"
    assert any(parts.get(i) for i in range(1, 40, 2)), "no complete body was applied: the test proves nothing"


def test_a_command_ended_by_sigterm_stops_the_broker_it_started(pg, tmp_path):
    """A bench or runner under ``timeout`` (or a CI runner's cancel) gets SIGTERM. With
    ``exit_on_sigterm`` its ``finally`` still runs and the broker it started (in a session of its own,
    so it would outlive the parent) is stopped; without it, the broker stays behind."""
    script = tmp_path / "command.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from broker.process.localserver import LocalBroker, exit_on_sigterm\n"
        "if sys.argv[2] == 'on':\n"
        "    exit_on_sigterm()\n"
        "b = LocalBroker(dsn=sys.argv[1], workers=1, log_path=Path(sys.argv[3]))\n"
        "b.start()\n"
        "try:\n"
        "    print(b.proc.pid, flush=True)\n"
        "    time.sleep(120)\n"
        "finally:\n"
        "    b.stop()\n"
    )
    leftover: list[int] = []
    try:
        for mode in ("on", "off"):
            cmd = subprocess.Popen([sys.executable, str(script), pg.new_db(), mode, str(tmp_path / f"{mode}.log")],
                                   stdout=subprocess.PIPE, text=True)
            assert cmd.stdout is not None
            broker_pid = int(cmd.stdout.readline())
            cmd.send_signal(signal.SIGTERM)
            cmd.wait(60)
            deadline = time.monotonic() + (30 if mode == "on" else 2)
            while alive(broker_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if mode == "on":
                assert cmd.returncode == 128 + signal.SIGTERM
                assert not alive(broker_pid), "the broker outlived the command that started it"
            else:
                assert alive(broker_pid), "without the handler the broker stays: the test shows nothing"
                leftover.append(broker_pid)
    finally:
        for pid in leftover:
            os.killpg(pid, signal.SIGTERM)
