"""The binary wire formats against JSON, over HTTP, with a bare-SQL baseline in the same run.

    .venv/bin/python bench/bench_wire.py [--seconds 3] [--repeats 3] [--conns 20] [--partitions 200]

A real ``queen serve`` (2 workers) on a fresh database (embedded PostgreSQL unless
QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL names a server). Phases, each repeated
``--repeats`` times in turn, medians printed:

  push batch 100   JSON body | QPB1 (flag 4, what ``binary_push=True`` sends) | QPB1 flag 8 (frames,
                   ``push_compression=True``) | the same queen_push call over asyncpg (baseline);
  pop batch 100    autoAck pops (no ack, so the answer is what differs): JSON | QPF1 (``frames=true``) |
                   queen_pop over asyncpg (baseline); each side drains its own prefilled queue.

The bodies are built with the official client's own encoders (queen.http.push_binary), before each
phase; framed answers are counted from their headers. So the numbers are the broker's side of each
format (the client's own encode/decode cost is not in them). Printed; nothing is asserted. Not part of the
test run. Its ``test_*`` functions are the CPU-only side (``queen bench -k wire``): decoding a push and
rendering a pop, per format, against the JSON path as the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg
import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_log import PAYLOAD, items, make_db, prefill, sql_pop_ack, sql_push, timed  # noqa: E402
from bench.db import run_on_a_server  # noqa: E402
from broker.process.localserver import LocalBroker  # noqa: E402


class Bodies:
    """Push bodies built before a phase starts, so the load generator's encoding (the client's
    json.dumps per payload, its zstd) does not compete with the broker for the two cores."""

    def __init__(self, queue: str, kind: str, partitions: int, n: int) -> None:
        self.queue, self.kind, self.partitions = queue, kind, partitions
        self.ready = [self.build() for _ in range(n)]

    def build(self) -> tuple[bytes, str]:
        from queen.http.push_binary import binary_push_body

        its = items(self.queue, 100, self.partitions)
        if self.kind == "json":
            return orjson.dumps({"items": its}), "application/json"
        body = binary_push_body(its, self.kind == "qpb1-frames")
        assert body is not None
        return body, "application/x-queen-push"

    def take(self) -> tuple[bytes, str]:
        return self.ready.pop() if self.ready else self.build()


async def push(session: aiohttp.ClientSession, url: str, bodies: Bodies) -> int:
    data, ctype = bodies.take()
    async with session.post(url + "/api/v1/push", data=data, headers={"content-type": ctype}) as r:
        assert r.status == 201, await r.text()
        await r.read()
    return 100


def framed_count(raw: bytes) -> int:
    """The messages of a framed pop answer, from its claim and record headers only (the bench checks the
    broker's side; the client's decoder, pure Python, is its own cost)."""
    at = 5
    if raw[4] == 1:
        at += 4 + struct.unpack_from("<I", raw, at)[0]
    for _ in range(3):
        at += 2 + struct.unpack_from("<H", raw, at)[0]
    total, claims = 0, struct.unpack_from("<I", raw, at)[0]
    at += 4
    for _ in range(claims):
        at += 8
        at += 2 + struct.unpack_from("<H", raw, at)[0]
        at += 20
        records = struct.unpack_from("<I", raw, at)[0]
        at += 4
        for _ in range(records):
            count, _codec, size = struct.unpack_from("<IBI", raw, at + 16)
            total += count
            at += 25 + size
    return total


async def pop(session: aiohttp.ClientSession, url: str, queue: str, framed: bool) -> int:
    params = {"batch": "100", "wait": "false", "autoAck": "true"}
    if framed:
        params["frames"] = "true"
    async with session.get(f"{url}/api/v1/pop/queue/{queue}", params=params) as r:
        if r.status == 204:
            return 0
        raw = await r.read()
    if framed:
        assert raw[:4] == b"QPF1", raw[:40]
        return framed_count(raw)
    return len(orjson.loads(raw)["messages"])


async def run(args: argparse.Namespace, server_dsn: str) -> None:
    dsn = await make_db(server_dsn)
    b = LocalBroker(dsn=dsn, workers=2, env={"QUEEN_LOG_LEVEL": "WARNING"},
                    log_path=Path(tempfile.gettempdir()) / "bench_wire_broker.log")
    b.start()
    pool = await asyncpg.create_pool(dsn, min_size=args.conns, max_size=args.conns)
    print(f"broker 2 workers; {args.conns} connections; {args.partitions} partitions; {args.seconds:.0f} s x "
          f"{args.repeats} per phase; load average {os.getloadavg()[0]:.2f}; payload {orjson.dumps(PAYLOAD)!r}",
          flush=True)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.conns)) as s:
            for kind in ("json", "qpb1", "qpb1-frames"):  # warm-up: plans, partitions
                warm = Bodies("wire", kind, args.partitions, 10)
                for _ in range(10):
                    await push(s, b.url, warm)
            for _ in range(10):
                await sql_push(pool, "wire_raw", 100, args.partitions)
            rates: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                for kind in ("json", "qpb1", "qpb1-frames"):
                    bodies = Bodies("wire", kind, args.partitions, args.prebuilt)
                    _, rate = await timed(args.seconds, args.conns, lambda bodies=bodies: push(s, b.url, bodies))
                    rates.setdefault(f"push batch 100 {kind}", []).append(rate)
                _, rate = await timed(args.seconds, args.conns, lambda: sql_push(pool, "wire_raw", 100, args.partitions))
                rates.setdefault("push batch 100 raw SQL", []).append(rate)
            for i in range(args.repeats):
                for name in ("json", "qpf1", "raw SQL"):
                    q = f"wire_pop_{name.replace(' ', '_')}_{i}"
                    await prefill(pool, q, args.partitions, args.backlog)
                    if name == "raw SQL":
                        one = lambda q=q: sql_pop_ack(pool, q, 100, True)  # noqa: E731
                    else:
                        one = lambda q=q, framed=name == "qpf1": pop(s, b.url, q, framed)  # noqa: E731
                    _, rate = await timed(args.seconds, args.conns, one, drain=True)
                    rates.setdefault(f"pop batch 100 {name}", []).append(rate)
        base = {"push": statistics.median(rates["push batch 100 raw SQL"]),
                "pop": statistics.median(rates["pop batch 100 raw SQL"])}
        for name, values in rates.items():
            med = statistics.median(values)
            print(f"{name:30s} median {med:9.0f} msg/s  (runs {', '.join(f'{v:.0f}' for v in values)})  "
                  f"/ raw SQL {med / base[name.split()[0]]:5.2f}", flush=True)
        print(f"load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        await pool.close()
        b.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conns", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--prebuilt", type=int, default=600, help="push bodies built before each push phase")
    ap.add_argument("--backlog", type=int, default=100, help="messages per partition before each pop phase")
    args = ap.parse_args()
    run_on_a_server(lambda server: run(args, server), "bench-wire-")

# ---------------------------------------------------------------- CPU only (``queen bench -k wire``)


def _decode_cases() -> dict[str, bytes]:
    from queen.http.push_binary import binary_push_body

    its = items("q", 100, 1)
    return {"json": orjson.dumps({"items": its}), "qpb1": binary_push_body(its, False) or b"",
            "qpb1-frames": binary_push_body(its, True) or b""}


def _pop_answer() -> dict:
    from broker.ids import partition_uuid, uuid7
    from broker.log import render

    pid, lease, at = str(partition_uuid(7)), str(uuid7()), render.ts(datetime.now(UTC))
    msgs = [{"id": str(uuid7()), "transactionId": str(uuid7()), "traceId": None,
             "data": orjson.Fragment(orjson.dumps(PAYLOAD)), "producerSub": "bench", "createdAt": at, "queue": "q",
             "partitionId": pid, "partition": "p", "leaseId": lease, "consumerGroup": "g", "deliveryAttempt": 1,
             "offset": i + 1} for i in range(100)]
    return {"success": True, "queue": "q", "partition": "p", "partitionId": pid, "leaseId": lease,
            "leaseExpiresAt": at, "consumerGroup": "g", "partitionsClaimed": 1, "messages": msgs}


@pytest.mark.parametrize("kind", ["json", "qpb1", "qpb1-frames"])
def test_decode_push_100(benchmark, kind):  # type: ignore[no-untyped-def]
    """What the push handler does with a body of 100 items before the database: JSON (parse_json +
    parse.push_items, the baseline) vs the binary decoder."""
    from broker.http import binary
    from broker.http.wire import parse_json
    from broker.log import parse

    raw = _decode_cases()[kind]
    benchmark.group = "decode a push of 100 items"
    benchmark.extra_info["role"] = "baseline" if kind == "json" else "ours"
    if kind == "json":
        out = benchmark(lambda: parse.push_items(parse_json(raw)["items"], max_payload=1 << 20))
    else:
        out = benchmark(lambda: binary.decode_push(raw, max_payload=1 << 20).items)
    assert len(out) == 100


@pytest.mark.parametrize("kind", ["json", "qpf1"])
def test_render_pop_100(benchmark, kind):  # type: ignore[no-untyped-def]
    """A pop answer of 100 messages: the JSON response (baseline) vs the framed one."""
    from broker.http import binary
    from broker.http.wire import json_response

    answer = _pop_answer()
    benchmark.group = "render a pop of 100 messages"
    benchmark.extra_info["role"] = "baseline" if kind == "json" else "ours"
    out = benchmark(lambda: json_response(answer).body if kind == "json" else binary.encode_pop(answer))
    assert out


if __name__ == "__main__":
    main()
