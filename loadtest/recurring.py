"""Scenario ``recurring``: recurring timers (docs/concepts/recurring-schedules.md) under load.

``--schedules`` N cron schedules spread over ``--tenants`` T tenants (one queue each), every second
(``--mode second``: ``* * * * * *``) or every minute (``--mode minute``: ``* * * * *``, for large N over a
run of several minutes), missed policy ``all``. One long-polling consumer per tenant (autoAck) receives
every frame and records, per occurrence (the frame's txn names it: ``<schedule>@<instant>``):

- fire lag: the frame's ``createdAt`` (the sweeper's commit, database clock) minus the occurrence instant;
- delivery lag: receipt by the consumer minus the occurrence instant (this machine's clock);
- double occurrences: a txn received twice (must be 0);
- missed occurrences: per schedule, every occurrence from its first (the ``deliverAt`` the schedule
  answered) to the last one due well before the run's cancel (2 s, or one period in minute mode) must
  have come: each absent one is missed (must be 0).

The cost of computing next occurrences is read two ways: the brokers' own counter
(``queen_timers_recur_next_seconds_total``, worker CPU spent in ``broker.timers.recur.advance`` between
take and fire, summed over the workers of the scraped broker) divided by the occurrences fired, and a
micro-measure here of ``advance`` on the same expressions.

Tenants need credentials: ``--jwt-secret`` mints one token per tenant (the broker's QUEEN_JWT_SECRET;
``queen loadtest recurring`` without ``--url`` starts its broker with one), otherwise every schedule
goes to the one tenant of a broker without authentication and ``tenants`` reads 1.

    python -m loadtest.recurring --url http://127.0.0.1:6632 --schedules 200 --tenants 4 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from loadtest import prom
from loadtest.timefmt import parse_iso

NEXT_COUNTER = "queen_timers_recur_next_seconds_total"
MODES = {"second": ("* * * * * *", 1.0), "minute": ("* * * * *", 60.0)}


@dataclass
class Params:
    url: str
    schedules: int = 100
    tenants: int = 4
    mode: str = "second"
    duration: float = 20.0
    jwt_secret: str | None = None


@dataclass
class Result:
    params: dict[str, Any]
    tenants: int = 0
    scheduled: int = 0
    received: int = 0
    expected: int = 0
    missed: int = 0
    doubles: int = 0
    fire_lag_ms: dict[str, float | None] = field(default_factory=dict)
    delivery_lag_ms: dict[str, float | None] = field(default_factory=dict)
    next_cost_us_broker: float | None = None
    next_cost_us_local: float | None = None
    schedule_call_ms: float | None = None
    errors: list[str] = field(default_factory=list)


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 2)

    return {"count": len(v), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(v[-1], 2)}


def _tokens(p: Params) -> list[str | None]:
    if not p.jwt_secret:
        return [None]
    from broker.auth import mint

    return [mint(tenant=f"rec-t{i}", sub="loadtest", grants=["produce", "consume"], secret=p.jwt_secret)
            for i in range(max(1, p.tenants))]


def local_next_cost_us(expr: str, period_s: float, n: int = 2_000) -> float:
    """Microseconds per ``advance`` of this expression, measured here (the broker runs the same code)."""
    from broker.timers import recur

    sched = recur.parse({"cron": expr, "timeZone": "Europe/Berlin", "missed": "all"}, has_delay=False)
    due = datetime(2026, 1, 1, tzinfo=UTC)
    started = time.perf_counter()
    for _ in range(n):
        step = recur.advance(sched, due, due + timedelta(milliseconds=5))
        due = step.next_at
    return (time.perf_counter() - started) / n * 1e6


class Run:
    def __init__(self, p: Params) -> None:
        self.p = p
        self.expr, self.period = MODES[p.mode]
        self.run_id = uuid.uuid4().hex[:8]
        self.first: dict[str, datetime] = {}  # schedule txn base -> first occurrence
        self.seen: dict[str, int] = {}  # occurrence txn -> times received
        self.fire_lag: list[float] = []
        self.delivery_lag: list[float] = []
        self.schedule_ms: list[float] = []
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def consume(self, http: httpx.AsyncClient, queue: str) -> None:
        params = {"wait": "true", "timeout": "1000", "batch": "1000", "autoAck": "true"}
        idle_after_stop = 0
        while idle_after_stop < 2:
            try:
                r = await http.get(f"/api/v1/pop/queue/{queue}", params=params)
            except httpx.HTTPError as exc:
                self.errors.append(f"pop: {exc}")
                await asyncio.sleep(0.2)
                continue
            now = time.time()
            if r.status_code == 204:
                idle_after_stop += 1 if self.stop.is_set() else 0
                continue
            if r.status_code != 200:
                self.errors.append(f"pop HTTP {r.status_code}: {r.text[:200]}")
                await asyncio.sleep(0.2)
                continue
            for m in r.json().get("messages") or []:
                txn = m.get("transactionId") or ""
                if "@" not in txn:
                    continue
                self.seen[txn] = self.seen.get(txn, 0) + 1
                at = parse_iso(txn.split("@", 1)[1])
                self.fire_lag.append(max(0.0, (parse_iso(m["createdAt"]) - at) * 1000.0))
                self.delivery_lag.append(max(0.0, (now - at) * 1000.0))

    async def schedule(self, http: httpx.AsyncClient, queue: str, bases: list[str]) -> None:
        for i in range(0, len(bases), 256):
            ops = [{"op": "schedule", "queue": queue, "timerKey": b, "txn": b, "payload": "e30=",
                    "recur": {"cron": self.expr, "timeZone": "Europe/Berlin", "missed": "all"}} for b in bases[i:i + 256]]
            t0 = time.perf_counter()
            r = await http.post("/api/v1/timers", json={"operations": ops})
            self.schedule_ms.append((time.perf_counter() - t0) * 1000.0)
            if r.status_code != 200:
                self.errors.append(f"schedule HTTP {r.status_code}: {r.text[:200]}")
                continue
            for res in r.json()["results"]:
                if res["ok"]:
                    self.first[res["timerKey"]] = datetime.fromisoformat(res["deliverAt"].replace("Z", "+00:00"))

    async def cancel(self, http: httpx.AsyncClient, queue: str, bases: list[str]) -> None:
        for i in range(0, len(bases), 256):
            ops = [{"op": "cancel", "queue": queue, "timerKey": b} for b in bases[i:i + 256]]
            r = await http.post("/api/v1/timers", json={"operations": ops})
            if r.status_code != 200:
                self.errors.append(f"cancel HTTP {r.status_code}: {r.text[:200]}")

    async def run(self) -> Result:
        p = self.p
        tokens = _tokens(p)
        clients = [httpx.AsyncClient(base_url=p.url, timeout=30,
                                     headers={"Authorization": f"Bearer {t}"} if t else {}) for t in tokens]
        queues = [f"rec-{self.run_id}-{i}" for i in range(len(clients))]
        plan: list[list[str]] = [[] for _ in clients]
        for n in range(p.schedules):
            plan[n % len(clients)].append(f"s{self.run_id}-{n}")
        before = self._scrape()
        try:
            consumers = [asyncio.create_task(self.consume(c, q)) for c, q in zip(clients, queues, strict=True)]
            await asyncio.gather(*(self.schedule(c, q, b) for c, q, b in zip(clients, queues, plan, strict=True)))
            await asyncio.sleep(p.duration)
            cancel_at = datetime.now(UTC)
            await asyncio.gather(*(self.cancel(c, q, b) for c, q, b in zip(clients, queues, plan, strict=True)))
            self.stop.set()
            await asyncio.wait_for(asyncio.gather(*consumers), timeout=30)
        finally:
            for c in clients:
                await c.aclose()
        after = self._scrape()
        return self._result(cancel_at, before, after, len(clients))

    def _scrape(self) -> float | None:
        try:
            return prom.scrape(self.p.url).counter(NEXT_COUNTER)
        except OSError:
            return None

    def _result(self, cancel_at: datetime, before: float | None, after: float | None, tenants: int) -> Result:
        margin = timedelta(seconds=max(2.0, self.period))
        step = timedelta(seconds=self.period)
        expected = missed = 0
        for base, first in self.first.items():
            at = first
            while at <= cancel_at - margin:
                expected += 1
                if f"{base}@{at.strftime('%Y-%m-%dT%H:%M:%S.%f')}Z" not in self.seen:
                    missed += 1
                at += step
        doubles = sum(n - 1 for n in self.seen.values() if n > 1)
        received = sum(self.seen.values())
        res = Result(params=asdict(self.p), tenants=tenants, scheduled=len(self.first), received=received,
                     expected=expected, missed=missed, doubles=doubles, fire_lag_ms=_pct(self.fire_lag),
                     delivery_lag_ms=_pct(self.delivery_lag), errors=self.errors[:20])
        res.params["jwt_secret"] = "set" if self.p.jwt_secret else None
        if before is not None and after is not None and received:
            res.next_cost_us_broker = round((after - before) / received * 1e6, 2)
        res.next_cost_us_local = round(local_next_cost_us(self.expr, self.period), 2)
        if self.schedule_ms:
            res.schedule_call_ms = round(statistics.median(self.schedule_ms), 2)
        return res


def run(p: Params) -> dict[str, Any]:
    return asdict(asyncio.run(Run(p).run()))


def verdict_line(r: dict[str, Any]) -> str:
    ok = r["missed"] == 0 and r["doubles"] == 0 and not r["errors"]
    return (f"{'held' if ok else 'BROKE'}: {r['received']} occurrences of {r['scheduled']} schedules over "
            f"{r['tenants']} tenants, {r['missed']} missed, {r['doubles']} doubled")


def table(r: dict[str, Any]) -> str:
    fl, dl = r["fire_lag_ms"], r["delivery_lag_ms"]
    lines = [
        verdict_line(r),
        f"expected occurrences (first .. cancel - margin): {r['expected']}, received {r['received']}",
        f"fire lag ms      p50 {fl['p50']}  p90 {fl['p90']}  p99 {fl['p99']}  max {fl['max']}",
        f"delivery lag ms  p50 {dl['p50']}  p90 {dl['p90']}  p99 {dl['p99']}  max {dl['max']}",
        f"next occurrence: {r['next_cost_us_broker']} us per occurrence in the broker (its workers together), "
        f"{r['next_cost_us_local']} us measured here",
        f"schedule call (256 ops) median {r['schedule_call_ms']} ms",
    ]
    if r["errors"]:
        lines.append("errors: " + "; ".join(r["errors"][:5]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.recurring", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--schedules", type=int, default=100)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--mode", choices=tuple(MODES), default="second")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--jwt-secret", default=None)
    a = ap.parse_args(argv)
    r = run(Params(url=a.url, schedules=a.schedules, tenants=a.tenants, mode=a.mode, duration=a.duration,
                   jwt_secret=a.jwt_secret))
    print(json.dumps(r, indent=2, default=str))
    print(table(r))
    return 0 if r["missed"] == 0 and r["doubles"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
