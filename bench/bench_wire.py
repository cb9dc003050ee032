"""The binary wire formats against JSON, over HTTP, with a bare-SQL baseline in the same run.

    .venv/bin/python bench/bench_wire.py [--seconds 3] [--repeats 3] [--conns 20] [--partitions 200]

A real ``queen serve`` (2 workers) on a fresh database (embedded PostgreSQL unless
QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL names a server). Phases, each repeated
``--repeats`` times in turn, medians printed:

  push batch 100   JSON body | QPB1 (flag 4, what ``binary_push=True`` sends) | QPB1 flag 8 (frames,
                   ``push_compression=True``) | the same queen_push call over asyncpg (baseline);
  pop batch 100    autoAck pops (no ack, so the answer is what differs): JSON | QPF1 (``frames=true``) |
                   queen_pop over asyncpg (baseline); each side drains its own prefilled queue.

The bodies are built with the official client's own encoders (queen.http.push_binary). Numbers are
printed; nothing is asserted. Not part of the test run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import aiohttp
import asyncpg
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_log import PAYLOAD, items, make_db, prefill, sql_pop_ack, sql_push, timed  # noqa: E402
from bench.db import run_on_a_server  # noqa: E402
from broker.localserver import LocalBroker  # noqa: E402


def _binary(its: list[dict], frames: bool) -> bytes:
    from queen.http.push_binary import binary_push_body

    body = binary_push_body(its, frames)
    assert body is not None
    return body


async def push(session: aiohttp.ClientSession, url: str, queue: str, kind: str, partitions: int) -> int:
    its = items(queue, 100, partitions)
    if kind == "json":
        data, ctype = orjson.dumps({"items": its}), "application/json"
    else:
        data, ctype = _binary(its, kind == "qpb1-frames"), "application/x-queen-push"
    async with session.post(url + "/api/v1/push", data=data, headers={"content-type": ctype}) as r:
        assert r.status == 201, await r.text()
        await r.read()
    return 100


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
        from queen.http.pop_frames import decode_pop_frames

        return len(decode_pop_frames(raw)["messages"])
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
            for _ in range(10):  # warm-up: plans, partitions
                for kind in ("json", "qpb1", "qpb1-frames"):
                    await push(s, b.url, "wire", kind, args.partitions)
                await sql_push(pool, "wire_raw", 100, args.partitions)
            rates: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                for kind in ("json", "qpb1", "qpb1-frames"):
                    _, rate = await timed(args.seconds, args.conns,
                                          lambda kind=kind: push(s, b.url, "wire", kind, args.partitions))
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
    ap.add_argument("--backlog", type=int, default=100, help="messages per partition before each pop phase")
    args = ap.parse_args()
    run_on_a_server(lambda server: run(args, server), "bench-wire-")

if __name__ == "__main__":
    main()
