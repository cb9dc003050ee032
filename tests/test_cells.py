"""Cells (broker/cells/): two cells behind a real HAProxy, the database-side freeze, a tenant moved.

Two cells here are two databases of the session's PostgreSQL, each with its own ``queen serve``, and
Debian's HAProxy in front (installed when missing, as root with apt-get: broker/cells/haproxy.py).
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import run_sync
from helpers import db_fetch, refused, wait_for

from broker.auth import mint
from broker.cells import haproxy
from broker.cells.local import LocalCells
from broker.cells.move import MoveError, Proxy, move

pytestmark = pytest.mark.slow

# Tables with a tenant column that hold no tenant state to move: the wake-up registry of long polls
# (per worker), the test hooks' injected faults, the freeze itself, the cell-wide switches.
NOT_MOVED = {"queen_listeners", "queen_timer_faults", "queen_tenant_freeze", "queen_cell_switches"}


@pytest.fixture(scope="module")
def cells(pg: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCells]:
    base = tmp_path_factory.mktemp("cells")
    c = LocalCells(base, dsns={"a": pg.new_db(), "b": pg.new_db()}, workers=1,
                   mapping={"t-in-a": "a", "t-in-b": "b"})
    c.start()
    yield c
    c.stop()


def client(cells: LocalCells, tenant: str, url: str | None = None) -> httpx.Client:
    token = mint(tenant=tenant, sub="svc", grants=["produce", "consume", "admin"], secret=cells.secret)
    return httpx.Client(base_url=url or cells.proxy_url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0)


def push(c: httpx.Client, queue: str, txns: list[str], partition: str = "Default") -> httpx.Response:
    return c.post("/api/v1/push", json={"items": [{"queue": queue, "partition": partition, "payload": {"t": t},
                                                   "transactionId": t} for t in txns]})


def found(c: httpx.Client, queue: str, txn: str) -> bool:
    r = c.get("/api/v1/messages/lookup", params={"queue": queue, "txn": txn})
    assert r.status_code == 200, r.text
    return bool(r.json()["found"])


def drain(c: httpx.Client, queue: str, **params: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        r = c.get(f"/api/v1/pop/queue/{queue}", params={"batch": "500", "wait": "false", "autoAck": "true", **params})
        if r.status_code == 204:
            return out
        assert r.status_code == 200, r.text
        got = [m for m in r.json()["messages"] if m]
        if not got:
            return out
        out.extend(got)


def timer(queue: str, key: str, delay_ms: int, txn: str | None = None) -> dict[str, Any]:
    return {"op": "schedule", "queue": queue, "timerKey": key, "delayMs": delay_ms, "txn": txn or uuid.uuid4().hex,
            "payload": base64.b64encode(orjson.dumps({"k": key})).decode()}


def census(dsn: str, tenant: str) -> dict[str, int]:
    return {r["tbl"]: r["n"] for r in db_fetch(dsn, "SELECT tbl, n FROM queen_cells_census($1)", tenant) if r["n"]}


# ------------------------------------------------------------------------------------------ the proxy


def test_generated_config_is_accepted_by_haproxy(tmp_path: Path) -> None:
    cfg = haproxy.ProxyConfig(cells=(haproxy.Cell("a", ("127.0.0.1:1",)), haproxy.Cell("b", ("127.0.0.1:2", "127.0.0.1:3"))),
                              default="b", bind="127.0.0.1:6999", map_path=tmp_path / "t.map", socket_path=tmp_path / "s.sock")
    haproxy.write_map(cfg.map_path, {"x": "a"})
    (tmp_path / "h.cfg").write_text(haproxy.render(cfg))
    haproxy.check_config(haproxy.ensure_installed(), tmp_path / "h.cfg")
    assert haproxy.read_map(cfg.map_path) == {"x": "a"}
    with pytest.raises(ValueError):
        haproxy.ProxyConfig(cells=cfg.cells, default="c", bind="x:1", map_path=cfg.map_path, socket_path=cfg.socket_path)
    with pytest.raises(ValueError):
        haproxy.write_map(cfg.map_path, {"bad tenant": "a"})


def test_the_freeze_guards_every_table_that_holds_a_tenant(pg: Any) -> None:
    dsn = pg.new_db()
    with_tenant = {r["table_name"] for r in db_fetch(
        dsn, "SELECT table_name::text FROM information_schema.columns WHERE table_schema = current_schema() "
             "AND column_name = 'tenant' AND table_name::text LIKE 'queen\\_%'")}
    guarded = {r["tbl"] for r in db_fetch(dsn, "SELECT queen_cells_tables() AS tbl")}
    assert guarded == with_tenant - NOT_MOVED


def test_the_token_routes_each_tenant_to_its_cell(cells: LocalCells) -> None:
    for tenant, home, other in (("t-in-a", "a", "b"), ("t-in-b", "b", "a"), ("t-unmapped", "a", "b")):
        txn = uuid.uuid4().hex
        with client(cells, tenant) as via, client(cells, tenant, cells.url(home)) as here, \
                client(cells, tenant, cells.url(other)) as there:
            assert push(via, "routed", [txn]).status_code in (200, 201)
            assert found(here, "routed", txn), f"{tenant}'s push did not land in cell {home}"
            assert not found(there, "routed", txn), f"{tenant}'s push is visible in cell {other}"


def test_operators_reach_each_cell_health_and_metrics(cells: LocalCells) -> None:
    with httpx.Client(timeout=10) as h:
        for name in ("a", "b"):
            direct = h.get(f"{cells.url(name)}/health").json()
            proxied = h.get(f"{cells.proxy_url}/cells/{name}/health")
            assert proxied.status_code == 200 and proxied.json()["pid"] == direct["pid"], (proxied.text, direct)
            metrics = h.get(f"{cells.proxy_url}/cells/{name}/metrics")
            assert metrics.status_code == 200 and "queen_" in metrics.text
        # no token: the default cell answers (401 there, since authentication is on)
        assert h.get(f"{cells.proxy_url}/api/v1/queues").status_code == 401


# ------------------------------------------------------------------------------------------ the freeze


def test_a_frozen_tenant_is_refused_by_the_database_with_retry_after(cells: LocalCells) -> None:
    dsn = cells.dsn("a")
    with client(cells, "t-in-a") as mine, client(cells, "t-unmapped") as other:
        assert push(mine, "fz", [uuid.uuid4().hex]).status_code in (200, 201)
        db_fetch(dsn, "INSERT INTO queen_tenant_freeze (tenant, state, retry_after_s) VALUES ('t-in-a', 'moving_out', 3)")
        try:
            txn = uuid.uuid4().hex
            body = refused(push(mine, "fz", [txn]), 503, "unavailable", "tenant_frozen")
            assert body["retryAfterS"] == 3
            r = push(mine, "fz", [uuid.uuid4().hex])
            assert r.headers["Retry-After"] == "3"
            refused(mine.post("/api/v1/timers", json={"operations": [timer("fz", "k", 60_000)]}), 503, "unavailable", "tenant_frozen")
            refused(mine.post("/api/v1/kv", json={"operations": [{"op": "put", "ns": "n", "key": "k", "value": 1,
                                                                   "forever": True}]}), 503, "unavailable", "tenant_frozen")
            r = mine.get("/api/v1/pop/queue/fz", params={"wait": "false", "autoAck": "true"})
            refused(r, 503, "unavailable", "tenant_frozen")
            # another tenant of the same cell is not held up
            assert push(other, "fz", [uuid.uuid4().hex]).status_code in (200, 201)
        finally:
            db_fetch(dsn, "DELETE FROM queen_tenant_freeze WHERE tenant = 't-in-a'")
        assert not found(mine, "fz", txn), "a refused push was written"
        assert push(mine, "fz", [uuid.uuid4().hex]).status_code in (200, 201)


# ------------------------------------------------------------------------------------------ the move


def _proxy(cells: LocalCells, cell: str) -> Proxy:
    return Proxy(cells.socket_path, cells.map_path, cell)


def test_a_tenant_moves_with_its_whole_state(cells: LocalCells) -> None:
    tenant = f"mv-{uuid.uuid4().hex[:8]}"
    cells.switch(tenant, "a")
    with client(cells, tenant) as via:
        txns = [f"m{i}" for i in range(6)]
        assert push(via, "orders", txns).status_code in (200, 201)
        # queue mode: two done, one leased and still open at the move
        done = via.get("/api/v1/pop/queue/orders", params={"batch": "2", "wait": "false", "autoAck": "true"}).json()["messages"]
        leased = via.get("/api/v1/pop/queue/orders", params={"batch": "1", "wait": "false"}).json()["messages"][0]
        # a consumer group that has read four
        grp = via.get("/api/v1/pop/queue/orders", params={"batch": "4", "wait": "false", "autoAck": "true",
                                                          "consumerGroup": "g1"}).json()["messages"]
        # a dead letter
        assert via.post("/api/v1/configure", json={"queue": "dead", "namespace": None, "task": None,
                                                   "options": {"retryLimit": 0, "dlqAfterMaxRetries": True}}).status_code == 200
        assert push(via, "dead", ["d1"]).status_code in (200, 201)
        m = via.get("/api/v1/pop/queue/dead", params={"wait": "false"}).json()["messages"][0]
        via.post("/api/v1/ack", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                      "leaseId": m["leaseId"], "status": "failed", "error": "boom"})
        dlq_before = via.get("/api/v1/dlq", params={"queue": "dead"}).json()["messages"]
        # timers: one far away, one soon; KV with versions
        far = timer("tq", "far", 3_600_000)
        soon_txn = uuid.uuid4().hex
        assert via.post("/api/v1/timers", json={"operations": [far, timer("tq", "soon", 1_500, soon_txn)]}).status_code == 200
        kv = via.post("/api/v1/kv", json={"operations": [{"op": "put", "ns": "n", "key": "k1", "value": {"v": 1}, "forever": True},
                                                          {"op": "put", "ns": "n", "key": "k2", "value": 2, "forever": True}]}).json()
        versions = {r["key"] if "key" in r else i: r["version"] for i, r in enumerate(kv["results"])}
        src_rows = census(cells.dsn("a"), tenant)
        pid = haproxy.RuntimeApi(cells.socket_path).pid()

        report = run_sync(move(tenant, cells.dsn("a"), cells.dsn("b"), proxy=_proxy(cells, "b"), target_name="b"))

        assert report.proxy_switched and report.rows == src_rows, (report.rows, src_rows)
        assert haproxy.RuntimeApi(cells.socket_path).pid() == pid, "the proxy was reloaded"
        assert haproxy.read_map(cells.map_path)[tenant] == "b"
        assert census(cells.dsn("a"), tenant) == {}, "the source kept rows of the moved tenant"
        with client(cells, tenant, cells.url("b")) as there:
            # the rest of queue mode: the lease is still open (ack it with its lease), then m3..m5
            ack = there.post("/api/v1/ack", json={"transactionId": leased["transactionId"], "partitionId": leased["partitionId"],
                                                  "leaseId": leased["leaseId"], "status": "completed"})
            assert ack.status_code == 200 and ack.json()[0].get("error") in (None, ""), ack.text
            rest = [m["transactionId"] for m in drain(there, "orders")]
            assert rest == [t for t in txns if t not in {d["transactionId"] for d in done} | {leased["transactionId"]}]
            # the group goes on after its fourth, with the same offsets
            assert [m["transactionId"] for m in drain(there, "orders", consumerGroup="g1")] == txns[len(grp):]
            assert there.get("/api/v1/dlq", params={"queue": "dead"}).json()["messages"] == dlq_before
            peek = there.get("/api/v1/timers/tq/far").json()
            assert peek["found"] and peek.get("txn", far["txn"]) == far["txn"], peek
            got = there.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "n", "key": "k1"},
                                                                 {"op": "get", "ns": "n", "key": "k2"}]}).json()["results"]
            assert [g["version"] for g in got] == list(versions.values()) and got[0]["value"] == {"v": 1}
            # the soon timer fires in the target, once
            wait_for(lambda: found(there, "tq", soon_txn), timeout=20, what="the soon timer fired in the target")
            assert [m["transactionId"] for m in drain(there, "tq")] == [soon_txn]
        with client(cells, tenant, cells.url("a")) as old:
            refused(push(old, "orders", ["late"]), 503, "unavailable", "tenant_frozen")
        # new writes through the proxy land in the target
        assert push(via, "orders", ["after"]).status_code in (200, 201)
        with client(cells, tenant, cells.url("b")) as there:
            assert found(there, "orders", "after")


def test_a_move_to_a_cell_that_holds_the_tenant_is_refused_and_changes_nothing(cells: LocalCells) -> None:
    with client(cells, "t-in-a") as mine, client(cells, "t-in-a", cells.url("b")) as b_direct:
        assert push(mine, "keep", ["k1"]).status_code in (200, 201)
        assert push(b_direct, "stray", ["s1"]).status_code in (200, 201)
        before = census(cells.dsn("a"), "t-in-a")
        with pytest.raises(MoveError, match="already holds"):
            run_sync(move("t-in-a", cells.dsn("a"), cells.dsn("b"), proxy=_proxy(cells, "b")))
        assert census(cells.dsn("a"), "t-in-a") == before
        assert haproxy.read_map(cells.map_path)["t-in-a"] == "a"
        assert push(mine, "keep", ["k2"]).status_code in (200, 201)  # not left frozen
        db_fetch(cells.dsn("b"), "SELECT queen_cells_forget('t-in-a')")


def test_a_move_under_load_loses_and_repeats_nothing(cells: LocalCells) -> None:
    """Pushes, timers due during the move and a consumer, all through the proxy, while the tenant moves:
    every acknowledged push and timer is delivered, once, in the target."""
    tenant = f"ld-{uuid.uuid4().hex[:8]}"
    cells.switch(tenant, "a")
    acked: list[str] = []
    delivered: list[str] = []
    timers: list[str] = []
    stop = threading.Event()
    errors: list[str] = []

    def producer() -> None:
        with client(cells, tenant) as c:
            i = 0
            while not stop.is_set():
                txn = f"p{i}"
                r = push(c, "load", [txn])
                if r.status_code in (200, 201):
                    acked.append(txn)
                    i += 1
                elif r.status_code == 503:
                    time.sleep(0.02)
                else:
                    errors.append(r.text)
                if i % 5 == 0:
                    t = uuid.uuid4().hex  # its own key too: a key scheduled again replaces its timer
                    r = c.post("/api/v1/timers", json={"operations": [timer("load", t, 300, t)]})
                    if r.status_code == 200:
                        assert r.json()["results"][0]["status"] == "scheduled", r.text
                        timers.append(t)

    def consumer() -> None:
        with client(cells, tenant) as c:
            while not stop.is_set() or len(delivered) < len(acked) + len(timers):
                r = c.get("/api/v1/pop/queue/load", params={"batch": "100", "wait": "true", "timeout": "200"})
                if r.status_code == 200:
                    msgs = [m for m in r.json()["messages"] if m]
                    delivered.extend(m["transactionId"] for m in msgs)
                    # an ack refused with 503 (frozen) is retried until it lands: the lease moved with the
                    # tenant, so the ack is good in the target
                    body = {"acknowledgments": [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                                 "leaseId": m["leaseId"], "status": "completed"} for m in msgs]}
                    while (a := c.post("/api/v1/ack/batch", json=body)).status_code == 503:
                        time.sleep(0.05)
                    if a.status_code != 200:
                        errors.append(a.text)
                elif r.status_code not in (204, 503):
                    errors.append(r.text)
                if stop.is_set() and time.monotonic() > deadline[0]:
                    return

    deadline = [float("inf")]
    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    report = run_sync(move(tenant, cells.dsn("a"), cells.dsn("b"), proxy=_proxy(cells, "b"), target_name="b"))
    time.sleep(1.5)
    stop.set()
    deadline[0] = time.monotonic() + 20
    for t in threads:
        t.join(30)
    assert not errors, errors[:3]
    assert len(acked) > 10 and report.freeze_s > 0
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"
    missing = (set(acked) | set(timers)) - set(delivered)
    assert not missing, f"{len(missing)} acknowledged writes never delivered: {sorted(missing)[:5]}"
    assert census(cells.dsn("a"), tenant) == {}


# ------------------------------------------------------------------------------------------ the suite, the CLI


def test_the_cell_contracts_pass_through_the_proxy(cells: LocalCells, tmp_path: Path) -> None:
    """``queen conformance`` through the proxy, tenants A and B in different cells, strict: the CELL
    family must pass, not be NOT VERIFIED."""
    import json
    import subprocess
    import sys

    tok = {t: mint(tenant=t, sub="cf", grants=["produce", "consume"], secret=cells.secret) for t in ("t-in-a", "t-in-b")}
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "broker", "conformance", "--url", cells.proxy_url, "--token", tok["t-in-a"],
         "--token-b", tok["t-in-b"], "--cell-url-a", cells.url("a"), "--cell-url-b", cells.url("b"),
         "--contract", "CELL-HOME", "--contract", "CELL-ISOLATED", "--strict", "--report", str(report), "-q"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    contracts = json.loads(report.read_text())["contracts"]
    assert {c: contracts[c]["status"] for c in ("CELL-HOME", "CELL-ISOLATED")} == {"CELL-HOME": "passed", "CELL-ISOLATED": "passed"}


def test_queen_cells_up_status_down(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    d = tmp_path / "cells"

    def queen(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "broker", "cells", *args, "--dir", str(d)], capture_output=True,
                              text=True, timeout=300)

    up = queen("up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr + (d / "cells.log").read_text()[-3000:]
        assert "proxy" in up.stdout and "cell a" in up.stdout and "cell b" in up.stdout
        assert queen("up").returncode == 1  # already up
        st = queen("status")
        assert st.returncode == 0 and st.stdout.count("direct 200, via proxy 200") == 2, st.stdout + st.stderr
        state = json.loads(queen("status", "--json").stdout)
        assert queen("route", "someone", "b").returncode == 0
        assert "someone" in queen("status").stdout and haproxy.read_map(Path(state["map"])) == {"someone": "b"}
        assert queen("route", "someone", "zz").returncode == 2
        token = mint(tenant="someone", sub="s", grants=["produce", "consume"], secret=state["secret"])
        r = httpx.post(f"{state['proxy']}/api/v1/push", headers={"Authorization": f"Bearer {token}"},
                       json={"items": [{"queue": "q", "payload": {}, "transactionId": "x"}]})
        assert r.status_code in (200, 201), r.text
        r = httpx.get(f"{state['cells']['b']['url']}/api/v1/messages/lookup", params={"queue": "q", "txn": "x"},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.json()["found"], "the routed tenant's push did not land in cell b"
        # and back to cell a with the command line
        mv = subprocess.run([sys.executable, "-m", "broker", "tenant", "move", "someone", "--from", state["cells"]["b"]["dsn"],
                             "--to", state["cells"]["a"]["dsn"], "--cells-dir", str(d), "--to-cell", "a"],
                            capture_output=True, text=True, timeout=120)
        assert mv.returncode == 0, mv.stdout + mv.stderr
        assert json.loads(mv.stdout)["proxy_switched"] and haproxy.read_map(Path(state["map"])) == {"someone": "a"}
        r = httpx.get(f"{state['proxy']}/api/v1/messages/lookup", params={"queue": "q", "txn": "x"},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.json()["found"], "the moved tenant's message is not reachable through the proxy"
        half = subprocess.run([sys.executable, "-m", "broker", "tenant", "move", "someone", "--from", "x", "--to", "y",
                               "--proxy-socket", state["socket"]], capture_output=True, text=True, timeout=60)
        assert half.returncode == 2 and "--to-cell" in half.stderr
        uf = subprocess.run([sys.executable, "-m", "broker", "tenant", "unfreeze", "someone", "--db", state["cells"]["b"]["dsn"]],
                            capture_output=True, text=True, timeout=60)
        assert uf.returncode == 0 and "was moved" in uf.stdout, uf.stdout + uf.stderr
    finally:
        down = queen("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert queen("status").returncode == 1


def test_the_cells_move_scenario_checks_every_acknowledged_write(pg: Any, tmp_path: Path) -> None:
    """``queen loadtest cells_move`` in small: the move under load passes its own checks."""
    from loadtest import cells_move

    res = cells_move.run(cells_move.Params(timers=300, messages=500, duration=5, move_at=2, producers=2, consumers=1,
                                           latency_samples=20, drain=20, base_dir=str(tmp_path / "lt"),
                                           dsn_a=pg.new_db(), dsn_b=pg.new_db()))
    assert res["ok"], res
    assert res["lost"] == 0 and res["delivered_twice"] == 0 and res["source_rows_after"] == {}
    assert res["backlog_in_target"]["timers"] >= 300 and res["backlog_in_target"]["messages"] >= 500
    assert res["move"]["proxy_switched"] and res["freeze_ms"] > 0
    assert {"whoami", "push"} <= set(res["proxy_latency"])


def test_a_timer_due_during_the_freeze_fires_once_in_the_target_late_by_at_most_the_freeze(cells: LocalCells) -> None:
    """The freeze is stretched to ~3 s by holding a lock the copy needs in the source (queen_kv, which
    the mover counts inside its snapshot); a timer due 1.5 s after the move starts falls inside it: it
    must not fire in the source, and must fire once in the target as soon as the tenant resumes."""
    import asyncio

    import asyncpg

    tenant = f"fz-{uuid.uuid4().hex[:8]}"
    cells.switch(tenant, "a")
    txn = uuid.uuid4().hex
    held = threading.Event()

    async def hold_kv() -> None:
        conn = await asyncpg.connect(cells.dsn("a"))
        try:
            async with conn.transaction():
                await conn.execute("LOCK TABLE queen_kv IN ACCESS EXCLUSIVE MODE")
                held.set()
                await asyncio.sleep(3.0)
        finally:
            await conn.close()

    with client(cells, tenant) as via:
        blocker = threading.Thread(target=run_sync, args=(hold_kv(),))
        blocker.start()
        assert held.wait(30)
        r = via.post("/api/v1/timers", json={"operations": [timer("due", "k", 1_500, txn)]})
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "scheduled", r.text
        due = time.time() + 1.5
        report = run_sync(move(tenant, cells.dsn("a"), cells.dsn("b"), proxy=_proxy(cells, "b"), target_name="b"))
        blocker.join(30)
        assert report.frozen_at < due < report.resumed_at, report.as_dict()  # due inside the freeze
        with client(cells, tenant, cells.url("b")) as there:
            wait_for(lambda: found(there, "due", txn), timeout=30, interval=0.02, what="the timer fired in the target")
            assert [m["transactionId"] for m in drain(there, "due")] == [txn]
        # late by at most the freeze (plus a sweeper's wake-up on a loaded machine), by the database's clock
        row = db_fetch(cells.dsn("b"), "SELECT extract(epoch FROM created_at)::float8 AS at FROM queen_messages "
                                       "WHERE tenant = $1 AND txn = $2", tenant, txn)
        assert len(row) == 1
        assert report.resumed_at - 0.05 <= row[0]["at"] <= due + report.freeze_s + 1.0, (row[0]["at"] - due, report.as_dict())
    assert census(cells.dsn("a"), tenant) == {}
    assert db_fetch(cells.dsn("a"), "SELECT count(*) AS n FROM queen_messages WHERE txn = $1", txn)[0]["n"] == 0
