"""Pieces every locustfile shares: command-line options, custom request events, the broker scraper.

Importing this module from a locustfile registers:

- ``--prom-out FILE`` / ``--scrape-interval S``: on the master (or the single local runner) a greenlet
  scrapes ``/metrics/prometheus`` every S seconds while the test runs and, when it stops, writes the
  timeline (timer fire-lag histogram buckets and a few counters) as JSON to FILE. The runner turns it
  into quantiles over time; a plain ``locust -f`` user gets a one-line summary in the log.
- ``record(...)``: a custom request event (``FIRE_LAG``, ``DELIVERY_LAG``, ...) so a measured quantity
  shows up in Locust's own statistics, CSV files and charts next to the HTTP requests.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import time
import uuid
from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.runners import WorkerRunner

from loadtest import prom
from loadtest.timefmt import parse_iso

log = logging.getLogger("queen.loadtest")

# One id per process, so queues of concurrent processes (distributed workers) never collide.
RUN_ID = os.environ.get("QUEEN_LOADTEST_RUN_ID", "") + uuid.uuid4().hex[:6]
_seq = itertools.count()

TIMELINE_COUNTERS = (prom.FIRED, prom.TIMER_OPS, prom.PUSHED, prom.EXPIRED)


def next_name(prefix: str) -> str:
    return f"{prefix}-{RUN_ID}-{next(_seq)}"


def b64json(obj: Any) -> str:
    return base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


parse_ts = parse_iso


def record(env: Environment, request_type: str, name: str, ms: float, length: int = 0,
           exception: BaseException | None = None) -> None:
    env.events.request.fire(request_type=request_type, name=name, response_time=ms, response_length=length,
                            exception=exception, context={})


def options(env: Environment) -> Any:
    return env.parsed_options


class Budget:
    """The most items (timers scheduled, messages pushed) one process may send in a run. Every run is
    bounded in count as well as in time: once spent, users stop sending and wait for the end."""

    def __init__(self) -> None:
        self.left: int | None = None
        self.warned = False

    def take(self, env: Environment, n: int) -> bool:
        if self.left is None:
            self.left = int(env.parsed_options.max_items)
        if self.left < n:
            if not self.warned:
                self.warned = True
                log.warning("--max-items spent in this process: no more sends until the run ends")
            return False
        self.left -= n
        return True


BUDGET = Budget()


def idle_until_stopped() -> None:
    while True:
        gevent.sleep(3600)


@events.init_command_line_parser.add_listener
def _common_args(parser: Any) -> None:
    parser.add_argument("--max-items", type=int, default=2_000_000,
                        help="most timers/messages one process sends in a run (a count bound next to -t)")
    parser.add_argument("--prom-out", default="", help="write the broker metrics timeline (JSON) here at the end")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between /metrics scrapes")


class _Scraper:
    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.greenlet: gevent.Greenlet | None = None
        self.env: Environment | None = None
        self.errors = 0

    def _once(self) -> None:
        assert self.env is not None and self.env.host
        try:
            s = prom.scrape(self.env.host, timeout=5.0)
        except OSError as exc:
            self.errors += 1
            if self.errors <= 3:
                log.warning("scrape of %s/metrics/prometheus failed: %s", self.env.host, exc)
            return
        self.points.append({
            "at": s.at,
            "fire_lag": _hist_json(s.hist(prom.FIRE_LAG)),
            "sweep_cycle": _hist_json(s.hist(prom.SWEEP_CYCLE)),
            "counters": {k: v for k, v in s.counters.items() if k.split("{")[0] in TIMELINE_COUNTERS},
        })

    def _loop(self, interval: float) -> None:
        while True:
            started = time.monotonic()
            self._once()
            gevent.sleep(max(0.05, interval - (time.monotonic() - started)))

    def start(self, env: Environment) -> None:
        self.env = env
        self.points = []
        self.greenlet = gevent.spawn(self._loop, max(0.1, float(env.parsed_options.scrape_interval)))

    def stop(self) -> None:
        if self.greenlet is None:
            return
        self.greenlet.kill(block=True)
        self.greenlet = None
        self._once()  # the closing point, after the last fire of the run
        opts = self.env.parsed_options if self.env else None
        if len(self.points) >= 2:
            first = _hist(self.points[0]["fire_lag"])
            last = _hist(self.points[-1]["fire_lag"])
            summary = (last - first).summary_ms()
            log.info("broker fire lag over the run (histogram deltas): %s", summary)
        if opts is not None and opts.prom_out:
            with open(opts.prom_out, "w") as f:
                json.dump({"host": self.env.host if self.env else None, "points": self.points}, f)


def _hist_json(h: prom.Histogram) -> dict[str, Any]:
    return {"buckets": [[("+Inf" if b == float("inf") else b), c] for b, c in sorted(h.buckets.items())],
            "sum": h.sum, "count": h.count}


def _hist(d: dict[str, Any]) -> prom.Histogram:
    return prom.Histogram({float(b): c for b, c in d["buckets"]}, d["sum"], d["count"])


SCRAPER = _Scraper()


@events.test_start.add_listener
def _on_start(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner) or not environment.host:
        return
    SCRAPER.start(environment)


@events.test_stop.add_listener
def _on_stop(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    SCRAPER.stop()
