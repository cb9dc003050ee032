"""Scenario ``timers_lag``: fire lag and delivery lag at a target schedule rate (open loop).

Every user owns one destination queue. It schedules timers into it at ``--timer-rate / users`` per
second, open loop: each tick it sends whatever the arrival schedule says is due (up to 256 ops per
request, several requests in flight), whether or not earlier requests have answered. Delays are spread
uniformly over ``[--min-delay-ms, --window-ms]``. A consumer greenlet of the same user long-polls the
queue and, for every frame, records two custom request types in Locust's stats:

- ``FIRE_LAG``: the frame's ``createdAt`` (database clock, taken in the sweeper's commit) minus the
  ``deliverAt`` the schedule returned: the broker-side lag, per message.
- ``DELIVERY_LAG``: receipt by the consumer minus ``deliverAt`` (both clocks are this machine's).

The broker's own ``queen_timers_fire_lag_seconds`` histogram is scraped by ``loadtest.common`` and
summarised by the runner. Scheduling stops ``--window-ms`` + 2 s before the run ends (or after
``--schedule-seconds``), so every timer scheduled during the run has fired when it stops.

    locust -f loadtest/timers_lag.py --headless -u 4 -r 4 -t 30s --host http://127.0.0.1:6632 --timer-rate 1000
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import gevent
from gevent.lock import Semaphore
from locust import FastHttpUser, constant, events, task

from loadtest.common import BUDGET, b64json, next_name, parse_ts, record

MAX_OPS = 256


@events.init_command_line_parser.add_listener
def _args(parser: Any) -> None:
    parser.add_argument("--timer-rate", type=float, default=200.0, help="timers scheduled per second, all users together")
    parser.add_argument("--window-ms", type=int, default=2000, help="delays are spread uniformly up to this many ms")
    parser.add_argument("--min-delay-ms", type=int, default=100, help="shortest delay")
    parser.add_argument("--schedule-seconds", type=float, default=0.0,
                        help="stop scheduling after this many seconds (0: run time minus window minus 2 s; "
                             "give it with --master: workers do not see -t)")
    parser.add_argument("--total-users", type=int, default=0,
                        help="users over all processes (0: -u). Give it with --master: workers do not see -u")
    parser.add_argument("--tick-ms", type=int, default=50, help="open-loop tick")
    parser.add_argument("--max-inflight", type=int, default=8, help="schedule requests in flight per user")
    parser.add_argument("--partitions", type=int, default=1, help="spread each queue's timers over this many partitions")
    parser.add_argument("--queue-prefix", default="lt-lag", help="destination queues are <prefix>-<run>-<n>")


def schedule_seconds(opts: Any) -> float:
    if opts.schedule_seconds and opts.schedule_seconds > 0:
        return float(opts.schedule_seconds)
    run_time = float(getattr(opts, "run_time", 0) or 0)
    if run_time <= 0:
        return float("inf")
    return max(1.0, run_time - opts.window_ms / 1000.0 - 2.0)


class TimerLagUser(FastHttpUser):
    wait_time = constant(0)
    concurrency = 16
    network_timeout = 30.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.queue = next_name(opts.queue_prefix)
        users = max(1, int(opts.total_users or getattr(opts, "num_users", 1) or 1))
        self.rate = float(opts.timer_rate) / users
        self.sched_for = schedule_seconds(opts)
        self.deliver_at: dict[str, float] = {}  # txn -> deliverAt (epoch s) for timers not yet received
        self.early: dict[str, tuple[float, float]] = {}  # txn -> (receipt, createdAt) seen before the answer
        self.inflight = Semaphore(max(1, int(opts.max_inflight)))
        self.seq = 0
        self.consumer = gevent.spawn(self._consume)

    def on_stop(self) -> None:
        self.consumer.kill(block=False)

    # ---- producer: open loop
    @task
    def schedule(self) -> None:
        opts = self.environment.parsed_options
        tick = max(0.005, opts.tick_ms / 1000.0)
        t0 = time.monotonic()
        issued = 0
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= self.sched_for:
                gevent.sleep(3600)  # keep the consumer running until the run stops us
                continue
            due = int(self.rate * elapsed) - issued
            while due > 0 and not self.inflight.locked():
                n = min(MAX_OPS, due)
                if not BUDGET.take(self.environment, n):
                    self.sched_for = elapsed  # count bound reached: scheduling is over for this user
                    break
                self.inflight.acquire()
                gevent.spawn(self._send, self._ops(n, opts))
                issued += n
                due -= n
            gevent.sleep(tick)

    def _ops(self, n: int, opts: Any) -> list[dict[str, Any]]:
        ops = []
        parts = max(1, int(opts.partitions))
        for _ in range(n):
            self.seq += 1
            op = {
                "op": "schedule", "queue": self.queue, "timerKey": f"k{self.seq}",
                "delayMs": random.randint(opts.min_delay_ms, max(opts.min_delay_ms, opts.window_ms)),
                "txn": uuid.uuid4().hex, "payload": b64json({"n": self.seq}),
            }
            if parts > 1:
                op["partition"] = f"p{self.seq % parts}"
            ops.append(op)
        return ops

    def _send(self, ops: list[dict[str, Any]]) -> None:
        try:
            with self.client.post("/api/v1/timers", json={"operations": ops}, name="POST /api/v1/timers",
                                  catch_response=True) as resp:
                if resp.status_code != 200:
                    resp.request_meta["response_length"] = 0
                    resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                    return
                ok = 0
                for r in resp.json().get("results", []):
                    if r.get("ok"):
                        ok += 1
                        self._scheduled(r["txn"], parse_ts(r["deliverAt"]))
                # Content size = timers accepted, so ops/s = requests/s x average content size.
                resp.request_meta["response_length"] = ok
                if ok != len(ops):
                    resp.failure(f"{len(ops) - ok} of {len(ops)} ops not scheduled")
        finally:
            self.inflight.release()

    def _scheduled(self, txn: str, deliver_at: float) -> None:
        seen = self.early.pop(txn, None)
        if seen is None:
            self.deliver_at[txn] = deliver_at
        else:
            self._lags(seen[0], seen[1], deliver_at)

    # ---- consumer: long poll, commit at delivery
    def _consume(self) -> None:
        path = f"/api/v1/pop/queue/{self.queue}?wait=true&timeout=1000&batch=1000&autoAck=true"
        while True:
            try:
                with self.client.get(path, name="GET /api/v1/pop (long poll)", catch_response=True) as resp:
                    msgs = []
                    if resp.status_code == 200:
                        msgs = [m for m in (resp.json() or {}).get("messages") or [] if m]
                    elif resp.status_code != 204:
                        resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                    resp.request_meta["response_length"] = len(msgs)  # frames received
            except Exception:  # noqa: BLE001 - a broken poll is recorded by Locust; keep polling
                msgs = None
            if msgs is None or (not msgs and resp.status_code not in (200, 204)):
                gevent.sleep(0.2)
                continue
            now = time.time()
            for m in msgs:
                txn = m.get("transactionId")
                created = parse_ts(m["createdAt"])
                at = self.deliver_at.pop(txn, None)
                if at is None:
                    self.early[txn] = (now, created)
                else:
                    self._lags(now, created, at)

    def _lags(self, receipt: float, created: float, deliver_at: float) -> None:
        # createdAt has millisecond precision: a frame committed within the same ms reads as 0.
        record(self.environment, "FIRE_LAG", "createdAt - deliverAt", max(0.0, (created - deliver_at) * 1000.0))
        record(self.environment, "DELIVERY_LAG", "receipt - deliverAt", max(0.0, (receipt - deliver_at) * 1000.0))
