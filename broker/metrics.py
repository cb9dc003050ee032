"""Prometheus series of the broker, in multiprocess mode.

The supervisor points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before any worker starts, so
every worker writes its samples there and ``GET /metrics/prometheus`` (served by whichever worker
answers) aggregates all of them. Series are defined here, once; code imports and updates them.
"""

from __future__ import annotations

import os

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

MESSAGES_PUSHED = Counter("queen_messages_pushed_total", "Messages written to the log (push, transaction, timer fire, stream cycle)", ["source"])
MESSAGES_POPPED = Counter("queen_messages_popped_total", "Messages handed to consumers")
MESSAGES_EXPIRED = Counter("queen_messages_expired_total", "Messages whose deadline passed before a pop; moved to the DLQ")
EPHEMERAL_MESSAGES = Counter("queen_ephemeral_messages_total",
                             "Ephemeral queue messages by operation: pushed, dropped (to make room), expired (by the "
                             "expiry loop), popped, and ack outcomes (acked, redelivered, stale, unknown)", ["op"])
MESSAGES_ACKED = Counter("queen_messages_acked_total", "Acknowledgements by status", ["status"])
COALESCED_JOBS = Histogram(
    "queen_coalesced_requests", "Requests answered by one shared database call (group commit), by kind", ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
POP_WAKE = Histogram("queen_pop_wake_seconds", "Long-poll wake-up latency (notify to answer)", buckets=LATENCY_BUCKETS)

TIMERS_FIRE_LAG = Histogram(
    "queen_timers_fire_lag_seconds", "Timer fire lag: commit time minus deliverAt, by the database clock", buckets=LAG_BUCKETS
)
TIMERS_FIRED = Counter("queen_timers_fired_total", "Timers fired into the log")
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


def render() -> tuple[bytes, str]:
    """Prometheus text over every worker process (or this process alone outside multiprocess mode)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        _mp.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def mark_process_dead(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _mp.mark_process_dead(pid)
