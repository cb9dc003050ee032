"""Scenario ``timers_schedule``: schedule throughput in batches of 1, 16 and 256 ops, cancels mixed in.

Closed loop: every user sends as fast as the broker answers. Weighted choices post batches of 1, 16
and 256 schedule ops (request names ``POST /api/v1/timers [1|16|256]``; ``--batches 256`` runs one size
alone) or cancel one of the user's own pending timers through ``DELETE /api/v1/timers/:queue/*timerKey``
and check it answered ``cancelled``. The content size Locust records for a schedule request is the number of timers the
broker accepted, so ops/s = requests/s x average content size (the runner prints it).

Timers get a long delay (``--delay-ms``, default 10 min) so the sweeper stays out of the measurement;
they fire later into queues named ``<--queue-prefix>-<run>-<n>``.

    locust -f loadtest/timers_schedule.py --headless -u 8 -r 8 -t 30s --host http://127.0.0.1:6632
"""

from __future__ import annotations

import random
import uuid
from collections import deque
from typing import Any

from locust import FastHttpUser, constant, events, task

from loadtest.common import BUDGET, b64json, idle_until_stopped, next_name

BATCHES = (1, 16, 256)


@events.init_command_line_parser.add_listener
def _args(parser: Any) -> None:
    parser.add_argument("--delay-ms", type=int, default=600_000, help="delay of every scheduled timer")
    parser.add_argument("--queue-prefix", default="lt-sched", help="queues are <prefix>-<run>-<n>")
    parser.add_argument("--batches", default="1,16,256",
                        help="batch sizes to run (any of 1,16,256), e.g. 256 to measure one size alone")
    parser.add_argument("--cancel-weight", type=int, default=3, help="weight of a cancel among the tasks (0: none)")


# Relative weights of the tasks: many small batches, some medium, few full ones, cancels mixed in.
WEIGHTS = {1: 8, 16: 4, 256: 1}


class TimerScheduleUser(FastHttpUser):
    wait_time = constant(0)
    network_timeout = 30.0

    def on_start(self) -> None:
        self.queue = next_name(self.environment.parsed_options.queue_prefix)
        self.pending: deque[str] = deque(maxlen=10_000)
        self.seq = 0

    def _batch(self, n: int) -> None:
        if not BUDGET.take(self.environment, n):
            idle_until_stopped()
        delay = int(self.environment.parsed_options.delay_ms)
        keys = []
        ops = []
        for _ in range(n):
            self.seq += 1
            key = f"s/{self.seq}"
            keys.append(key)
            ops.append({"op": "schedule", "queue": self.queue, "timerKey": key, "delayMs": delay,
                        "txn": uuid.uuid4().hex, "payload": b64json({"k": key})})
        with self.client.post("/api/v1/timers", json={"operations": ops}, name=f"POST /api/v1/timers [{n}]",
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.request_meta["response_length"] = 0
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            results = resp.json().get("results", [])
            ok = [k for k, r in zip(keys, results, strict=False) if r.get("ok")]
            resp.request_meta["response_length"] = len(ok)
            self.pending.extend(ok)
            if len(ok) != n:
                resp.failure(f"{n - len(ok)} of {n} ops not scheduled")

    @task
    def one(self) -> None:
        """One weighted choice among the enabled batch sizes and the cancel."""
        opts = self.environment.parsed_options
        choices: list[int] = [n for n in (int(x) for x in str(opts.batches).split(",") if x.strip()) if n in WEIGHTS]
        weights = [WEIGHTS[n] for n in choices]
        if opts.cancel_weight > 0:
            choices.append(0)
            weights.append(int(opts.cancel_weight))
        if not choices:
            raise ValueError("--batches must name at least one of 1, 16, 256 (or give --cancel-weight)")
        pick = random.choices(choices, weights)[0]
        if pick == 0:
            self.cancel()
        else:
            self._batch(pick)

    def cancel(self) -> None:
        if not self.pending:
            return
        key = self.pending.popleft() if random.random() < 0.5 else self.pending.pop()
        with self.client.delete(f"/api/v1/timers/{self.queue}/{key}", name="DELETE /api/v1/timers/:queue/*timerKey",
                                catch_response=True) as resp:
            cancelled = resp.status_code == 200 and resp.json().get("status") == "cancelled"
            resp.request_meta["response_length"] = int(cancelled)  # content size = timers cancelled
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
            elif not cancelled:
                resp.failure(f"cancel answered {resp.json().get('status')!r}")
