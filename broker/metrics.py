"""Prometheus series of the broker, in multiprocess mode.

The supervisor points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before any worker starts, so
every worker writes its samples there and ``GET /metrics/prometheus`` (served by whichever worker
answers) aggregates all of them. Series are defined here, once; code imports and updates them.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as _mp

# Fire lag. Above a second the steps are at most 2 s wide up to 10 s: a burst that drains in 5.2 s
# read as p99 8.3 s when the buckets jumped from 5 s to 10 s (a quantile is interpolated inside its bucket).
LAG_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 30.0, 60.0,
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HTTP_REQUESTS = Counter("queen_http_requests_total", "HTTP requests by route, method and status", ["route", "method", "status"])
HTTP_LATENCY = Histogram(
    "queen_http_request_duration_seconds", "HTTP request latency by route and method", ["route", "method"], buckets=LATENCY_BUCKETS
)

# The labelled children of the two series above, per (route, method, status): ``labels()`` converts,
# validates and takes a lock on every call, about 5 us of a request's CPU twice (py-spy of a route that
# answers without the database: 80 us a request, against 45 for aiohttp alone). Bounded, because a
# client chooses the method; past the bound, ``labels()`` as before.
_HTTP_CHILDREN: dict[tuple[str, str, int], tuple[Any, Any]] = {}
_HTTP_CHILDREN_MAX = 4096


def observe_http(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered request and record its latency."""
    key = (route, method, status)
    pair = _HTTP_CHILDREN.get(key)
    if pair is None:
        pair = (HTTP_REQUESTS.labels(route, method, str(status)), HTTP_LATENCY.labels(route, method))
        if len(_HTTP_CHILDREN) < _HTTP_CHILDREN_MAX:
            _HTTP_CHILDREN[key] = pair
    pair[0].inc()
    pair[1].observe(seconds)


MESSAGES_PUSHED = Counter("queen_messages_pushed_total", "Messages written to the log (push, transaction, timer fire, stream cycle)", ["source"])
MESSAGES_POPPED = Counter("queen_messages_popped_total", "Messages handed to consumers")
MESSAGES_EXPIRED = Counter("queen_messages_expired_total", "Messages whose deadline passed before a pop; moved to the DLQ")
EPHEMERAL_MESSAGES = Counter("queen_ephemeral_messages_total",
                             "Ephemeral queue messages by operation: pushed, dropped (to make room), expired (by the "
                             "expiry loop), popped, and ack outcomes (acked, redelivered, stale, unknown)", ["op"])
MESSAGES_ACKED = Counter("queen_messages_acked_total", "Acknowledgements by status", ["status"])
MESSAGES_DELETED = Counter("queen_messages_deleted_total",
                           "Message deletions (tombstones) by result: deleted, already_deleted", ["result"])
COALESCED_JOBS = Histogram(
    "queen_coalesced_requests", "Requests answered by one shared database call (group commit), by kind", ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
PUSH_LANE_JOBS = Counter(
    "queen_push_lane_jobs_total",
    "Pushes through the push lanes (broker/log/lanes.py): forwarded to the tenant's owner and answered by "
    "it, served for another worker, or written here because the owner did not take them (fallback)",
    ["result"],
)
CONFLICT_RETRIES = Counter(
    "queen_db_conflict_retries_total",
    "Statements run again after the database aborted them to resolve a deadlock or serialization failure",
)
POP_WAKE = Histogram("queen_pop_wake_seconds", "Long-poll wake-up latency (notify to answer)", buckets=LATENCY_BUCKETS)

TIMERS_FIRE_LAG = Histogram(
    "queen_timers_fire_lag_seconds", "Timer fire lag: commit time minus deliverAt, by the database clock", buckets=LAG_BUCKETS
)
TIMERS_FIRED = Counter("queen_timers_fired_total", "Timers fired into the log")
# Recurring timers (broker/timers/recur.py): occurrences advanced by the sweeper (fired or passed over by
# the missed policy) and the worker CPU spent computing their next occurrences.
TIMERS_RECUR_ADVANCED = Counter("queen_timers_recur_advanced_total", "Recurring timer occurrences advanced", ["outcome"])
TIMERS_RECUR_NEXT = Counter("queen_timers_recur_next_seconds_total", "Worker CPU seconds computing next occurrences")
TIMERS_FIRE_FAILED = Counter("queen_timers_fire_failures_total", "Failed timer fires by class", ["failure_class"])
TIMERS_DLQ = Counter("queen_timers_dlq_total", "Timers moved to their queue's DLQ after the attempt budget")
TIMERS_PENDING = Gauge("queen_timers_pending", "Pending timers (rows not yet fired), from the per-tenant counters", multiprocess_mode="max")
SWEEPER_FIRED = Gauge("queen_sweeper_fired", "Timers fired by this worker's sweeper since it started (one series per pid)", multiprocess_mode="liveall")
TIMERS_VACUUMS = Counter("queen_timers_vacuums_total", "VACUUMs of queen_timers run by this broker's timers-vacuum loop")
TIMERS_OPS = Counter("queen_timers_ops_total", "Timer operations by status", ["status"])
SWEEP_CYCLE = Histogram("queen_sweeper_cycle_seconds", "Duration of one sweep cycle (take + pack + fire)", buckets=LATENCY_BUCKETS)
SWEEP_SLEEP = Histogram("queen_sweeper_sleep_seconds", "Planned sleep between sweep cycles", buckets=LAG_BUCKETS)

LOOP_RESTARTS = Counter("queen_loop_restarts_total", "Background loops restarted after a crash", ["loop"])
KV_OPS = Counter("queen_kv_ops_total", "KV operations by op", ["op"])
KV_PRUNED = Counter("queen_kv_pruned_total", "Expired KV rows removed by the pruner")
LOCK_OPS = Counter("queen_lock_ops_total", "Lock operations by op and verdict (granted, refused)", ["op", "verdict"])
LOG_PRUNED = Counter("queen_log_pruned_total", "Messages removed from the log by queue retention")
LIMIT_REFUSALS = Counter("queen_limit_refusals_total", "Requests refused by a limit rung", ["code"])


# Closed label sets of the series above that no domain module owns a constant for (the ones that do:
# broker.log.parse.ACK_STATUSES, broker.limits.REFUSAL_CODES); broker.app creates them all at 0.
PUSH_SOURCES = ("push", "transaction", "timer", "stream", "dlq_replay")
FIRE_FAILURE_CLASSES = ("transient", "permanent")
DELETE_RESULTS = ("deleted", "already_deleted")
LANE_RESULTS = ("forwarded", "served", "fallback")


def preset(counter: Counter, values: Iterable[str]) -> None:
    """Create each value of a one-label series at 0: the series exists from boot, so a rate() over it
    reads 0 until the first event instead of "no data"."""
    for v in sorted(values):
        counter.labels(v)


def render() -> tuple[bytes, str]:
    """Prometheus text over every worker process (or this process alone outside multiprocess mode)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return generate_latest(_registry()), CONTENT_TYPE_LATEST


def _registry() -> Any:
    from prometheus_client import REGISTRY

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        _mp.MultiProcessCollector(registry)
        return registry
    return REGISTRY


# The sums the console's live charts read (GET /api/v1/status/live): metric -> key. Counters are summed
# over labels and processes, the pending gauge is the max over processes (its multiprocess mode).
_LIVE_SUMS = {
    "queen_messages_pushed": "pushed",
    "queen_messages_popped": "popped",
    "queen_messages_acked": "acked",
    "queen_timers_fired": "timersFired",
    "queen_timers_dlq": "timersDeadLettered",
    "queen_timers_pending": "timersPending",
}
_LIVE_LAG = "queen_timers_fire_lag_seconds"
# A multiprocess value's key is the JSON of [metric, sample, labels, help]: a prefix test picks ours
# without decoding the others (the per-route HTTP series are most of the files).
_LIVE_PREFIXES = tuple(f'["{m}", ' for m in (*_LIVE_SUMS, _LIVE_LAG))


def _live_values() -> Iterator[tuple[str, str, dict[str, str], float]]:
    """(metric, sample, labels, value) of the live series, from every worker's files in multiprocess mode
    (histogram buckets as stored there: per bucket, not cumulative), else from this process."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        from prometheus_client import REGISTRY

        for family in REGISTRY.collect():
            if family.name in _LIVE_SUMS or family.name == _LIVE_LAG:
                prev = 0.0
                for s in family.samples:
                    if s.name.endswith("_bucket"):  # back to per-bucket counts, as the files hold them
                        s_value, prev = s.value - prev, s.value
                        yield family.name, s.name, s.labels, s_value
                    elif not s.name.endswith("_created"):
                        yield family.name, s.name, s.labels, s.value
        return
    from prometheus_client.mmap_dict import MmapedDict

    for path in glob.glob(os.path.join(directory, "*.db")):
        try:
            values = MmapedDict.read_all_values_from_file(path)
        except FileNotFoundError:  # a dead worker's live gauge file, removed meanwhile
            continue
        for key, value, _ts, _pos in values:
            if key.startswith(_LIVE_PREFIXES):
                metric, sample, labels, _help = json.loads(key)
                yield metric, sample, labels, value


def live_snapshot() -> dict[str, Any]:
    """The broker-wide counters behind the console's live charts, summed over every label and worker
    process as the scrape sums them, and the fire-lag histogram's cumulative buckets: a few hundred bytes,
    read without decoding the rest of the series (a full collect of a fresh two-worker broker took
    ~170 ms). Rates and quantiles are the reader's (two snapshots apart)."""
    out: dict[str, Any] = {key: 0.0 for key in _LIVE_SUMS.values()}
    per_bucket: dict[float, float] = {}
    for metric, sample, labels, value in _live_values():
        if metric == _LIVE_LAG:
            if sample.endswith("_bucket"):
                le = float(labels["le"])
                per_bucket[le] = per_bucket.get(le, 0.0) + value
        elif metric == "queen_timers_pending":
            out["timersPending"] = max(out["timersPending"], value)
        else:
            out[_LIVE_SUMS[metric]] += value
    les, counts, running = [], [], 0.0
    for le in sorted(per_bucket):
        running += per_bucket[le]
        if le != float("inf"):  # +Inf is not JSON: the last bucket is the count itself
            les.append(le)
            counts.append(running)
    out["fireLag"] = {"le": les, "counts": counts, "count": running}
    return out


def mark_process_dead(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _mp.mark_process_dead(pid)
