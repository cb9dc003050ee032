"""Timer op validation: ``broker.timers.parse.parse_ops`` on a full 256-op schedule batch.

Baseline: the floor any handler pays for the same batch, reading each op's fields and base64-decoding
its payload with no checks at all. The ratio is the price of the checks (server-owned fields, unknown
fields, names, delay, duplicate keys) per batch.
"""

from __future__ import annotations

import base64
import uuid

from broker.timers.parse import parse_ops

PAYLOAD = base64.b64encode(b'{"kind":"day7","tenant":"acme","plan":"pro"}').decode()
OPS = [{"op": "schedule", "queue": "reminders", "timerKey": f"trial:acme:day{i}", "delayMs": 60_000 + i,
        "txn": uuid.uuid4().hex, "payload": PAYLOAD, "partition": "acme"} for i in range(256)]


def floor(ops: list[dict]) -> list[tuple]:
    return [(o["op"], o["queue"], o["timerKey"], o["txn"], o.get("partition"), base64.b64decode(o["payload"]),
             o["delayMs"]) for o in ops]


def test_validation_floor_baseline(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "validate 256 schedule ops"
    benchmark.extra_info["role"] = "baseline"
    assert len(benchmark(floor, OPS)) == 256


def test_validation_parse_ops(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "validate 256 schedule ops"
    benchmark.extra_info["role"] = "ours"
    ops = benchmark(parse_ops, OPS, max_ops=256)
    assert len(ops) == 256 and ops[0].delay_ms == 60_000 and ops[255].key == "trial:acme:day255"
