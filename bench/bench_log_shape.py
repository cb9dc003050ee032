"""The message log in the shape of the side-by-side comparison with the C++ Queen, against our broker and (optionally) the C++ Queen in one run.

    .venv/bin/python bench/bench_log_shape.py [--quick] [--cpp-bin PATH | --cpp-url URL] [--url URL] [--only PHASE ...]

Shape (what the issue measured with ``wrk -t2 -c50``): one queue, partitions "0".."1000" round-robin,
payload ``{"message":"Hello World","partition_id":N}``, 50 keep-alive connections in a closed loop:

  push_1          one item per request, the request's partition round-robin;
  push_100        100 items per request, all to the request's partition (round-robin);
  (prefill)       ``--prefill`` seconds of push_100 before each pop phase;
  pop_auto_100    pop autoAck, batch 100 (wait=false);
  pop_ack_100     pop batch 100, then /ack/batch of what came;
  pop_ack_10      the same at batch 10;
  open_500        open loop: one-item pushes at a fixed 500 req/s over the same 50 connections,
  open_1000       and at 1,000 req/s; latency from each request's SCHEDULED send time (a request that
                  has to wait for a free connection counts that wait: no coordinated omission);
  light_100       one push, one pop (batch 1) + its ack, each at 100/s, open loop, latency per kind
                  (pushes round-robin over 4 partitions from 4 connections, pops and their acks from 4
                  consumers, so a slow answer does not delay the next request's start; a pop that finds
                  the queue empty (204) still counts its latency). The pop stream runs half a period
                  (5 ms) after the push stream: two 100/s streams, not one 200/s burst of pairs sent at
                  the same instant. Latency runs from
                  the instant the generator's timer hands the request over (a wait for a free
                  connection counts): uvloop's timers fire up to ~1 ms after the scheduled instant,
                  and that lateness is the generator's, printed on its own line.

Every phase prints msg/s, latency p50/p99 and the p99 of its first and last third (a p99 that grows
over a phase grows with the rows in the log) and, when the bench knows the PostgreSQL server (always,
except with ``--url`` and no QUEEN_BENCH_DATABASE_URL), what the server did beside the requests: the
checkpoints that started and the autovacuum workers seen during the phase, and how many of the slowest
1 % of requests ran while one was active. With ``--cpp-bin`` (or QUEEN_BENCH_CPP_BIN) the bench
starts a locally built C++ Queen itself (bench/cpp_queen.py: 2 workers, pools of 10, its own fresh
database on the same PostgreSQL server as ours, stopped at the end); with ``--cpp-url`` (or
QUEEN_BENCH_CPP_URL) it uses one already running. Either way every phase also runs against it, right
before or after ours (same requests, its own queue name), with its CPU per request when the bench started it, and
the ratio ours/C++ is printed (which of the two runs a phase first alternates from phase to phase:
the second inherits the first's leftovers on the shared server); without either the issue's reference figures (C++ Queen 0.15.1 on a tuned
PostgreSQL 15, same machine kind) are the baseline. Our broker is a real ``queen serve`` (2 workers) on the
embedded PostgreSQL (or QUEEN_BENCH_DATABASE_URL, a server DSN; a fresh database), unless ``--url``
points at a running one. RSS of our master and workers is printed at the end.

The load generator is a minimal HTTP/1.1 client on asyncio streams (uvloop when installed): it keeps
itself small on a 2-core machine where it competes with the brokers and PostgreSQL; its CPU use per
phase is printed. ``--quick`` shortens every phase (3 s, prefill 3 s). Nothing is asserted.

Building the C++ Queen for ``--cpp-bin`` (outside this repository; none of its code belongs here).
Debian packages: g++, make, cmake, libpq-dev, libssl-dev, zlib1g-dev. Then, in some directory D:
  1. the ``server/`` and ``lib/`` trees of github.com/smartpricing/queen at commit ab23212 into D;
  2. D/server/vendor/ filled by hand with what its Makefile's ``deps`` target would download (the
     Makefile names the versions): uWebSockets tag v20.76.0 as vendor/uWebSockets, uSockets at commit
     ae52d1ed (the one that uWebSockets release pins) as vendor/uSockets, spdlog (v1.14.1 is asked;
     1.13.0 builds too) as vendor/spdlog, libuv v1.48.0 as vendor/libuv, jwt-cpp v0.7.0 as
     vendor/jwt-cpp, and two single headers: nlohmann/json v3.11.3 ``single_include/nlohmann/json.hpp``
     as vendor/json.hpp, cpp-httplib ``httplib.h`` (it asks for master; v0.45.0, the release before
     that commit, builds) as vendor/httplib.h;
  3. libuv as a static library: ``cmake .. -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF
     -DLIBUV_BUILD_SHARED=OFF && cmake --build . --target uv_a`` in vendor/libuv/build;
  4. ``touch vendor/.deps_ready`` (the marker its download step leaves), then in D/server
     ``nice -n 19 make -j2 build-only`` (some 10-15 minutes on 2 cores) gives D/server/bin/queen-server.
Pass that binary as ``--cpp-bin D/server/bin/queen-server``; it must stay next to D/lib/schema, which it
reads on start to create its schema. Its log goes to $TMPDIR/bench_cpp_queen.log.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpp_queen import CppQueen  # noqa: E402
from bench.db import new_db  # noqa: E402
from bench.httpconn import Conn, HttpError, host_port  # noqa: E402
from broker.app import settle_heap  # noqa: E402

PARTITIONS = 1001  # "0".."1000"

# The figures for the C++ Queen (msg/s; latency in ms), used when no --cpp-url is given.
REFERENCE: dict[str, dict[str, float]] = {
    "push_1": {"rate": 2119, "p99": 39},
    "push_100": {"rate": 11526},
    "pop_auto_100": {"rate": 18604},
    "pop_ack_100": {"rate": 7025},
    "pop_ack_10": {"rate": 3209},
    "open_500": {"rate": 500, "p50": 9.6, "p99": 18.1},
    "open_1000": {"rate": 996, "p99": 50},
}
# Where we stood before group commit (the comparison's table), for the report.
BEFORE: dict[str, str] = {
    "push_1": "1,070 msg/s, p99 214 ms",
    "push_100": "26,729 msg/s",
    "pop_auto_100": "17,984 msg/s",
    "pop_ack_100": "10,582 msg/s",
    "pop_ack_10": "1,205 msg/s",
    "open_500": "p50 4.5, p99 484 ms",
    "open_1000": "844 req/s, p50 1.4 s",
}


@dataclass
class Result:
    msgs: int = 0
    requests: int = 0
    seconds: float = 0.0
    lat: list[tuple[float, float]] = field(default_factory=list)  # (time since phase start, latency s)
    errors: int = 0
    cpu_gen: float = 0.0
    cpu_broker: float | None = None  # CPU seconds per second over the phase
    cpu_pg: float | None = None

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds if self.seconds else 0.0

    def pct(self, q: float, part: slice | None = None) -> float:
        xs = sorted(x for _, x in (self.lat[part] if part else self.lat))
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, int(len(xs) * q))] * 1000

    def thirds(self) -> tuple[float, float]:
        lat = sorted(self.lat)
        n = len(lat) // 3
        if n < 10:
            return float("nan"), float("nan")
        first = sorted(x for _, x in lat[:n])
        last = sorted(x for _, x in lat[-n:])
        return first[int(len(first) * 0.99)] * 1000, last[int(len(last) * 0.99)] * 1000


class CpuMeter:
    """CPU seconds of a broker's process tree and of the PostgreSQL backends serving its database
    (cmdline "postgres: ... <db> ..."): CPU per message is steadier than rates on a shared machine."""

    def __init__(self, pid: int | None, db: str | None) -> None:
        self.pid, self.db = pid, db

    def snap(self) -> tuple[float, float]:
        b = pg = 0.0
        if self.pid:
            try:
                root = psutil.Process(self.pid)
                for p in [root, *root.children(recursive=True)]:
                    t = p.cpu_times()
                    b += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        if self.db:
            for p in psutil.process_iter(["cmdline"]):
                try:
                    cmd = " ".join(p.info["cmdline"] or [])
                    if cmd.startswith("postgres:") and f" {self.db} " in cmd + " ":
                        t = p.cpu_times()
                        pg += t.user + t.system
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        return b, pg


class ServerWatch:
    """What the PostgreSQL server did besides serving requests during a phase: the autovacuum workers
    seen (sampled every 100 ms; the C++ Queen's tables count too, it is the same server), and the
    checkpoints that started. A tail that lines up with these is the server's, not the broker's."""

    SAMPLE_S = 0.1

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.seen: dict[str, int] = {}
        self.busy: list[float] = []  # perf_counter instants with an autovacuum worker active
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._ckpt0 = 0

    async def _checkpoints(self) -> int:
        for q in ("SELECT num_timed + num_requested FROM pg_stat_checkpointer",  # PostgreSQL 17+
                  "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"):
            try:
                return int(await self._conn.fetchval(q))
            except Exception:  # noqa: BLE001 - the other server version's view
                continue
        return 0

    async def _sample(self) -> None:
        while True:
            rows = await self._conn.fetch(
                "SELECT datname, query FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
            if rows:
                self.busy.append(time.perf_counter())
            for r in rows:
                what = f"{r['datname']}: {(r['query'] or '').removeprefix('autovacuum: ')}"
                self.seen[what] = self.seen.get(what, 0) + 1
            await asyncio.sleep(self.SAMPLE_S)

    async def start(self) -> None:
        import asyncpg

        self.seen, self.busy = {}, []
        self._conn = await asyncpg.connect(self.dsn)
        self._ckpt0 = await self._checkpoints()
        self._task = asyncio.create_task(self._sample())

    async def stop(self, lat: list[tuple[float, float]] | None = None, t0: float = 0.0) -> str:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        ckpt = await self._checkpoints() - self._ckpt0
        await self._conn.close()
        vac = ", ".join(f"{k} ({v * self.SAMPLE_S:.1f} s)" for k, v in sorted(self.seen.items(), key=lambda kv: -kv[1]))
        out = f"server: {ckpt} checkpoint(s) started; autovacuum: {vac or 'none'}"
        if lat and self.busy:  # of the slowest 1 % of requests, how many ran while autovacuum did
            worst = sorted(lat, key=lambda x: -x[1])[: max(1, len(lat) // 100)]
            near = sum(any(abs(b - (t0 + s)) <= self.SAMPLE_S + d for b in self.busy) for s, d in worst)
            out += f"; slowest 1 % during autovacuum: {near}/{len(worst)}"
        return out


class Target:
    def __init__(self, name: str, url: str, cpu: CpuMeter | None = None) -> None:
        self.name = name
        self.cpu = cpu
        self.host, self.port = host_port(url)
        self.queue = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        self.rr = itertools.count()

    def conn(self) -> Conn:
        return Conn(self.host, self.port)

    def next_partition(self) -> int:
        return next(self.rr) % PARTITIONS

    def push_body(self, n: int) -> tuple[bytes, int]:
        p = self.next_partition()
        item = {"queue": self.queue, "partition": str(p), "payload": {"message": "Hello World", "partition_id": p}}
        return orjson.dumps({"items": [item] * n}), n


async def push_once(t: Target, c: Conn, n: int) -> int:
    body, k = t.push_body(n)
    st, data = await c.request("POST", "/api/v1/push", body)
    if st not in (200, 201):
        raise HttpError(f"push {st}: {data[:200]!r}")
    return k


async def pop_once(t: Target, c: Conn, batch: int, auto: bool, ack: bool) -> int:
    path = f"/api/v1/pop/queue/{t.queue}?batch={batch}&wait=false" + ("&autoAck=true" if auto else "")
    st, data = await c.request("GET", path)
    if st == 204:  # ours when nothing is there; the C++ Queen answers 200 with no messages
        return 0
    if st != 200:
        raise HttpError(f"pop {st}: {data[:200]!r}")
    msgs = orjson.loads(data).get("messages") or []
    if ack and msgs:
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m.get("leaseId"),
                 "status": "completed"} for m in msgs]
        st, data = await c.request("POST", "/api/v1/ack/batch", orjson.dumps({"acknowledgments": acks}))
        if st != 200 or refused(data):
            raise HttpError(f"ack {st}: {data[:200]!r}")
    return len(msgs)


def refused(ack_answer: bytes) -> int:
    """Acknowledgments answered ``success: false`` (both brokers refuse a bad lease with HTTP 200)."""
    try:
        items = orjson.loads(ack_answer)
    except orjson.JSONDecodeError:
        return 1
    return sum(1 for i in items if isinstance(i, dict) and i.get("success") is False) if isinstance(items, list) else 0


async def closed_loop(t: Target, conns: int, seconds: float, one, drain: bool = False) -> Result:  # type: ignore[no-untyped-def]
    res = Result()
    me = psutil.Process()
    c0 = sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    stop = t0 + seconds

    async def loop() -> None:
        c = t.conn()
        try:
            while time.perf_counter() < stop:
                s = time.perf_counter()
                try:
                    n = await one(c)
                except HttpError:
                    res.errors += 1
                    await asyncio.sleep(0.01)
                    continue
                e = time.perf_counter()
                res.lat.append((s - t0, e - s))
                res.requests += 1
                res.msgs += n
                if drain and n == 0:
                    break
        finally:
            c.close()

    await asyncio.gather(*[loop() for _ in range(conns)])
    res.seconds = time.perf_counter() - t0
    res.cpu_gen = (sum(me.cpu_times()[:2]) - c0) / res.seconds
    return res


async def open_loop(t: Target, conns: int, rate: float, seconds: float, one) -> Result:  # type: ignore[no-untyped-def]
    """Requests scheduled at ``rate``/s; a free connection takes the next due request. Latency is from
    the request's scheduled send time, so waiting for a connection counts."""
    res = Result()
    me = psutil.Process()
    c0 = sum(me.cpu_times()[:2])
    n = int(rate * seconds)
    q: asyncio.Queue[float | None] = asyncio.Queue()
    t0 = time.perf_counter() + 0.05

    async def feeder() -> None:
        for i in range(n):
            due = t0 + i / rate
            d = due - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            q.put_nowait(due)
        for _ in range(conns):
            q.put_nowait(None)

    async def worker() -> None:
        c = t.conn()
        try:
            while True:
                due = await q.get()
                if due is None:
                    return
                try:
                    k = await one(c)
                except HttpError:
                    res.errors += 1
                    continue
                e = time.perf_counter()
                res.lat.append((due - t0, e - due))
                res.requests += 1
                res.msgs += k
        finally:
            c.close()

    await asyncio.gather(feeder(), *[worker() for _ in range(conns)])
    res.seconds = time.perf_counter() - t0
    res.cpu_gen = (sum(me.cpu_times()[:2]) - c0) / res.seconds
    return res


LIGHT_CONSUMERS = 4


async def light(t: Target, seconds: float) -> dict[str, Result]:
    """One push, one pop (batch 1) and its ack, each at 100/s, open loop: latency per kind."""
    out = {k: Result() for k in ("push", "pop", "ack")}
    n = int(100 * seconds)
    t0 = time.perf_counter() + 0.05
    bodies = [orjson.dumps({"items": [{"queue": t.queue + "-light", "partition": f"light-{k}",
                                       "payload": {"message": "Hello World", "partition_id": k}}]})
              for k in range(LIGHT_CONSUMERS)]

    push_dues: asyncio.Queue[tuple[float, int] | None] = asyncio.Queue()
    late: list[float] = []  # the generator's own timer lateness (handed over minus scheduled)

    async def push_scheduler() -> None:
        for i in range(n):
            due = t0 + i / 100
            d = due - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            handed = time.perf_counter()
            late.append(handed - due)
            push_dues.put_nowait((handed, i))
        for _ in range(LIGHT_CONSUMERS):
            push_dues.put_nowait(None)

    async def pusher() -> None:
        c = t.conn()
        while (due := await push_dues.get()) is not None:
            handed, i = due
            st, _ = await c.request("POST", "/api/v1/push", bodies[i % LIGHT_CONSUMERS])
            out["push"].lat.append((handed - t0, time.perf_counter() - handed))
            out["push"].msgs += st in (200, 201)
            out["push"].requests += 1
        c.close()

    dues: asyncio.Queue[float | None] = asyncio.Queue()

    async def scheduler() -> None:
        await asyncio.sleep(0.2)  # the first pushes are in
        for i in range(n):
            due = t0 + 0.205 + i / 100  # half a period after the pushes: the streams interleave
            d = due - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            handed = time.perf_counter()
            late.append(handed - due)
            dues.put_nowait(handed)
        for _ in range(LIGHT_CONSUMERS):
            dues.put_nowait(None)

    async def consumer() -> None:
        """A consumer: pop (any partition) at the scheduled instant, then ack (timed from when it is
        sent). Four of them over four partitions, so a pop is not held back by the previous pop's ack
        (one partition's lease is exclusive: consumers of one partition would pop in series)."""
        c = t.conn()
        while (handed := await dues.get()) is not None:
            st, data = await c.request("GET", f"/api/v1/pop/queue/{t.queue}-light?batch=1&wait=false")
            out["pop"].lat.append((handed - t0, time.perf_counter() - handed))
            out["pop"].requests += 1
            got = orjson.loads(data).get("messages") if st == 200 else None
            if not got:  # empty: 204 from ours, 200 with no messages from the C++ Queen
                continue
            m = got[0]
            s = time.perf_counter()
            st, data = await c.request("POST", "/api/v1/ack", orjson.dumps(
                {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m.get("leaseId"),
                 "status": "completed"}))
            out["ack"].lat.append((handed - t0, time.perf_counter() - s))
            out["pop"].msgs += 1
            out["ack"].msgs += st == 200 and not refused(data)
            out["ack"].requests += 1
        c.close()

    await asyncio.gather(push_scheduler(), scheduler(), *[pusher() for _ in range(LIGHT_CONSUMERS)],
                         *[consumer() for _ in range(LIGHT_CONSUMERS)])
    for r in out.values():
        r.seconds = seconds
    late.sort()
    if late:
        print(f"  light_100 generator timer lateness (not counted): p50 {late[len(late) // 2] * 1000:.2f} "
              f"p99 {late[int(len(late) * 0.99)] * 1000:.2f} ms", flush=True)
    return out


async def warm(t: Target) -> None:
    async def one(k: int) -> None:
        c = t.conn()
        for p in range(k, PARTITIONS, 10):
            body = {"items": [{"queue": t.queue, "partition": str(p), "payload": {"message": "warm", "partition_id": p}}]}
            await c.request("POST", "/api/v1/push", orjson.dumps(body))
        c.close()

    await asyncio.gather(*[one(k) for k in range(10)])


PHASES = ("push_1", "push_100", "pop_auto_100", "pop_ack_100", "pop_ack_10", "open_500", "open_1000", "light_100")


async def run_phase(t: Target, phase: str, args: argparse.Namespace) -> dict[str, Result]:
    sec = args.seconds
    if phase == "push_1":
        return {"": await closed_loop(t, args.conns, sec, lambda c: push_once(t, c, 1))}
    if phase == "push_100":
        return {"": await closed_loop(t, args.conns, sec, lambda c: push_once(t, c, 100))}
    if phase == "pop_auto_100":
        return {"": await closed_loop(t, args.conns, sec, lambda c: pop_once(t, c, 100, True, False), drain=True)}
    if phase == "pop_ack_100":
        return {"": await closed_loop(t, args.conns, sec, lambda c: pop_once(t, c, 100, False, True), drain=True)}
    if phase == "pop_ack_10":
        return {"": await closed_loop(t, args.conns, sec, lambda c: pop_once(t, c, 10, False, True), drain=True)}
    if phase.startswith("open_"):
        rate = int(phase.split("_")[1])
        return {"": await open_loop(t, args.conns, rate, sec, lambda c: push_once(t, c, 1))}
    if phase == "light_100":
        return {f" {k}": v for k, v in (await light(t, sec)).items()}
    raise ValueError(phase)


def describe(r: Result) -> str:
    a, b = r.thirds()
    err = f", {r.errors} errors" if r.errors else ""
    if r.cpu_broker is not None and r.rate and not r.requests == r.msgs == 0:
        per = 1e3 / (r.requests / r.seconds)
        err += (f"; cpu/s broker {r.cpu_broker:.2f} pg {r.cpu_pg:.2f} = {r.cpu_broker * per:.2f}+{(r.cpu_pg or 0) * per:.2f}"
                " ms per request")
    return (f"{r.rate:9.0f} msg/s {r.requests / r.seconds if r.seconds else 0:7.0f} req/s  p50 {r.pct(0.5):7.1f} "
            f"p99 {r.pct(0.99):7.1f} ms  (p99 first/last third {a:.1f}/{b:.1f}; gen cpu {r.cpu_gen:.2f}{err})")


def rss_report(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        kids = p.children(recursive=True)
        return (f"RSS master {p.memory_info().rss / 2**20:.0f} MB, workers "
                + ", ".join(f"{k.memory_info().rss / 2**20:.0f}" for k in kids) + " MB")
    except psutil.NoSuchProcess:
        return "RSS: broker gone"


async def make_db(server_dsn: str) -> str:
    from bench.db import new_migrated_db

    return await new_migrated_db(server_dsn, "bench_shape")


async def main_async(args: argparse.Namespace, ours_url: str, broker_pid: int | None, db: str | None,
                     cpp: CppQueen | None = None, server: str | None = None) -> None:
    targets = [Target("ours", ours_url, CpuMeter(broker_pid, db) if broker_pid or db else None)]
    if cpp is not None:
        assert cpp.proc is not None
        targets.append(Target("cpp", cpp.url, CpuMeter(cpp.proc.pid, cpp.db)))
    elif args.cpp_url:
        targets.append(Target("cpp", args.cpp_url))
    print(f"{args.conns} connections, {PARTITIONS} partitions, {args.seconds:g} s per phase, prefill {args.prefill:g} s, "
          f"cpus={os.cpu_count()}, load avg {os.getloadavg()[0]:.1f}", flush=True)
    for t in targets:  # create the partitions (not timed): every partition once, 10 connections
        await warm(t)
    table: list[tuple[str, dict[str, Result]]] = []
    for i, phase in enumerate(args.only or PHASES):
        got: dict[str, Result] = {}
        # Who goes first alternates from phase to phase: whichever broker runs second inherits the
        # first's leftovers on the shared server (dirty pages, WAL, autovacuum of what it wrote), and
        # in a fixed order our light phase always came right after the C++ Queen's 1,000 req/s one.
        for t in targets if i % 2 == 0 else targets[::-1]:
            if phase.startswith("pop_"):
                await closed_loop(t, args.conns, args.prefill, lambda c, t=t: push_once(t, c, 100))
            watch = ServerWatch(server) if server else None
            if watch:
                await watch.start()
            before = t.cpu.snap() if t.cpu else None
            t0 = time.perf_counter()
            got_t = await run_phase(t, phase, args)
            if watch:
                lat = [x for r in got_t.values() for x in r.lat]
                print(f"  {phase:18s} {t.name:4s} {await watch.stop(lat, t0)}", flush=True)
            if t.cpu and before:
                after, wall = t.cpu.snap(), time.perf_counter() - t0
                for r in got_t.values():
                    r.cpu_broker, r.cpu_pg = (after[0] - before[0]) / wall, (after[1] - before[1]) / wall
            for k, r in got_t.items():
                got[t.name + k] = r
                print(f"  {phase + k:18s} {t.name:4s} {describe(r)}", flush=True)
        if "ours" in got and "cpp" in got:
            o, c = got["ours"], got["cpp"]
            print(f"  {phase:18s} ratio ours/cpp {o.rate / c.rate if c.rate else float('nan'):.2f} "
                  f"(p99 {o.pct(0.99):.1f} vs {c.pct(0.99):.1f} ms)", flush=True)
        elif phase in REFERENCE and "ours" in got:
            ref = REFERENCE[phase]
            o = got["ours"]
            ratio = o.rate / ref["rate"]
            lat = "".join(f", {k} {o.pct(0.5 if k == 'p50' else 0.99):.1f} vs {v:g} ms" for k, v in ref.items() if k != "rate")
            print(f"  {phase:18s} vs issue reference: {ratio:.2f}x of {ref['rate']:g} msg/s{lat} "
                  f"(ours before: {BEFORE.get(phase, '-')})", flush=True)
        table.append((phase, got))
    if broker_pid:
        print(rss_report(broker_pid), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per phase (default 20, as the issue)")
    ap.add_argument("--prefill", type=float, default=30.0, help="seconds of batch-100 pushes before each pop phase")
    ap.add_argument("--quick", action="store_true", help="3 s phases, 3 s prefills")
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--url", help="a running broker of ours (default: start one, 2 workers)")
    ap.add_argument("--cpp-url", default=os.environ.get("QUEEN_BENCH_CPP_URL"),
                    help="the C++ Queen to run side by side (env QUEEN_BENCH_CPP_URL)")
    ap.add_argument("--cpp-bin", default=os.environ.get("QUEEN_BENCH_CPP_BIN"),
                    help="a built C++ Queen server/bin/queen-server: the bench starts it on its own database of the "
                         "same PostgreSQL server as ours, runs it side by side and stops it (env QUEEN_BENCH_CPP_BIN)")
    ap.add_argument("--only", nargs="+", choices=PHASES, help="run only these phases")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--broker-pid", type=int, help="with --url: our broker's master pid (CPU and RSS accounting)")
    ap.add_argument("--db", help="with --url: our broker's database name (PostgreSQL CPU accounting)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra QUEEN_* env for our broker")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.prefill = 3.0, 3.0
    settle_heap()  # the generator's own collector out of its latencies, as in a broker worker
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    server = os.environ.get("QUEEN_BENCH_DATABASE_URL") or os.environ.get("QUEEN_TEST_DATABASE_URL")
    if args.cpp_bin and not Path(args.cpp_bin).is_file():
        ap.error(f"--cpp-bin: no such file {args.cpp_bin}")
    if args.url and args.cpp_bin and not server:
        ap.error("--cpp-bin with --url needs QUEEN_BENCH_DATABASE_URL: the PostgreSQL server of that broker")
    emb: Any = None
    b: Any = None
    cpp: CppQueen | None = None
    try:
        if not server and not args.url:
            from broker.store import embedded

            emb = embedded.start_scratch("bench-shape-")
            server = emb.dsn()
        if args.cpp_bin:
            assert server is not None
            cpp = CppQueen(args.cpp_bin, asyncio.run(new_db(server, "bench_shape_cpp")), workers=args.workers)
            cpp.start()
        if args.url:
            asyncio.run(main_async(args, args.url, args.broker_pid, args.db, cpp, server))
            return
        from broker.process.localserver import LocalBroker

        assert server is not None
        dsn = asyncio.run(make_db(server))
        env = {"QUEEN_LOG_LEVEL": "WARNING", **dict(kv.split("=", 1) for kv in args.env)}
        b = LocalBroker(dsn=dsn, workers=args.workers, env=env,
                        log_path=Path(tempfile.gettempdir()) / "bench_log_shape_broker.log")
        b.start()
        assert b.proc is not None
        asyncio.run(main_async(args, b.url, b.proc.pid, urlsplit(dsn).path.lstrip("/"), cpp, server))
    finally:
        for running in (b, cpp, emb):
            if running is not None:
                running.stop()

if __name__ == "__main__":
    main()
