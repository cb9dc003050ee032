"""Scenario ``push_pop``: push, and pop + batch ack, throughput and latency.

Producers (``PushUser``) push batches of ``--push-batch`` messages (JSON payload of ``--payload-bytes``)
spread over ``--partitions`` partitions of one queue per process; consumers (``PopAckUser``) long-poll
that queue with ``batch=--pop-batch`` and acknowledge what they got in one ``POST /api/v1/ack/batch``.
Content size is the number of messages (pushed, popped, acked), so messages/s = requests/s x average
content size; a ``POP_TO_ACK`` custom request type times a pop plus its ack together.

    locust -f loadtest/push_pop.py --headless -u 6 -r 6 -t 30s --host http://127.0.0.1:6632
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from locust import FastHttpUser, constant, events, task

from loadtest.common import BUDGET, RUN_ID, idle_until_stopped, record


@events.init_command_line_parser.add_listener
def _args(parser: Any) -> None:
    parser.add_argument("--push-batch", type=int, default=10, help="messages per push request")
    parser.add_argument("--pop-batch", type=int, default=100, help="messages per pop")
    parser.add_argument("--partitions", type=int, default=16, help="partitions of the queue")
    parser.add_argument("--payload-bytes", type=int, default=100, help="approximate payload size")
    parser.add_argument("--queue-prefix", default="lt-pushpop", help="the queue is <prefix>-<run>")


def queue_name(opts: Any) -> str:
    return f"{opts.queue_prefix}-{RUN_ID}"


class PushUser(FastHttpUser):
    weight = 1
    wait_time = constant(0)
    network_timeout = 30.0

    @task
    def push(self) -> None:
        opts = self.environment.parsed_options
        q = queue_name(opts)
        if not BUDGET.take(self.environment, max(1, int(opts.push_batch))):
            idle_until_stopped()
        filler = "x" * max(0, int(opts.payload_bytes) - 40)
        items = [{"queue": q, "partition": f"p{random.randrange(max(1, opts.partitions))}",
                  "transactionId": uuid.uuid4().hex, "payload": {"t": time.time(), "f": filler}}
                 for _ in range(max(1, int(opts.push_batch)))]
        with self.client.post("/api/v1/push", json={"items": items}, name=f"POST /api/v1/push [{len(items)}]",
                              catch_response=True) as resp:
            if resp.status_code not in (200, 201):
                resp.request_meta["response_length"] = 0
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            queued = sum(1 for r in resp.json() if r.get("status") in ("queued", "duplicate"))
            resp.request_meta["response_length"] = queued
            if queued != len(items):
                resp.failure(f"{len(items) - queued} of {len(items)} not queued")


class PopAckUser(FastHttpUser):
    weight = 1
    wait_time = constant(0)
    network_timeout = 30.0

    @task
    def pop_ack(self) -> None:
        opts = self.environment.parsed_options
        q = queue_name(opts)
        started = time.perf_counter()
        with self.client.get(f"/api/v1/pop/queue/{q}?wait=true&timeout=1000&batch={int(opts.pop_batch)}",
                             name="GET /api/v1/pop", catch_response=True) as resp:
            if resp.status_code == 204:
                resp.request_meta["response_length"] = 0
                return
            if resp.status_code != 200:
                resp.request_meta["response_length"] = 0
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            msgs = [m for m in (resp.json() or {}).get("messages") or [] if m]
            resp.request_meta["response_length"] = len(msgs)
        if not msgs:
            return
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed",
                 "error": None, "leaseId": m.get("leaseId")} for m in msgs]
        with self.client.post("/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": None},
                              name="POST /api/v1/ack/batch", catch_response=True) as resp:
            if resp.status_code != 200:
                resp.request_meta["response_length"] = 0
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            done = sum(1 for r in resp.json() if r.get("success"))
            resp.request_meta["response_length"] = done
            if done != len(acks):
                resp.failure(f"{len(acks) - done} of {len(acks)} acks refused")
        record(self.environment, "POP_TO_ACK", f"pop+ack [{opts.pop_batch}]", (time.perf_counter() - started) * 1000.0,
               length=len(msgs))
