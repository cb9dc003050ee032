"""Scenario ``outage_deadlines``: the queued-call deadline experiment (docs/queued-call-deadlines.md).

A caller places one order every ``--interval`` s for ``--duration`` s. Placing an order is a call:
push a message carrying the order id and a reply id to a ``billing`` queue, then wait up to
``--timeout`` s for the reply on a reply queue; on a timeout it retries once with a new call. A billing
service long-polls the billing queue, "charges" (records the order id and the instant), pushes the
reply and acknowledges. Billing is stopped for ``--outage`` s starting at ``--outage-start``. The run
is made twice on fresh queues: WITHOUT deadlines, and WITH ``deadlineMs = timeout`` on every call, so
the broker fixes the deadline by its own clock and a pop never hands out an expired call (it goes to
the DLQ as ``deadline_exceeded``). Every number in the printed table is measured in the run.

The guarantee, and who keeps which half of it (docs/queued-call-deadlines.md §4.1). Let D be a call's
deadline, fixed at push by PostgreSQL's clock (``now() + deadlineMs``) and handed to billing with the
message as ``deadlineAt``:

- billing charges only if, immediately before the charge (no await in between), the database clock's
  latest possible reading plus ``--margin`` is still before D; otherwise it files the call in the DLQ
  (ack ``dlq``, error ``deadline_exceeded``) unrun. The margin covers what follows the charge: pushing
  the reply that tells the caller (the caller can only count what it was told);
- the caller starts its timer when the broker has acknowledged the push (so it gives up at or after D,
  never before), and at its timeout does not count the call failed until a read of the reply queue that
  began after the timeout has come back: every reply committed before D has then been seen.

So a charge is made before D - margin, its reply is committed before D, and the caller, which decides
only after D, sees it. With deadlines on, the run asserts 0 orders charged twice and 0 charged although
the caller saw "failed" (``guarantee`` in the result, exit code 1 from ``main`` when it does not hold).

Why a plain asyncio program and not a locustfile: this is a scripted experiment, not a load shape. It
needs one caller at an exact cadence, a service that is stopped and restarted at set instants, and
per-order bookkeeping joined across caller, service and DLQ afterwards; Locust's model (many users,
request rates and percentiles) adds nothing here and would make the stop/start choreography harder.

    python -m loadtest.outage_deadlines --url http://127.0.0.1:6632
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from loadtest import prom
from loadtest.timefmt import parse_iso

# The published numbers (docs/queued-call-deadlines.md §2: imqueue over Redis, 175 orders, 20 s outage),
# for the side-by-side table.
SEED = {
    "without": {"succeeded": 95, "failed": 80, "retried": 90, "charges": 265, "charged_twice": 90,
                "charged_after_failed": 80, "expired_skipped": 0, "max_charges_per_second": 195},
    "with": {"succeeded": 95, "failed": 80, "retried": None, "charges": 95, "charged_twice": 0,
             "charged_after_failed": 0, "expired_skipped": 170, "max_charges_per_second": 25},
}
ROWS = (
    ("succeeded", "orders the caller saw succeed"),
    ("failed", "orders the caller saw fail"),
    ("retried", "orders the caller retried"),
    ("charges", "charges billing made"),
    ("charged_twice", "orders charged twice"),
    ("charged_after_failed", 'charged although the caller saw "failed"'),
    ("expired_skipped", "expired calls skipped, unrun (DLQ deadline_exceeded)"),
    ("skipped_by_consumer", "  of which by billing's last check (the rest at pop)"),
    ("max_charges_per_second", "most charges in any one second"),
)


@dataclass
class Params:
    url: str
    interval: float = 0.2
    duration: float = 35.0
    timeout: float = 2.0
    retries: int = 1
    outage_start: float = 7.5
    outage: float = 20.0
    drain: float = 15.0  # longest wait, after the last order, for billing to work through its backlog
    # (it ends earlier, once billing has taken no call for 1.5 s)
    margin: float = 0.25  # billing charges only while the deadline is at least this far away (seconds)


@dataclass
class Outcome:
    deadlines: bool
    orders: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    charges: int = 0
    charged_twice: int = 0
    charged_after_failed: int = 0
    expired_skipped: int = 0
    skipped_by_consumer: int = 0
    succeeded_while_settling: int = 0
    expired_metric_delta: float | None = None
    max_charges_per_second: int = 0
    max_charges_per_second_outside_outage: int = 0
    first_reply_after_restart_ms: float | None = None
    skipped_past_deadline_s: dict[str, float] = field(default_factory=dict)
    billing_queue: str = ""
    seconds: float = 0.0
    margin_s: float = 0.0
    clock_uncertainty_ms: float | None = None
    reply_push_max_ms: float = 0.0
    replies_maybe_after_deadline: int = 0
    guarantee: list[str] = field(default_factory=list)  # violations (with deadlines on); empty = it held


class DbClock:
    """Where PostgreSQL's clock can be, read off this process's monotonic clock. Measured once: the
    ``time`` of ``GET /api/v1/resources/overview`` is the database's ``now()`` of that request, taken
    somewhere between sending it (``a``) and reading the answer (``b``); rendered in whole milliseconds
    (truncated). So at local instant ``t`` the database reads at most ``t + min(time + 1 ms - a)`` and at
    least ``t + max(time - b)`` over the samples. A check that must not act late uses ``latest()``."""

    def __init__(self) -> None:
        self.hi = 0.0
        self.lo = 0.0

    async def measure(self, c: httpx.AsyncClient, samples: int = 5) -> None:
        his, los = [], []
        for _ in range(samples):
            a = time.monotonic()
            r = await c.get("/api/v1/resources/overview")
            b = time.monotonic()
            r.raise_for_status()
            at = parse_iso(r.json()["time"])
            his.append(at + 0.001 - a)
            los.append(at - b)
        self.hi, self.lo = min(his), max(los)

    def latest(self) -> float:
        return time.monotonic() + self.hi

    def earliest(self) -> float:
        return time.monotonic() + self.lo

    @property
    def uncertainty_ms(self) -> float:
        return round((self.hi - self.lo) * 1000, 1)


class Experiment:
    def __init__(self, p: Params, deadlines: bool) -> None:
        self.p = p
        self.deadlines = deadlines
        tag = uuid.uuid4().hex[:8]
        self.billing = f"lt-billing-{'dl' if deadlines else 'nodl'}-{tag}"
        self.replies = f"lt-replies-{tag}"
        self.waiters: dict[str, asyncio.Future[None]] = {}
        self.charges: list[tuple[str, float]] = []  # (order id, seconds since start)
        self.results: dict[str, str] = {}
        self.attempts: dict[str, int] = {}
        self.billing_up = asyncio.Event()
        self.stopping = False
        self.t0 = 0.0
        self.restart_at: float | None = None
        self.first_reply_after_restart: float | None = None
        self.clock = DbClock()
        self.read_through = -1.0  # every reply committed before this instant (self.now()) has been read
        self.reads = asyncio.Condition()
        self.settled_late: set[str] = set()
        self.skipped_by_consumer = 0
        self.reply_push_max = 0.0
        self.replies_late = 0
        self.last_taken = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def _configure(self, c: httpx.AsyncClient) -> None:
        for q in (self.billing, self.replies):
            r = await c.post("/api/v1/configure", json={"queue": q, "options": {"leaseTime": 30, "retryLimit": 3}})
            r.raise_for_status()

    # ---- caller
    async def call(self, c: httpx.AsyncClient, order: str) -> bool:
        call_id = uuid.uuid4().hex
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[call_id] = fut
        item: dict[str, Any] = {"queue": self.billing, "partition": "Default", "transactionId": call_id,
                                "payload": {"orderId": order, "callId": call_id, "replyTo": self.replies}}
        if self.deadlines:
            item["deadlineMs"] = int(self.p.timeout * 1000)
        try:
            # Not cut short: a push abandoned mid-flight may still commit, with a deadline later than our
            # give-up. Once it is acknowledged, its deadline D (the push's now() + timeout) is at most
            # now + timeout: the timer starts here, so we give up at or after D.
            r = await c.post("/api/v1/push", json={"items": [item]})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"push answered {r.status_code}: {r.text[:200]}")
            done, _ = await asyncio.wait({fut}, timeout=self.p.timeout)
            if done:
                return True
            # Timed out. A reply committed before now (so before D) may still be on its way to us: it
            # is seen by the first complete read of the reply queue that starts after this instant.
            await self._settle(self.now())
            if fut.done():
                self.settled_late.add(order)
                return True
            return False
        finally:
            self.waiters.pop(call_id, None)

    async def _settle(self, gave_up: float) -> None:
        async with self.reads:
            await self.reads.wait_for(lambda: self.read_through >= gave_up)

    async def place(self, c: httpx.AsyncClient, order: str) -> None:
        for attempt in range(1 + self.p.retries):
            self.attempts[order] = attempt + 1
            if await self.call(c, order):
                self.results[order] = "succeeded"
                return
        self.results[order] = "failed"

    async def reply_listener(self, c: httpx.AsyncClient) -> None:
        path = f"/api/v1/pop/queue/{self.replies}"
        batch = 500
        while True:
            started = self.now()
            r = await c.get(path, params={"wait": "true", "timeout": "150", "batch": str(batch), "autoAck": "true"})
            if r.status_code not in (200, 204):
                continue
            msgs = (r.json().get("messages") or []) if r.status_code == 200 else []
            for m in msgs:
                data = (m or {}).get("data") or {}
                fut = self.waiters.get(str(data.get("callId")))
                if fut is not None and not fut.done():
                    fut.set_result(None)
            if len(msgs) < batch:  # this read took everything committed before it started
                async with self.reads:
                    self.read_through = started
                    self.reads.notify_all()

    # ---- billing service
    async def billing_service(self, c: httpx.AsyncClient) -> None:
        path = f"/api/v1/pop/queue/{self.billing}"
        while not self.stopping:
            r = await c.get(path, params={"wait": "true", "timeout": "300", "batch": "100"})
            if r.status_code != 200:
                continue
            msgs = [m for m in r.json().get("messages") or [] if m]
            if not msgs:
                continue
            self.last_taken = self.now()
            replies, acks, soonest = [], [], None
            for m in msgs:
                data = m.get("data") or {}
                deadline = parse_iso(m["deadlineAt"]) if m.get("deadlineAt") else None
                # The last check, immediately before the side effect: nothing may await in between.
                if deadline is not None and self.clock.latest() + self.p.margin >= deadline:
                    self.skipped_by_consumer += 1
                    acks.append(_ack(m, "dlq", "deadline_exceeded"))
                    continue
                self.charges.append((data["orderId"], self.now()))
                if deadline is not None:
                    soonest = deadline if soonest is None else min(soonest, deadline)
                replies.append({"queue": data["replyTo"], "partition": "Default", "transactionId": uuid.uuid4().hex,
                                "payload": {"callId": data["callId"], "receipt": f"rcpt-{data['orderId']}"}})
                acks.append(_ack(m, "completed", None))
            if replies:
                if self.restart_at is not None and self.first_reply_after_restart is None:
                    self.first_reply_after_restart = self.now()
                sent = time.monotonic()
                pr = await c.post("/api/v1/push", json={"items": replies})
                pr.raise_for_status()
                self.reply_push_max = max(self.reply_push_max, time.monotonic() - sent)
                if soonest is not None and self.clock.earliest() >= soonest:
                    self.replies_late += 1  # answered after a deadline: it may have committed after it (margin too small)
            ar = await c.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": None})
            ar.raise_for_status()

    async def _stop_billing(self, task: asyncio.Task[None]) -> None:
        self.stopping = True
        await task  # finishes the call in hand (at most one long poll of 300 ms), like a graceful shutdown
        self.stopping = False

    def _billing_idle_for(self) -> float:
        """Seconds since billing last took a call, charged or skipped (since the restart when it took none)."""
        return self.now() - max(self.last_taken, self.restart_at or 0.0)

    async def run(self) -> Outcome:
        p = self.p
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        async with httpx.AsyncClient(base_url=p.url, timeout=30.0, limits=limits) as c:
            await self._configure(c)
            await self.clock.measure(c)
            before = await asyncio.to_thread(_expired_total, p.url)
            self.t0 = time.monotonic()
            listener = asyncio.create_task(self.reply_listener(c))
            billing = asyncio.create_task(self.billing_service(c))
            outage_task = asyncio.create_task(self._outage(c, billing))
            n = int(round(p.duration / p.interval))
            orders = []
            for i in range(n):
                await asyncio.sleep(max(0.0, i * p.interval - self.now()))
                orders.append(asyncio.create_task(self.place(c, f"o-{i + 1}")))
            await asyncio.gather(*orders)
            billing = await outage_task
            # Let billing work through whatever is still queued (bounded).
            # Billing's pops come back empty once the queue is drained: stop after 1.5 s without a call.
            end = self.now() + p.drain
            while self.now() < end and self._billing_idle_for() < 1.5:
                await asyncio.sleep(0.25)
            await self._stop_billing(billing)
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            dlq_rows = await self._dlq_rows(c)
            after = await asyncio.to_thread(_expired_total, p.url)
            elapsed = self.now()
        return self._outcome(n, dlq_rows, before, after, elapsed)

    async def _outage(self, c: httpx.AsyncClient, billing: asyncio.Task[None]) -> asyncio.Task[None]:
        await asyncio.sleep(max(0.0, self.p.outage_start - self.now()))
        await self._stop_billing(billing)
        await asyncio.sleep(max(0.0, self.p.outage_start + self.p.outage - self.now()))
        self.restart_at = self.now()
        return asyncio.create_task(self.billing_service(c))

    async def _dlq_rows(self, c: httpx.AsyncClient) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        offset = 0
        while True:
            r = await c.get("/api/v1/dlq", params={"queue": self.billing, "limit": "1000", "offset": str(offset)})
            if r.status_code != 200:
                break
            page = r.json().get("messages") or []
            rows.extend(page)
            if len(page) < 1000:
                break
            offset += len(page)
        return rows

    def _outcome(self, n: int, dlq_rows: list[dict[str, Any]], before: float | None, after: float | None,
                 elapsed: float) -> Outcome:
        o = Outcome(self.deadlines, orders=n, billing_queue=self.billing, seconds=round(elapsed, 1),
                    margin_s=self.p.margin, clock_uncertainty_ms=self.clock.uncertainty_ms,
                    reply_push_max_ms=round(self.reply_push_max * 1000, 1), replies_maybe_after_deadline=self.replies_late,
                    skipped_by_consumer=self.skipped_by_consumer)
        o.succeeded = sum(1 for v in self.results.values() if v == "succeeded")
        o.succeeded_while_settling = len(self.settled_late)
        o.failed = sum(1 for v in self.results.values() if v == "failed")
        o.retried = sum(1 for v in self.attempts.values() if v > 1)
        per_order = Counter(order for order, _ in self.charges)
        o.charges = len(self.charges)
        o.charged_twice = sum(1 for v in per_order.values() if v >= 2)
        o.charged_after_failed = sum(1 for order, v in self.results.items() if v == "failed" and per_order[order])
        expired = [r for r in dlq_rows if r.get("errorMessage") == "deadline_exceeded"]
        o.expired_skipped = len(expired)
        o.expired_metric_delta = None if before is None or after is None else after - before
        by_second: dict[int, int] = defaultdict(int)
        for _, at in self.charges:
            by_second[int(at)] += 1
        o.max_charges_per_second = max(by_second.values(), default=0)
        lo, hi = self.p.outage_start, self.p.outage_start + self.p.outage + 1
        o.max_charges_per_second_outside_outage = max(
            (v for s, v in by_second.items() if not (lo <= s <= hi)), default=0)
        if self.restart_at is not None and self.first_reply_after_restart is not None:
            o.first_reply_after_restart_ms = round((self.first_reply_after_restart - self.restart_at) * 1000, 1)
        lateness = _lateness(expired, self.p.timeout)
        if lateness:
            o.skipped_past_deadline_s = {"min": round(min(lateness), 2), "median": round(statistics.median(lateness), 2),
                                         "max": round(max(lateness), 2)}
        if self.deadlines:
            o.guarantee = violations(asdict(o))
        return o


def violations(o: dict[str, Any]) -> list[str]:
    """What the deadline guarantee forbids, found in a run with deadlines on (empty: it held)."""
    out = []
    if o["charged_twice"]:
        out.append(f"{o['charged_twice']} orders charged twice")
    if o["charged_after_failed"]:
        out.append(f"{o['charged_after_failed']} orders charged although the caller saw \"failed\"")
    return out


def _ack(m: dict[str, Any], status: str, error: str | None) -> dict[str, Any]:
    return {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": status, "error": error,
            "leaseId": m.get("leaseId")}


def _lateness(rows: list[dict[str, Any]], deadline_s: float) -> list[float]:
    """Seconds past its deadline each expired call was when the broker skipped it: the DLQ row's
    ``movedToDlqAt`` minus (``messageCreatedAt`` + the call's deadlineMs), both by the database clock."""
    out = []
    for r in rows:
        created, moved = r.get("messageCreatedAt"), r.get("movedToDlqAt")
        if created and moved:
            try:
                out.append(max(0.0, parse_iso(moved) - parse_iso(created) - deadline_s))
            except ValueError:
                continue
    return out


def _expired_total(url: str) -> float | None:
    try:
        return prom.scrape(url).counter(prom.EXPIRED)
    except OSError:
        return None


def run_both(p: Params) -> dict[str, Any]:
    without = asyncio.run(Experiment(p, deadlines=False).run())
    with_ = asyncio.run(Experiment(p, deadlines=True).run())
    return {"params": asdict(p), "without": asdict(without), "with": asdict(with_), "seed": SEED}


def table(result: dict[str, Any]) -> str:
    w, d, s = result["without"], result["with"], result["seed"]

    def cell(v: Any) -> str:
        return "-" if v is None else str(v)

    head = ("", "seed without", "ours without", "seed with", "ours with")
    rows = [head] + [(label, cell(s["without"].get(k)), cell(w[k]), cell(s["with"].get(k)), cell(d[k])) for k, label in ROWS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "  ".join("-" * x for x in widths))
    p = result["params"]
    lines.append("")
    lines.append(f"orders: {w['orders']} (one every {p['interval']} s for {p['duration']} s), timeout {p['timeout']} s, "
                 f"{p['retries']} retry, billing down {p['outage']} s from t={p['outage_start']} s")
    lines.append(f"busiest second outside the outage: without {w['max_charges_per_second_outside_outage']}, "
                 f"with {d['max_charges_per_second_outside_outage']}; first reply after restart: "
                 f"without {cell(w['first_reply_after_restart_ms'])} ms, with {cell(d['first_reply_after_restart_ms'])} ms")
    if d.get("skipped_past_deadline_s"):
        sp = d["skipped_past_deadline_s"]
        lines.append(f"skipped calls were {sp['min']}..{sp['max']} s past their deadline (median {sp['median']} s)")
    lines.append(f"queen_messages_expired_total delta: with {cell(d['expired_metric_delta'])}")
    lines.append(f"billing's margin {d['margin_s']} s; database clock known to {cell(d['clock_uncertainty_ms'])} ms; "
                 f"slowest reply push {w['reply_push_max_ms']} / {d['reply_push_max_ms']} ms (without / with), "
                 f"{d['replies_maybe_after_deadline']} answered after a deadline; callers told of a success while "
                 f"settling: {w['succeeded_while_settling']} / {d['succeeded_while_settling']}")
    lines.append(verdict_line(d))
    return "\n".join(lines)


def verdict_line(d: dict[str, Any]) -> str:
    if d["guarantee"]:
        return "deadline guarantee VIOLATED with deadlines on: " + "; ".join(d["guarantee"])
    return "deadline guarantee held with deadlines on: 0 orders charged twice, 0 charged after the caller saw \"failed\""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.outage_deadlines", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--duration", type=float, default=35.0)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--outage-start", type=float, default=7.5)
    ap.add_argument("--outage", type=float, default=20.0)
    ap.add_argument("--drain", type=float, default=15.0)
    ap.add_argument("--margin", type=float, default=0.25,
                    help="billing charges only while its call's deadline is at least this many seconds away")
    ap.add_argument("--json", default="", help="write the result as JSON here")
    return ap


def params_from(ns: argparse.Namespace) -> Params:
    return Params(url=ns.url, interval=ns.interval, duration=ns.duration, timeout=ns.timeout, retries=ns.retries,
                  outage_start=ns.outage_start, outage=ns.outage, drain=ns.drain, margin=ns.margin)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    result = run_both(params_from(ns))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=2)
    print(table(result))
    return 1 if result["with"]["guarantee"] else 0


if __name__ == "__main__":
    sys.exit(main())
