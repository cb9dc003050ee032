"""PostgreSQL fails over under the broker: a real two-node Patroni cluster (etcd, PostgreSQL 15,
``synchronous_mode: true``, HAProxy in front) started by ``loadtest.cluster`` on loopback ports.

- kill -9 of the primary's postmaster under load (pushes, timers, KV writes, consumers) through a
  multi-host DSN: the failover harness (``loadtest.failover``) checks every acknowledged write: none
  lost, duplicated or fired twice, no 500 in the window;
- a DSN naming one node, which the failover demotes: the broker answers only 503s (``/health`` says
  ``standby`` and which server) and serves again, same processes, once that node is primary again;
- HAProxy checking Patroni's REST ``/primary``: a switchover moves the broker without a restart.

The cluster's packages are installed when missing (``loadtest.cluster.install``: apt-get as root for
etcd-server, postgresql-15 and haproxy, pip for Patroni), before any test runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.process.localserver import LocalBroker
from loadtest import cluster as cl
from loadtest import failover as fo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PUSH = {"items": [{"queue": "failover-probe", "payload": {"x": 1}}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.Cluster]:
    try:
        cl.install(quiet=True)
    except cl.ClusterError as exc:
        pytest.fail(f"cannot install the cluster's packages: {exc}", pytrace=False)
    # Under /tmp with a short name: PostgreSQL's Unix socket path must stay short, and the unprivileged
    # server user must be able to walk down to it (pytest's base temp may be 0700).
    d = Path(f"/tmp/queen-fo-{os.getpid()}")
    c = cl.Cluster.up(str(d), synchronous=True, haproxy=True)
    try:
        yield c
    finally:
        c.down()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def broker_on(tmp_path: Path) -> Iterator[object]:
    started: list[LocalBroker] = []

    def start(dsn: str, *, wait: bool = True) -> LocalBroker:
        b = LocalBroker(dsn=dsn, workers=2, log_path=tmp_path / f"broker-{len(started)}.log",
                        env={"QUEEN_SWEEPER_MAX_SLEEP_MS": "200"})
        started.append(b)
        return b.start(timeout=90, wait=wait)

    yield start
    for b in started:
        b.stop()


def _cmd(c: cl.Cluster, what: str) -> str:
    return f"{sys.executable} -m loadtest.cluster {what} --dir {c.st.dir}"


def test_kill_primary_under_load_loses_nothing(cluster: cl.Cluster, broker_on) -> None:  # type: ignore[no-untyped-def]
    b = broker_on(cluster.st.dsns()["multi"])
    p = fo.Params(url=b.url, fault_cmd=_cmd(cluster, "kill-primary"), rounds=1, fault_at=3.0, settle=3.0,
                  producers=2, schedulers=2, kv_writers=2, consumers=2, drain=30.0)
    result = fo.run(p)
    print(fo.table(result))
    assert result["round_details"][0]["fault_rc"] == 0, result["round_details"][0]["fault_output"]
    c = result["checks"]
    assert min(c["pushes"]["acknowledged"], c["timers"]["acknowledged"], c["kv"]["acknowledged"]) >= 5, c
    assert (result["lost"], result["duplicated"], result["fired_twice"], result["pending"]) == (0, 0, 0, 0), result["checks"]
    assert result["window_s"]["max"] > 0, "the fault caused no failed write: it was not a failover"
    assert set(result["classes_in_windows"]) <= {"2xx", "503", "no answer"}, result["classes_in_windows"]
    assert "500" not in result["classes_all"] and "4xx" not in result["classes_all"], result["classes_all"]
    assert result["verdict"] == "PASS", result["verdict_line"]
    log = b.log_path.read_text()
    assert "Traceback" not in log, b.tail(80)
    assert log.count("database unavailable") <= 2 * 2, b.tail(80)  # one line per worker per outage (two workers)


def _write(client: httpx.Client) -> int:
    try:
        return client.post("/api/v1/push", json=PUSH).status_code
    except httpx.HTTPError:
        return 0


def test_dsn_on_a_demoted_node_answers_503_and_recovers(cluster: cl.Cluster, broker_on) -> None:  # type: ignore[no-untyped-def]
    cluster.wait_healthy(90)
    first = cluster.primary()
    assert first is not None
    b = broker_on(cluster.st.dsns()[first.name])  # one node by name: what a stale DNS name or VIP reaches
    pids = sorted(b.worker_pids())
    with httpx.Client(base_url=b.url, timeout=10) as client:
        assert _write(client) == 201
        cluster.kill_primary()
        cluster.wait_primary(60, not_node=first.name)
        # The old primary comes back as a standby of the new one: the broker's DSN now reaches a standby.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (cluster.member(first) or {}).get("role") != "replica":
            time.sleep(0.2)
        assert (cluster.member(first) or {}).get("role") == "replica"
        # Until it accepts connections (57P03 while it catches up) /health says unreachable, then standby;
        # every write answers 503 all along.
        answers, body = [], {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (body.get("role") != "standby" or len(answers) < 20):
            answers.append(_write(client))
            health = client.get("/health")
            assert health.status_code == 503, health.text
            body = health.json()
            time.sleep(0.1)
        assert set(answers) == {503}, answers
        assert (body["database"], body["role"], body["writable"]) == ("read_only", "standby", False), body
        assert str(first.pg_port) in body["server"], body
        r = client.post("/api/v1/push", json=PUSH)
        assert r.headers.get("Retry-After") == "1" and r.json()["error"] == "unavailable", r.text
        # A broker started now, on the standby alone, waits for a writable primary (it never migrates there).
        late = broker_on(cluster.st.dsns()[first.name], wait=False)
        deadline = time.monotonic() + 30
        booting: dict = {}
        while time.monotonic() < deadline and "waiting for a writable primary" not in booting.get("detail", ""):
            try:
                booting = httpx.get(late.url + "/health", timeout=5).json()
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert booting.get("status") == "booting" and booting.get("role") == "standby", booting
        # The node becomes primary again (a switchover back): the same processes serve again.
        cluster.switchover()
        cluster.wait_primary(60, not_node=next(n.name for n in cluster.st.nodes if n.name != first.name))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _write(client) != 201:
            time.sleep(0.2)
        assert _write(client) == 201
        assert client.get("/health").json()["role"] == "primary"
    late.wait_ready(60)  # and boots once its server is the primary
    assert sorted(b.worker_pids()) == pids, "a worker was restarted"
    assert "Traceback" not in b.log_path.read_text(), b.tail(80)


def test_haproxy_follows_a_switchover(cluster: cl.Cluster, broker_on) -> None:  # type: ignore[no-untyped-def]
    cluster.wait_healthy(90)
    b = broker_on(cluster.st.dsns()["haproxy"])
    with httpx.Client(base_url=b.url, timeout=10) as client:
        before = client.get("/health").json()["server"]
        assert _write(client) == 201
        old, new = cluster.switchover()
        cluster.wait_primary(60, not_node=old.name)
        statuses = []
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            statuses.append(_write(client))
            if statuses[-1] == 201 and client.get("/health").json().get("server") != before:
                break
            time.sleep(0.1)
        assert statuses[-1] == 201, statuses
        assert set(statuses) <= {201, 503}, statuses
        assert str(new.pg_port) in client.get("/health").json()["server"]


def test_the_scenario_needs_a_url_and_a_fault_command(capsys) -> None:
    from loadtest import runner

    assert runner.main(["failover", "--fault-cmd", "true"]) == 2
    assert runner.main(["failover", "--url", "http://127.0.0.1:1"]) == 2
    assert "--fault-cmd" in capsys.readouterr().err


def test_only_a_delivery_after_an_acknowledged_ack_counts_twice() -> None:
    assert not fo._twice([True])
    assert not fo._twice([False, True])  # the first ack failed: redelivery is the lease doing its job
    assert not fo._twice([False, False])
    assert fo._twice([True, True]) and fo._twice([False, True, False])


def test_the_window_spans_the_failed_writes_of_its_round() -> None:
    run = fo.Run.__new__(fo.Run)
    run.answers = [fo.Answer("push", 1.0, 1.1, "2xx", 201), fo.Answer("push", 5.0, 5.2, "503", 503),
                   fo.Answer("pop", 5.5, 5.6, "503", 503), fo.Answer("kv", 6.0, 7.5, "no answer"),
                   fo.Answer("timer", 8.0, 8.1, "2xx", 200), fo.Answer("push", 20.0, 20.5, "503", 503)]
    rnd = fo.Round(1, fault_started=4.8)
    run.window_of(rnd, until=15.0)
    assert rnd.window == (5.0, 7.5) and rnd.window_s == 2.5
    assert rnd.classes == {"503": 2, "no answer": 1}
