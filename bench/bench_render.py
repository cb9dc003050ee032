"""Result rendering: the broker's JSON answer encoder (broker.http.wire, orjson) vs the stdlib json.

The body is what ``POST /api/v1/timers`` answers for a full 256-op batch (index-aligned results with
ids and instants), the largest common answer on the hot path. Baseline: ``json.dumps(...).encode()``.
"""

from __future__ import annotations

import json
import uuid

import orjson

from broker.http import wire

BODY = {"results": [
    {"ok": True, "status": "scheduled", "queue": "reminders", "timerKey": f"trial:acme:day{i}",
     "txn": uuid.uuid4().hex, "messageId": str(uuid.uuid4()), "deliverAt": "2026-11-30T12:00:00.123456Z"}
    for i in range(256)
]}


def test_render_json_baseline(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "render 256 timer results"
    benchmark.extra_info["role"] = "baseline"
    out = benchmark(lambda: json.dumps(BODY).encode())
    assert json.loads(out) == BODY


def test_render_broker_wire(benchmark):  # type: ignore[no-untyped-def]
    benchmark.group = "render 256 timer results"
    benchmark.extra_info["role"] = "ours"
    resp = benchmark(lambda: wire.json_response(BODY))
    assert orjson.loads(resp.body) == BODY
    assert resp.content_type == "application/json"
