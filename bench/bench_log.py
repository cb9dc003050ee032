"""Message log throughput: HTTP (2 workers) vs raw SQL on the same database, in one run.

    .venv/bin/python bench/bench_log.py [--seconds 5] [--partitions 1000] [--conns 50]

Starts an embedded PostgreSQL (or uses QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL, a server
DSN), a fresh database, and a real ``queen serve`` with 2 workers (synchronous_commit stays on). Then:

  push      batch 1 and batch 100, ``--conns`` concurrent HTTP connections, each request to one
            partition picked at random among ``--partitions`` partitions of one queue;
  pop+ack   batch 100: pop (wait=false) then ``/ack/batch``, ``--conns`` concurrent consumers;
            and pop with autoAck=true; each side pops its own queue, prefilled with ``--backlog``
            messages in each partition, until ``--seconds`` pass or the backlog is drained (the rate
            is over the time actually spent);
  baseline  the same ``queen_push`` / ``queen_pop`` / ``queen_ack`` calls straight over asyncpg from
            as many connections as the broker's pools hold (2 x QUEEN_POOL_MAX), measured in the same
            run: the ratio says what the HTTP edge (parsing, sealing, rendering, Python) costs;
  wake-up   push sent -> a parked long poll answered;
  latency   push p50/p99 at a steady (open-loop) 500 requests/s of one item each;
  zstd      stored size and CPU per payload of the at-rest compression (``--zstd-only``: just that).

Numbers are printed; nothing is asserted. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import asyncpg
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.db import new_migrated_db, run_on_a_server  # noqa: E402
from broker.ids import uuid7  # noqa: E402
from broker.process.localserver import LocalBroker  # noqa: E402

TENANT = "default"
PAYLOAD = {"order": 42, "sku": "SKU-0042", "qty": 3, "note": "gift wrap"}
PAYLOAD_BYTES = orjson.dumps(PAYLOAD)


async def make_db(server_dsn: str) -> str:
    return await new_migrated_db(server_dsn, "bench_log")


CPU: Cpu | None = None


async def timed(seconds: float, conns: int, one, drain: bool = False) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Run ``one()`` (returns messages done) in ``conns`` loops for ``seconds``; messages/s. With ``drain``
    a loop also ends at its first empty answer (the backlog is consumed): the rate is then messages over
    the time it took, not over the whole phase (a finite backlog would otherwise cap the number)."""
    before = CPU.snap() if CPU else None
    stop = time.perf_counter() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            n = await one()  # (not `done += await one()`: that reads done before the await)
            done += n
            if drain and n == 0:
                break

    t0 = time.perf_counter()
    await asyncio.gather(*[loop() for _ in range(conns)])
    elapsed = time.perf_counter() - t0
    if CPU and before:
        print(f"    {done / elapsed:8.0f} msg/s with {conns} loops; {Cpu.diff(before, CPU.snap(), elapsed)}", flush=True)
    return done, done / elapsed


def items(queue: str, n: int, partitions: int) -> list[dict]:
    """One request's items: like the official client (queue(q).partition(p).push([...])), a batch goes
    to one partition, picked at random among ``partitions``."""
    part = f"p{random.randrange(partitions)}"
    return [{"queue": queue, "partition": part, "payload": PAYLOAD, "transactionId": str(uuid7())} for _ in range(n)]


async def http_push(session: aiohttp.ClientSession, url: str, queue: str, batch: int, partitions: int) -> int:
    async with session.post(url + "/api/v1/push", data=orjson.dumps({"items": items(queue, batch, partitions)}),
                            headers={"content-type": "application/json"}) as r:
        assert r.status == 201, await r.text()
        await r.read()
    return batch


async def http_pop_ack(session: aiohttp.ClientSession, url: str, queue: str, batch: int, auto: bool) -> int:
    params = {"batch": str(batch), "wait": "false"}
    if auto:
        params["autoAck"] = "true"
    async with session.get(f"{url}/api/v1/pop/queue/{queue}", params=params) as r:
        if r.status == 204:
            await asyncio.sleep(0.005)
            return 0
        body = orjson.loads(await r.read())
    msgs = body["messages"]
    if not auto:
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"} for m in msgs]
        async with session.post(url + "/api/v1/ack/batch", data=orjson.dumps({"acknowledgments": acks}),
                                headers={"content-type": "application/json"}) as r:
            res = orjson.loads(await r.read())
            assert all(x["success"] for x in res), res[:2]
    return len(msgs)


async def sql_push(pool: asyncpg.Pool, queue: str, batch: int, partitions: int) -> int:
    its = items(queue, batch, partitions)
    async with pool.acquire() as conn, conn.transaction():
        await conn.fetch(
            "SELECT * FROM queen_push($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)", TENANT,
            [i["queue"] for i in its], [i["partition"] for i in its], [uuid7() for _ in its],
            [i["transactionId"] for i in its], [None] * batch, [orjson.dumps(i["payload"]) for i in its],
            [0] * batch, [None] * batch, ["bench"] * batch, [None] * batch)
    return batch


async def prefill(pool: asyncpg.Pool, queue: str, partitions: int, per_partition: int) -> None:
    """``per_partition`` messages in every partition, one partition per batch (one transaction each)."""
    async with pool.acquire() as conn:
        for p in range(partitions):
            n = per_partition
            await conn.fetch(
                "SELECT count(*) FROM queen_push($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)", TENANT, [queue] * n, [f"p{p}"] * n,
                [uuid7() for _ in range(n)], [str(uuid7()) for _ in range(n)], [None] * n, [PAYLOAD_BYTES] * n,
                [0] * n, [None] * n, ["bench"] * n, [None] * n)


async def sql_pop_ack(pool: asyncpg.Pool, queue: str, batch: int, auto: bool) -> int:
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM queen_pop($1,$2,NULL,'__QUEUE_MODE__',$3,1,$4,NULL,NULL)",
                                TENANT, queue, batch, auto)
        msgs = [r for r in rows if r["kind"] == "msg"]
        if not msgs:
            await asyncio.sleep(0.005)
            return 0
        # the same work the HTTP pop does on its side: decode the stored JSON
        for r in msgs:
            orjson.loads(r["payload"])
        if not auto:
            n = len(msgs)
            res = await conn.fetch("SELECT * FROM queen_ack($1,$2,$3,$4,$5,$6,$7)", TENANT,
                                   [r["partition_id"] for r in msgs], [r["txn"] for r in msgs], ["completed"] * n,
                                   [r["lease_id"] for r in msgs], ["__QUEUE_MODE__"] * n, [None] * n)
            assert all(r["success"] for r in res)
    return len(msgs)


async def latency(url: str, queue: str, rate: int, seconds: float, partitions: int) -> tuple[float, float, int]:
    lat: list[float] = []
    conn = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one() -> None:
            t0 = time.perf_counter()
            await http_push(s, url, queue, 1, partitions)
            lat.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            target = start + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    lat.sort()
    return statistics.median(lat) * 1000, lat[int(len(lat) * 0.99) - 1] * 1000, len(lat)


class Cpu:
    """CPU seconds used by the broker (master + workers), the PostgreSQL backends of the bench database
    and this load generator: what a phase spent where (the machine has few cores, shared by all)."""

    def __init__(self, broker_pid: int, db: str) -> None:
        self.broker = psutil.Process(broker_pid)
        self.db = db
        self.me = psutil.Process()

    def _pg(self) -> float:
        total = 0.0
        for p in psutil.process_iter(["name", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if cmd.startswith("postgres:") and f" {self.db} " in cmd + " ":
                    t = p.cpu_times()
                    total += t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total

    def snap(self) -> tuple[float, float, float]:
        procs = [self.broker, *self.broker.children(recursive=True)]
        b = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                b += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        m = self.me.cpu_times()
        return b, self._pg(), m.user + m.system

    @staticmethod
    def diff(a: tuple[float, float, float], b: tuple[float, float, float], wall: float) -> str:
        d = [y - x for x, y in zip(a, b, strict=True)]
        return f"cpu/s: broker {d[0] / wall:.2f}, postgres {d[1] / wall:.2f}, load generator {d[2] / wall:.2f}"


async def wake_latency(url: str, rounds: int = 20) -> tuple[float, float]:
    """A long poll parked on an empty queue, then one push: time from sending the push to the pop's
    answer (median, max in ms). Includes the push's own commit."""
    out: list[float] = []
    async with aiohttp.ClientSession() as s:
        for i in range(rounds):
            q = f"wake_{i}"
            poll = asyncio.create_task(s.get(f"{url}/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": "10000"}))
            await asyncio.sleep(0.2)
            t0 = time.perf_counter()
            await http_push(s, url, q, 1, 1)
            r = await poll
            await r.read()
            assert r.status == 200
            out.append((time.perf_counter() - t0) * 1000)
    out.sort()
    return statistics.median(out), out[-1]


def zstd_report() -> None:
    """What storing payloads zstd-compressed (QUEEN_ZSTD_THRESHOLD_BYTES, level QUEEN_ZSTD_LEVEL) saves
    and costs: stored bytes and CPU per payload, through the broker's own Codec."""
    from broker.codec import Codec
    from broker.config import Settings

    st = Settings()
    codec = Codec(st.zstd_threshold_bytes, st.zstd_level)
    rnd = random.Random(7)
    docs = {
        "order lines 1.5 KiB": {"order": 1, "lines": [{"sku": f"SKU-{i:05d}", "qty": i % 7, "price": 9.99, "note": "gift wrap"}
                                              for i in range(25)]},
        "event log 15 KiB": [{"ts": f"2026-11-30T10:{i % 60:02d}:00Z", "level": "INFO", "service": "billing",
                              "msg": f"charged customer {rnd.randrange(10**6)}"} for i in range(160)],
        "random hex 4 KiB": os.urandom(3000).hex()[: 4000],
    }
    print(f"zstd at rest (threshold {st.zstd_threshold_bytes} B, level {st.zstd_level}):")
    for name, doc in docs.items():
        raw = orjson.dumps(doc)
        kind, packed = codec.pack(raw)
        n = 300
        t0 = time.perf_counter()
        for _ in range(n):
            codec.pack(raw)
        pack_us = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(n):
            codec.unpack(kind, packed)
        unpack_us = (time.perf_counter() - t0) / n * 1e6
        print(f"  {name:30s} {len(raw):6d} B -> {len(packed):6d} B stored ({len(packed) / len(raw):5.1%}, codec {kind}); "
              f"compress {pack_us:6.1f} us, decompress {unpack_us:6.1f} us", flush=True)


def line(name: str, ours: float, base: float | None = None) -> None:
    extra = f"   raw SQL {base:10.0f} msg/s   ratio {ours / base:5.2f}" if base else ""
    print(f"{name:34s} {ours:10.0f} msg/s{extra}", flush=True)


async def run(args: argparse.Namespace, server_dsn: str) -> None:
    dsn = await make_db(server_dsn)
    pool_max = int(os.environ.get("QUEEN_POOL_MAX", "10"))
    b = LocalBroker(dsn=dsn, workers=2, env={"QUEEN_LOG_LEVEL": "WARNING", "QUEEN_POOL_MAX": str(pool_max)},
                    log_path=Path(tempfile.gettempdir()) / "bench_log_broker.log")
    b.start()
    pool = await asyncpg.create_pool(dsn, min_size=2 * pool_max, max_size=2 * pool_max)
    global CPU
    assert b.proc is not None
    from urllib.parse import urlsplit

    CPU = Cpu(b.proc.pid, urlsplit(dsn).path.lstrip("/"))
    sc = await pool.fetchval("SHOW synchronous_commit")
    print(f"PostgreSQL synchronous_commit={sc}; broker 2 workers x pool {pool_max}; {args.conns} HTTP connections; "
          f"{args.partitions} partitions; {args.seconds:.0f} s per phase; cpus={os.cpu_count()}", flush=True)
    try:
        connector = aiohttp.TCPConnector(limit=args.conns)
        async with aiohttp.ClientSession(connector=connector) as s:
            # warm up both workers' plans and create the partitions
            for _ in range(20):
                await http_push(s, b.url, "bench", 100, args.partitions)
                await sql_push(pool, "bench_raw", 100, args.partitions)
            res = {}
            for batch in (1, 100):
                _, res[("push", batch, "http")] = await timed(args.seconds, args.conns,
                                                              lambda batch=batch: http_push(s, b.url, "bench", batch, args.partitions))
                _, res[("push", batch, "sql")] = await timed(args.seconds, 2 * pool_max,
                                                             lambda batch=batch: sql_push(pool, "bench_raw", batch, args.partitions))
                line(f"push batch {batch}", res[("push", batch, "http")], res[("push", batch, "sql")])
            for auto in (False, True):
                label = "pop autoAck batch 100" if auto else "pop + ack/batch batch 100"
                # the same backlog for both sides: a fresh queue each, args.backlog messages per partition
                qh, qr = f"pop_http_{int(auto)}", f"pop_raw_{int(auto)}"
                for q in (qh, qr):
                    await prefill(pool, q, args.partitions, args.backlog)
                _, ours = await timed(args.seconds, args.conns, lambda auto=auto, qh=qh: http_pop_ack(s, b.url, qh, 100, auto),
                                      drain=True)
                _, base = await timed(args.seconds, 2 * pool_max, lambda auto=auto, qr=qr: sql_pop_ack(pool, qr, 100, auto),
                                      drain=True)
                line(label, ours, base)
        med, worst = await wake_latency(b.url)
        print(f"long-poll wake-up (push sent -> waiting pop answered): median {med:.1f} ms, max {worst:.1f} ms", flush=True)
        for rate in args.rate:
            p50, p99, n = await latency(b.url, f"bench_lat_{rate}", rate, args.latency_seconds, args.partitions)
            print(f"push latency at {rate} req/s (open loop, {n} requests of 1 item): p50 {p50:.1f} ms  p99 {p99:.1f} ms",
                  flush=True)
        left = await pool.fetchval("SELECT sum(next_seq - 1) FROM queen_partitions WHERE queue = 'bench'")
        print(f"(messages pushed to the HTTP queue in total: {left})")
    finally:
        await pool.close()
        b.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--latency-seconds", type=float, default=6.0)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--backlog", type=int, default=100, help="messages per partition before each pop phase")
    ap.add_argument("--rate", type=int, nargs="+", default=[500], help="steady push rates for the latency phase")
    ap.add_argument("--zstd-only", action="store_true", help="only the zstd storage/CPU report")
    args = ap.parse_args()
    zstd_report()
    if args.zstd_only:
        return
    run_on_a_server(lambda server: run(args, server), "bench-log-")


if __name__ == "__main__":
    main()
