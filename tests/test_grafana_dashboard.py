"""ops/grafana/queen.json queries only what a running broker exposes.

A dedicated broker gets a little of every kind of traffic (push, a woken long poll, acks, timers that
fire, a timer that fails into the DLQ, a 404, a limit refusal, a crashed-and-restarted loop); then
every metric name and every label each panel uses (in ``by (...)``, in selectors and in legends) must
be on its ``/metrics/prometheus``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path

import httpx
from conftest import uniq
from helpers import db_fetch, timer_op
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parent.parent / "ops" / "grafana" / "queen.json"
NAME = re.compile(r"\bqueen_[a-z0-9_]+\b")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
SELECTOR = re.compile(r"\{([^}]*)\}")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def targets() -> list[tuple[str, str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"], t.get("legendFormat", "")))
    return out


def uses(expr: str, legend: str) -> tuple[set[str], set[str]]:
    names = set(NAME.findall(expr))
    labels: set[str] = set()
    for group in BY.findall(expr):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    for sel in SELECTOR.findall(expr):
        labels |= {m.group(1) for m in re.finditer(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)", sel)}
    labels |= set(LEGEND.findall(legend))
    return names, labels


def exposed(url: str) -> dict[str, set[str]]:
    """Sample name -> the label names seen on it."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics/prometheus").text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def traffic(url: str) -> None:
    q, tq, fq = uniq("gq"), uniq("gtq"), uniq("gfq")
    with httpx.Client(base_url=url, timeout=30) as c:
        woken: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: woken.append(
            c.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": 10_000, "batch": 10})))
        c.post("/api/v1/configure", json={"queue": q})
        waiter.start()
        time.sleep(0.5)
        assert c.post("/api/v1/push", json={"items": [{"queue": q, "payload": {"i": i}} for i in range(3)]}).status_code == 201
        waiter.join(15)
        assert woken and woken[0].status_code == 200, woken
        popped = woken[0].json()
        for m in popped["messages"]:
            c.post("/api/v1/ack", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                        "leaseId": popped["leaseId"], "status": "completed"})
        ops = [timer_op(tq, f"k{i}", delay=50) for i in range(5)]
        assert c.post("/api/v1/timers", json={"operations": ops}).status_code == 200
        assert c.post("/api/v1/test/timers/fail", json={"queue": fq, "count": 5, "class": "permanent"}).status_code == 200
        assert c.post("/api/v1/timers", json={"operations": [timer_op(fq, "doomed", delay=10)]}).status_code == 200
        assert c.get("/api/v1/no/such/route").status_code == 404
        assert c.post("/api/v1/admin/cluster/suspended", json={"suspended": True}).status_code == 200
        try:
            assert c.post("/api/v1/push", json={"items": [{"queue": q, "payload": 1}]}).status_code == 403
        finally:
            assert c.post("/api/v1/admin/cluster/suspended", json={"suspended": False}).status_code == 200


def crash_a_loop(admin_dsn: str, db: str) -> None:
    """Terminate the broker's database sessions: its LISTEN loop crashes and is restarted."""

    db_fetch(admin_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", db)


def test_every_panel_queries_metrics_and_labels_the_broker_exposes(pg, start_broker):
    db = f"t_{uuid.uuid4().hex[:12]}"
    b = start_broker(
        dsn=pg.new_db(db), workers=1,
        env={"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_ATTEMPTS": "1", "QUEEN_SWEEPER_MAX_SLEEP_MS": "100"},
    )
    traffic(b.url)
    crash_a_loop(pg.admin_dsn, db)
    wanted = targets()
    assert len(wanted) >= 14
    deadline = time.monotonic() + 20
    while True:
        seen = exposed(b.url)
        missing = []
        for title, expr, legend in wanted:
            names, labels = uses(expr, legend)
            assert names, f"panel {title!r} queries no queen_ metric: {expr}"
            for n in names:
                if n not in seen:
                    missing.append(f"{title}: metric {n} not exposed")
                    continue
                for label in labels - seen[n]:
                    missing.append(f"{title}: metric {n} has no label {label!r} (has {sorted(seen[n])})")
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, "\n".join(missing)


def test_dashboard_is_importable_json():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "queen-broker" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    kinds = {p["type"] for p in dash["panels"]}
    assert {"heatmap", "timeseries"} <= kinds
    for p in dash["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}"
