"""``GET /metrics/prometheus`` answers for the whole broker, whichever worker serves the scrape: the
counters are sums over every worker process (Prometheus multiprocess mode), and the samples of a
worker that died stay counted."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from broker.process.localserver import LocalBroker, http_get

HEALTH_OK = {"route": "/health", "method": "GET", "status": "200"}


def sample(b: LocalBroker, name: str, labels: dict[str, str]) -> float:
    """The value of one sample in a scrape (0 when absent)."""
    r = httpx.get(b.url + "/metrics/prometheus", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def drive_health(b: LocalBroker, at_least_each: int, workers: int = 2, timeout: float = 20) -> Counter[int]:
    """GET /health on fresh connections until every worker answered at least ``at_least_each`` times."""
    per_worker: Counter[int] = Counter()
    deadline = time.monotonic() + timeout
    while len(per_worker) < workers or min(per_worker.values()) < at_least_each:
        assert time.monotonic() < deadline, f"answers per worker: {dict(per_worker)}"
        status, body = http_get(b.url + "/health")
        assert status == 200
        per_worker[body["worker_id"]] += 1
    return per_worker


def test_counters_sum_over_both_workers_and_survive_a_dead_one(start_broker):
    b = start_broker(workers=2)
    before = sample(b, "queen_http_requests_total", HEALTH_OK)
    per_worker = drive_health(b, 5)
    sent = sum(per_worker.values())
    total = sample(b, "queen_http_requests_total", HEALTH_OK)
    # One worker's samples alone would fall short by the other worker's answers.
    assert total - before == sent, (before, total, dict(per_worker))
    assert sample(b, "queen_http_request_duration_seconds_count", {"route": "/health", "method": "GET"}) >= sent
    # Every scrape, whichever worker serves it, sees the same total.
    assert {sample(b, "queen_http_requests_total", HEALTH_OK) for _ in range(6)} == {total}

    # Refusals are counted by their rendered status; unrouted paths share one label value.
    unmatched = {"route": "unmatched", "method": "GET", "status": "404"}
    n404 = sample(b, "queen_http_requests_total", unmatched)
    for _ in range(3):
        assert httpx.get(b.url + "/no/such/thing", timeout=10).status_code == 404
    assert sample(b, "queen_http_requests_total", unmatched) == n404 + 3

    # A worker killed outright: what it counted is still in the sums after its replacement starts.
    pid = http_get(b.url + "/health")[1]["pid"]
    total = sample(b, "queen_http_requests_total", HEALTH_OK)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while pid in b.worker_pids() or len(b.worker_pids()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    b.wait_ready(20)
    after = sample(b, "queen_http_requests_total", HEALTH_OK)
    assert after >= total, f"counts went backwards after a worker died: {total} -> {after}"


def test_metrics_alias_and_series_exist(http):
    r = http.get("/metrics")
    assert r.status_code == 200
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert {"queen_http_requests", "queen_http_request_duration_seconds"} <= names


DASHBOARD = Path(__file__).resolve().parent.parent / "ops" / "grafana" / "queen.json"


def _dashboard_queries() -> list[str]:
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                exprs.append(v) if k == "expr" and isinstance(v, str) else walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    return exprs


def _matches(got: str, op: str, want: str) -> bool:
    """A PromQL label matcher (=, !=, =~; a regex matches the whole value)."""
    if op == "=":
        return got == want
    if op == "!=":
        return got != want
    return re.fullmatch(want, got) is not None


def test_every_series_the_dashboard_queries_is_served_at_boot(start_broker):
    """A fresh broker, before any traffic: each selector of each dashboard query matches a sample that
    carries the labels the query groups by (so a panel reads 0, not "no data")."""
    exprs = _dashboard_queries()
    assert len(exprs) >= 10, exprs
    b = start_broker(workers=2)
    r = httpx.get(b.url + "/metrics", timeout=10)
    assert r.status_code == 200
    samples = [s for f in text_string_to_metric_families(r.text) for s in f.samples]
    missing = []
    for expr in exprs:
        by = {lbl.strip() for grp in re.findall(r"by \(([^)]*)\)", expr) for lbl in grp.split(",")} - {"le"}
        for name, sel in re.findall(r"(queen_[a-z0-9_]+)(\{[^}]*\})?", expr):
            matchers = re.findall(r'(\w+)(=~|!=|=)"([^"]*)"', sel)
            hits = [s for s in samples if s.name == name and by <= set(s.labels)
                    and all(_matches(s.labels.get(k, ""), op, v) for k, op, v in matchers)]
            if not hits:
                missing.append(f"{name}{sel} by {sorted(by)} (in {expr})")
            elif name.endswith("_total"):
                assert all(s.value == 0 for s in hits if s.labels.get("route") not in ("/metrics", "/health")), hits
    assert not missing, "\n".join(missing)
    # the label values of the closed sets, each at 0
    for name, label, values in (
        ("queen_messages_pushed_total", "source", {"push", "transaction", "timer", "stream", "dlq_replay"}),
        ("queen_messages_acked_total", "status", {"completed", "success", "failed", "retry", "dlq"}),
        ("queen_timers_fire_failures_total", "failure_class", {"transient", "permanent"}),
        ("queen_limit_refusals_total", "code", {"quota_exceeded", "rate_limited", "kv_disabled"}),
        ("queen_loop_restarts_total", "loop", {"sweeper", "log-retention", "kv-pruner", "listen"}),
        ("queen_messages_deleted_total", "result", {"deleted", "already_deleted"}),
    ):
        have = {s.labels[label] for s in samples if s.name == name and s.value == 0}
        assert values <= have, (name, values - have)


def _local(name: str, labels: dict[str, str]) -> float:
    """One sample of this process's own registry (the series are module globals)."""
    from broker import metrics

    family = metrics.HTTP_REQUESTS if name.startswith("queen_http_requests") else metrics.HTTP_LATENCY
    for fam in family.collect():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_observe_http_counts_every_request_under_its_labels_also_past_the_children_bound(monkeypatch):
    """The middleware's per-request observation looks the labelled children up once per (route, method,
    status); a request past the cache's bound is still counted (by ``labels()``)."""
    from broker import metrics

    route = f"/test/{os.getpid()}-{time.monotonic_ns()}"
    metrics.observe_http(route, "GET", 200, 0.0007)
    metrics.observe_http(route, "GET", 200, 0.002)
    metrics.observe_http(route, "GET", 404, 0.2)
    monkeypatch.setattr(metrics, "_HTTP_CHILDREN_MAX", 0)
    metrics.observe_http(route, "POST", 201, 0.0003)
    assert (route, "POST", 201) not in metrics._HTTP_CHILDREN
    assert _local("queen_http_requests_total", {"route": route, "method": "GET", "status": "200"}) == 2
    assert _local("queen_http_requests_total", {"route": route, "method": "GET", "status": "404"}) == 1
    assert _local("queen_http_requests_total", {"route": route, "method": "POST", "status": "201"}) == 1
    assert _local("queen_http_request_duration_seconds_count", {"route": route, "method": "GET"}) == 3
    assert _local("queen_http_request_duration_seconds_bucket", {"route": route, "method": "GET", "le": "0.001"}) == 1
    assert _local("queen_http_request_duration_seconds_count", {"route": route, "method": "POST"}) == 1
