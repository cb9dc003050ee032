"""The reference broker's own benchmark axes, side by side: our broker and the C++ Queen in one run.

    queen bench shapes [--quick] [--seconds S] [--long-seconds S] [--cpp-bin PATH] [--only ROW ...] [--repeat N]
    .venv/bin/python bench/bench_shapes.py ...           (the same)

The C++ Queen publishes a benchmark suite whose axes users compare brokers on. Every axis,
scaled to a 2-core machine, runs here against both brokers on ONE PostgreSQL server in the same run,
each broker on its own fresh database. Rows (``--only`` picks some):

  part_2 .. part_10001   partitions under contention: producers and consumers at once, one message
                         per push to a random partition of 2 / 11 / 101 / 1,001 / 10,001;
  groups_1/5/10          1 / 5 / 10 consumer groups on one queue with the producer running (push batch
                         10, 101 partitions): the producer's rate loss against the 1-group row of the
                         same broker, and the per-group delivery spread (for each message, the latest
                         minus the earliest group's delivery instant; its p99), beside the gap between
                         the highest and lowest per-group end-to-end p99 and each group's msg/s;
  batch_1/10/100         push batch 1 / 10 / 100 over 101 partitions, consumers running;
  queues_1/10            the same load (push batch 10) over 1 queue or 10 queues (101 partitions each),
                         each consumer connection on one queue, producers round-robin over the queues;
  long                   push batch 10 over 101 partitions for ``--long-seconds`` (default 600): the
                         p99 of the last third against the first (push and delivery);
  ack_single             one connection: push one message, pop it (batch 1), acknowledge it alone
                         (``/api/v1/ack``); the ack's own latency (target: p50 under 1.5 ms).

Connections are the reference suite's own (its _runner scripts): the partitions rows push from 500
connections and pop from 100 ("5x100 producers and 2x50 consumers"), every other row from 50 and 50 (each
group its own 50); ``--producers`` / ``--consumers`` / ``--group-consumers`` set them for every row instead.
Every connection is a closed loop (the next request when the answer came), so the count is the offered load.
Consumers pop batch 100 with autoAck and a long poll (wait=true, 1 s), as the reference's consumers do
(``--autopilot`` adds the official client's default ``autopilot=true``, which lets our broker claim
several partitions a pop);
they start before the producers and, once the producers stop, drain until a long poll comes back empty
(or ``--drain`` seconds pass); then a closing sweep pops (wait=false) until every queue is empty for every
group (at most 25 s), and what it finds counts as delivered "late" (printed). Every message carries its
id and send instant in its payload; after the sweep every id a push confirmed is checked: LOST = confirmed,
never delivered (per group), marked "?" when the sweep ran out of time or a pop failed (not reached, so
not shown to be gone); DUP = delivered more than once (per group); a push that failed or was refused is
not counted either way.

Per broker and row: push msg/s (confirmed messages over the producing window), pop msg/s (deliveries in
that window, all groups), push request p50/p99 and end-to-end delivery p50/p99 (send -> delivered),
broker CPU and PostgreSQL CPU in seconds per million messages pushed (from /proc, over the whole phase
with its drain: the broker's process tree; the PostgreSQL backends of its database plus the server's
own background processes, which serve only the broker whose phase runs), the broker's peak RSS (sum
over its process tree: forked workers share pages, so this is an upper bound), lost/dup, and the load
generator's CPU (its two processes: producers and consumers, each one asyncio loop on the lean client
bench/httpconn.py) in cores, to show it was not the bottleneck, the consumers' pops a message (and how
full they came back), and for ours which worker held each producer and consumer connection (the workers
share one listening socket: a burst of connections lands as the first worker woken takes it; ``--spread``
splits them evenly instead, ``--pack`` puts them all on the first worker) and, with ``--env
QUEEN_PUSH_LANES=1``, how many pushes went through the push lanes to the tenant's owner worker. Then the
ratio ours/C++ and the verdict against the targets set for this comparison: throughput >= 1.5x, p99 no
worse, CPU per message lower, groups fair (spread p99 no worse than the C++ Queen's, or under 5 ms), 0
lost, 0 duplicated. The summary at the end
is a Markdown table (docs/guides/benchmarks-reference-shapes.md). ``--repeat N`` runs the whole list N
times (round after round, who goes first alternating) and judges and tables each row's median run: ranked
by the ratio the row is judged on, of an even N the lower middle one (a median of two runs is the worse
one, not an average no run produced); a loss or duplicate in any run fails the row.

Brokers: ours is a real ``queen serve`` (``--workers`` 2) on the embedded PostgreSQL (tuned by
broker/store/embedded.py) or QUEEN_BENCH_DATABASE_URL (a server DSN, superuser: it runs CHECKPOINT);
the C++ Queen is started from ``--cpp-bin`` (or QUEEN_BENCH_CPP_BIN; bench/cpp_queen.py, built as
bench/bench_log_shape.py's docstring says) on its own database of the same server. Without it the bench
runs ours only and says so. The two alternate phase by phase (who goes first flips every row) and
PostgreSQL checkpoints before each phase. All traffic goes to 127.0.0.1; every phase has a hard end.
``--quick``: 3 s rows, a 6 s long run, 5 s drains (a smoke run; figures from it mean little).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import random
import resource
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.httpconn import Conn, HttpError, host_port  # noqa: E402

POLL_MS = 1000  # the consumers' long poll
FAIR_MS = 5.0  # the reference's own fairness figure: 10 groups within 5 ms p99 of each other
TARGET_RATIO = 1.5
ACK_P50_MS = 1.5
SWEEP_S = 25.0  # the closing sweep's budget: the phase waits drain + 30 s past the producing window
LOST_UNVERIFIED = "?"  # marks a lost count the closing sweep did not finish checking


# The connections of the reference suite's own runs (benchmark-queen/2026-04-26/_runner): the partition
# axis (run_master.sh, hi-part-*) pushes from 5 processes x 100 connections and pops from 2 x 50; every
# other axis (bp-*, q-*, the consumer-group runs of run_cg_master.sh) from 1 x 50 and 1 x 50, each
# consumer group with 50 of its own. Closed loops: the connection count is the offered load.
REF_PARTITION_CONNS = (500, 100)
REF_CONNS = (50, 50)


@dataclass(frozen=True)
class Shape:
    name: str
    axis: str
    partitions: int = 101
    push_batch: int = 10
    groups: int = 0  # 0: queue mode (no consumer group)
    queues: int = 1
    long: bool = False
    ack: bool = False
    producers: int = REF_CONNS[0]  # producer connections (the reference's, see above)
    consumers: int = REF_CONNS[1]  # consumer connections, of each group in a groups row


SHAPES: tuple[Shape, ...] = (
    *(Shape(f"part_{n}", "partitions", partitions=n, push_batch=1, producers=REF_PARTITION_CONNS[0],
            consumers=REF_PARTITION_CONNS[1]) for n in (2, 11, 101, 1001, 10001)),
    *(Shape(f"groups_{g}", "groups", groups=g) for g in (1, 5, 10)),
    *(Shape(f"batch_{b}", "batch", push_batch=b) for b in (1, 10, 100)),
    *(Shape(f"queues_{q}", "queues", queues=q) for q in (1, 10)),
    Shape("long", "long", long=True),
    Shape("ack_single", "ack", partitions=1, push_batch=1, ack=True),
)
BY_NAME = {s.name: s for s in SHAPES}


def connections(shape: Shape, args: argparse.Namespace) -> tuple[int, int]:
    """(producer connections, consumer connections of each group) of a row: the reference suite's for
    its axis, unless ``--producers`` / ``--consumers`` / ``--group-consumers`` say otherwise."""
    producers = args.producers if args.producers is not None else shape.producers
    given = args.group_consumers if shape.groups else args.consumers
    consumers = given if given is not None else shape.consumers
    return producers, consumers if shape.groups else max(consumers, shape.queues)


# ---------------------------------------------------------------- load generator (child processes)


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def _grow(buf: bytearray | array, i: int, fill: Any = 0) -> None:  # type: ignore[type-arg]
    if i >= len(buf):
        n = max(i + 1 - len(buf), 65536)
        if isinstance(buf, bytearray):
            buf.extend(bytes(n))
        else:
            buf.extend([fill] * n)


def _queue_names(base: str, shape: Shape) -> list[str]:
    return [base] if shape.queues == 1 else [f"{base}-q{i}" for i in range(shape.queues)]


async def _worker_of(c: Conn) -> int | None:
    """Which of our broker's workers holds this connection (``worker_id`` of its /health answer; None
    for a broker that does not say, or a connection that failed): printed per row, since the workers
    share one listening socket and whichever is woken first accepts a burst of new connections."""
    try:
        st, data = await c.request("GET", "/health")
        wid = orjson.loads(data).get("worker_id") if st == 200 else None
    except (HttpError, OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return wid if isinstance(wid, int) else None


async def _pinned(host: str, port: int, want: int | None) -> Conn:
    """A connection, reopened (up to 60 times) until it sits on worker ``want`` of our broker (``--spread``);
    any connection when ``want`` is None or the broker does not say which worker answers."""
    c = Conn(host, port)
    for _ in range(60 if want is not None else 0):
        got = await _worker_of(c)
        if got is None or got == want:
            break
        c.close()
        c = Conn(host, port)
    return c


async def _produce(url: str, queues: list[str], shape: Shape, conns: int, t_start: float, t_stop: float,
                   spread: int = 0) -> dict:
    """``conns`` closed loops pushing ``shape.push_batch`` messages a request to a random partition.
    status[id]: 1 confirmed (queued), 2 failed or refused (not counted as lost if never delivered)."""
    host, port = host_port(url)
    status = bytearray()
    lat = array("d")  # (start offset, seconds) pairs
    seq = 0
    out = {"requests": 0, "errors": 0, "refused": 0, "error_sample": ""}
    workers: list[int | None] = []
    rr = 0

    async def loop(k: int) -> None:
        nonlocal seq, rr
        c = await _pinned(host, port, k % spread if spread else None)
        rnd = random.Random(k)
        while time.monotonic() < t_start:
            await asyncio.sleep(t_start - time.monotonic())
        try:
            while (s := time.monotonic()) < t_stop:
                q = queues[rr % len(queues)]
                rr += 1
                part = str(rnd.randrange(shape.partitions))
                first = seq
                seq += shape.push_batch
                items = [{"queue": q, "partition": part, "payload": {"id": i, "t": s, "m": "Hello World"}}
                         for i in range(first, first + shape.push_batch)]
                _grow(status, seq)
                try:
                    st, data = await c.request("POST", "/api/v1/push", orjson.dumps({"items": items}))
                except HttpError as exc:
                    st, data = 0, str(exc).encode()
                e = time.monotonic()
                out["requests"] += 1
                if st not in (200, 201):
                    out["errors"] += 1
                    out["error_sample"] = out["error_sample"] or f"{st} {data[:160]!r}"
                    for i in range(first, first + shape.push_batch):
                        status[i] = 2
                    await asyncio.sleep(0.01)
                    continue
                lat.append(s - t_start)
                lat.append(e - s)
                try:
                    answer = orjson.loads(data)
                except orjson.JSONDecodeError:
                    answer = None
                for j, i in enumerate(range(first, first + shape.push_batch)):
                    r = answer[j] if isinstance(answer, list) and j < len(answer) else None
                    bad = isinstance(r, dict) and r.get("status") in ("failed", "error", "duplicate")
                    status[i] = 2 if bad else 1
                    out["refused"] += bad
            workers.append(await _worker_of(c))
        finally:
            c.close()

    c0 = _cpu_self()
    await asyncio.gather(*[loop(k) for k in range(conns)])
    del status[seq:]
    return {**out, "status": bytes(status), "lat": lat.tobytes(), "cpu": _cpu_self() - c0, "workers": workers}


async def _sweep(host: str, port: int, queues: list[str], groups: list[str | None], counts: dict[Any, bytearray],
                 until: float) -> tuple[int, bool]:
    """After the consumers stopped: pop what is still there (wait=false, autoAck) until every queue answers
    empty for every group, so a message a long poll did not hand over in time is told apart from one that
    is gone: what this finds counts as delivered ("late"), what it does not find stays lost.

    Returns (late, finished). ``finished`` is False when the sweep stopped before two empty answers on
    some queue and group (``until`` passed, or a pop failed): a message it did not reach is then not
    known to be lost, and the row says so instead of calling it lost."""
    late = 0
    finished = True
    c = Conn(host, port)
    try:
        for g in groups:
            for q in queues:
                path = f"/api/v1/pop/queue/{q}?batch=100&wait=false&autoAck=true"
                if g is not None:
                    path += f"&consumerGroup={g}&subscriptionMode=all"
                empty = 0
                while empty < 2:  # twice: one empty answer may be a lease race
                    if time.monotonic() >= until:
                        finished = False
                        break
                    try:
                        st, data = await c.request("GET", path)
                    except HttpError:
                        finished = False
                        break
                    msgs = (orjson.loads(data).get("messages") or []) if st == 200 else []
                    if not msgs:
                        empty += 1
                        await asyncio.sleep(0.05)
                        continue
                    empty = 0
                    cnt = counts[g]
                    for m in msgs:
                        i = (m.get("data") or {}).get("id")
                        if isinstance(i, int):
                            _grow(cnt, i)
                            cnt[i] = min(255, cnt[i] + 1)
                            late += 1
    finally:
        c.close()
    return late, finished


async def _consume(url: str, queues: list[str], shape: Shape, conns: int, t_start: float, t_stop: float,
                   drain_s: float, lead_s: float, autopilot: bool, spread: int = 0) -> dict:
    """Per group, ``conns`` long-polling consumers (autoAck, batch 100), each on one queue (round robin).
    Every delivery is counted by id; the end-to-end latency is the delivery instant minus the send
    instant carried in the payload (the same monotonic clock: both processes run on this machine)."""
    host, port = host_port(url)
    groups: list[str | None] = [f"g{i}" for i in range(shape.groups)] if shape.groups else [None]
    counts = {g: bytearray() for g in groups}
    when = {g: array("d") for g in groups} if len(groups) > 1 else {}
    e2e = array("d")  # (delivery offset, seconds) pairs, every group
    g_lat = {g: array("d") for g in groups} if len(groups) > 1 else {}  # per group: seconds
    g_win = dict.fromkeys(groups, 0)  # per group: deliveries within the producing window
    workers: list[int | None] = []
    out = {"pops": 0, "answered": 0, "delivered": 0, "errors": 0, "in_window": 0, "error_sample": "", "drained": 0,
           "loops": len(groups) * conns}
    hard_end = t_stop + drain_s
    window_end = t_stop

    async def loop(g: str | None, k: int) -> None:
        q = queues[k % len(queues)]
        path = f"/api/v1/pop/queue/{q}?batch=100&wait=true&timeout={POLL_MS}&autoAck=true"
        if autopilot:  # what the official client sends by default: the broker may claim several partitions
            path += "&autopilot=true"
        if g is not None:
            path += f"&consumerGroup={g}&subscriptionMode=all"
        cnt = counts[g]
        w = when.get(g)
        gl = g_lat.get(g)
        c = await _pinned(host, port, (k + groups.index(g)) % spread if spread else None)
        while time.monotonic() < t_start - lead_s:
            await asyncio.sleep(t_start - lead_s - time.monotonic())
        try:
            while (now := time.monotonic()) < hard_end:
                try:
                    st, data = await c.request("GET", path)
                except HttpError as exc:
                    st, data = 0, str(exc).encode()
                e = time.monotonic()
                out["pops"] += 1
                msgs = []
                if st == 200:
                    msgs = orjson.loads(data).get("messages") or []
                elif st != 204:
                    out["errors"] += 1
                    out["error_sample"] = out["error_sample"] or f"{st} {data[:160]!r}"
                    await asyncio.sleep(0.01)
                    continue
                if not msgs:
                    if now > t_stop + 0.2:  # producers done and nothing came for a whole poll: drained
                        out["drained"] += 1
                        workers.append(await _worker_of(c))
                        return
                    continue
                out["answered"] += 1
                out["delivered"] += len(msgs)
                for m in msgs:
                    d = m.get("data") or {}
                    i = d.get("id")
                    if not isinstance(i, int):
                        continue
                    _grow(cnt, i)
                    if cnt[i] < 255:
                        cnt[i] += 1
                    if w is not None:
                        _grow(w, i, 0.0)
                        if not w[i]:
                            w[i] = e
                    e2e.append(e - t_start)
                    e2e.append(e - d["t"])
                    if gl is not None:
                        gl.append(e - d["t"])
                    if e <= window_end:
                        out["in_window"] += 1
                        g_win[g] += 1
        finally:
            c.close()

    c0 = _cpu_self()
    await asyncio.gather(*[loop(g, k) for g in groups for k in range(conns)])
    out["late"], out["swept"] = await _sweep(host, port, queues, groups, counts, time.monotonic() + SWEEP_S)
    return {**out, "counts": {g: bytes(v) for g, v in counts.items()},
            "when": {g: v.tobytes() for g, v in when.items()}, "e2e": e2e.tobytes(), "cpu": _cpu_self() - c0,
            "group_p99": {g: pct(sorted(v), 0.99) for g, v in g_lat.items()}, "group_window": g_win,
            "workers": workers}


async def _ack_loop(url: str, queue: str, t_start: float, t_stop: float) -> dict:
    """One connection, in series: push one message, pop it (batch 1, wait=false), acknowledge it alone."""
    host, port = host_port(url)
    c = Conn(host, port)
    ack_lat, push_lat = array("d"), array("d")
    counts = bytearray()
    status = bytearray()
    out = {"requests": 0, "errors": 0, "refused": 0, "error_sample": "", "pops": 0, "in_window": 0}
    i = 0
    while time.monotonic() < t_start:
        await asyncio.sleep(t_start - time.monotonic())
    c0 = _cpu_self()
    try:
        while (s := time.monotonic()) < t_stop:
            body = orjson.dumps({"items": [{"queue": queue, "partition": "0", "payload": {"id": i, "t": s}}]})
            _grow(status, i)
            st, data = await c.request("POST", "/api/v1/push", body)
            e = time.monotonic()
            out["requests"] += 1
            if st not in (200, 201):
                status[i] = 2
                out["errors"] += 1
                out["error_sample"] = out["error_sample"] or f"push {st} {data[:160]!r}"
                i += 1
                continue
            status[i] = 1
            push_lat.extend((s - t_start, e - s))
            i += 1
            st, data = await c.request("GET", f"/api/v1/pop/queue/{queue}?batch=1&wait=false")
            out["pops"] += 1
            msgs = (orjson.loads(data).get("messages") or []) if st == 200 else []
            for m in msgs:
                k = (m.get("data") or {}).get("id")
                if isinstance(k, int):
                    _grow(counts, k)
                    counts[k] = min(255, counts[k] + 1)
                    out["in_window"] += 1
                a = time.monotonic()
                st, data = await c.request("POST", "/api/v1/ack", orjson.dumps(
                    {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m.get("leaseId"), "status": "completed"}))
                b = time.monotonic()
                answer = orjson.loads(data) if st == 200 else None
                items = answer if isinstance(answer, list) else [answer]  # ours: a list; a single object too
                ok = st == 200 and not any(isinstance(x, dict) and x.get("success") is False for x in items)
                if not ok:
                    out["errors"] += 1
                    out["error_sample"] = out["error_sample"] or f"ack {st} {data[:160]!r}"
                ack_lat.extend((a - t_start, b - a))
    finally:
        c.close()
    out["late"], out["swept"] = await _sweep(host, port, [queue], [None], {None: counts}, time.monotonic() + 10)
    del status[i:]
    return {**out, "status": bytes(status), "lat": push_lat.tobytes(), "ack": ack_lat.tobytes(),
            "counts": {None: bytes(counts)}, "when": {}, "e2e": b"", "cpu": _cpu_self() - c0}


def _child(role: str, conn: Any, args: tuple) -> None:
    """A generator process: say ready, wait for the start instant, run, send the result back."""
    _uvloop()
    conn.send("ready")
    t_start = conn.recv()
    try:
        if role == "produce":
            res = asyncio.run(_produce(*args[:4], t_start, t_start + args[4], args[5]))
        elif role == "consume":
            url, queues, shape, conns, seconds, drain_s, lead_s, autopilot, spread = args
            res = asyncio.run(_consume(url, queues, shape, conns, t_start, t_start + seconds, drain_s, lead_s,
                                       autopilot, spread))
        else:
            res = asyncio.run(_ack_loop(args[0], args[1], t_start, t_start + args[2]))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent as this phase's failure
        res = {"crash": f"{type(exc).__name__}: {exc}"}
    conn.send(res)
    conn.close()


# ---------------------------------------------------------------- accounting


class Meter:
    """CPU seconds of a broker's process tree and of the PostgreSQL processes working for it: the
    backends of its database plus the server's background processes (checkpointer, WAL writer,
    autovacuum...), found as children of the postmaster; RSS of the broker's tree."""

    def __init__(self, broker_pid: int | None, db: str, postmaster: int | None) -> None:
        self.broker_pid, self.db, self.postmaster = broker_pid, db, postmaster

    def _tree(self) -> list[psutil.Process]:
        if not self.broker_pid:
            return []
        try:
            root = psutil.Process(self.broker_pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _pg_procs(self) -> list[psutil.Process]:
        if self.postmaster:
            try:
                kids = psutil.Process(self.postmaster).children()
            except psutil.NoSuchProcess:
                kids = []
        else:
            kids = list(psutil.process_iter())
        out = []
        for p in kids:
            try:
                cmd = " ".join(p.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if not cmd.startswith("postgres:"):
                continue
            # a backend reads "postgres: <user> <db> <client> <state>"; background processes don't
            # name a database (autovacuum workers do on some versions: counted only for our db)
            words = cmd.split()
            backend = len(words) >= 4 and ("(" in words[3] or "[local]" in words[3] or words[3][:1].isdigit())
            if backend:
                if words[2] == self.db:
                    out.append(p)
            elif "autovacuum worker" in cmd and len(words) > 3:  # names the database it vacuums
                if words[-1] == self.db:
                    out.append(p)
            elif self.postmaster:
                out.append(p)
        return out

    @staticmethod
    def _cpu(ps: list[psutil.Process]) -> dict[tuple[int, float], float]:
        """CPU seconds so far of each process, keyed by (pid, start time): a pid reused is another key."""
        out: dict[tuple[int, float], float] = {}
        for p in ps:
            try:
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return out

    def snap(self) -> tuple[dict[tuple[int, float], float], dict[tuple[int, float], float]]:
        """Per process CPU seconds of the broker's tree and of its PostgreSQL processes."""
        return self._cpu(self._tree()), self._cpu(self._pg_procs())

    def track(self, seen: tuple[dict[tuple[int, float], float], dict[tuple[int, float], float]]) -> None:
        """Fold a fresh snapshot into ``seen``: a process that exits later (an autovacuum worker, a
        backend closed) keeps what it had used when last seen."""
        for acc, now in zip(seen, self.snap(), strict=True):
            acc.update(now)

    @staticmethod
    def used(start: dict[tuple[int, float], float], seen: dict[tuple[int, float], float]) -> float:
        """CPU seconds used since ``start`` by the processes seen: each one's own growth (a process new
        since the start counts whole). A difference of totals went negative when a process that had
        run long before the phase exited during it (an autovacuum worker: ack_single once read
        -4,137 s of PostgreSQL CPU a million messages)."""
        return sum(cpu - start.get(key, 0.0) for key, cpu in seen.items())

    def rss_mb(self) -> float:
        s = 0
        for p in self._tree():
            try:
                s += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return s / 2**20


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(len(xs) * q))] * 1000


def pairs(raw: bytes) -> list[tuple[float, float]]:
    a = array("d")
    a.frombytes(raw)
    return list(zip(a[0::2], a[1::2], strict=True))


def thirds_p99(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """p99 (ms) of the first and last third of the samples in time order."""
    pts = sorted(pts)
    n = len(pts) // 3
    if n < 10:
        return float("nan"), float("nan")
    return pct(sorted(x for _, x in pts[:n]), 0.99), pct(sorted(x for _, x in pts[-n:]), 0.99)


@dataclass
class Row:
    shape: Shape
    broker: str
    seconds: float = 0.0
    push_rate: float = 0.0
    pop_rate: float = 0.0
    pushed: int = 0
    push_p50: float = float("nan")
    push_p99: float = float("nan")
    e2e_p50: float = float("nan")
    e2e_p99: float = float("nan")
    push_thirds: tuple[float, float] = (float("nan"), float("nan"))
    e2e_thirds: tuple[float, float] = (float("nan"), float("nan"))
    ack_p50: float = float("nan")
    ack_p99: float = float("nan")
    spread_p99: float = float("nan")
    group_rates: tuple[float, float] = (float("nan"), float("nan"))  # slowest and fastest group, msg/s
    group_p99_gap: float = float("nan")  # highest minus lowest per-group e2e p99, ms
    lost: int = 0
    sweep_cut: bool = False  # the closing sweep did not finish: ``lost`` is an upper bound, not verified
    dup: int = 0
    unconfirmed: int = 0
    phantom: int = 0
    errors: int = 0
    error_sample: str = ""
    cpu_broker: float = float("nan")  # seconds per million messages pushed
    cpu_pg: float = float("nan")
    rss_mb: float = float("nan")
    gen_cores: float = 0.0
    conns: tuple[list[int | None], list[int | None]] = ([], [])  # worker of each producer / consumer connection
    pops: int = 0  # the consumers' pop requests, every one (a long poll that came back empty included)
    answered: int = 0  # those that delivered messages
    delivered: int = 0  # the messages they delivered (every group)
    crash: str = ""
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def lost_text(self) -> str:
        """The lost count as printed: marked when the closing sweep did not finish checking it."""
        return f"{self.lost}{LOST_UNVERIFIED}" if self.lost and self.sweep_cut else str(self.lost)

    @property
    def cpu_total(self) -> float:
        return self.cpu_broker + self.cpu_pg


def check_ids(status: bytes, counts: dict[Any, bytes]) -> tuple[int, int, int, int]:
    """(lost, dup, unconfirmed, phantom) over every group: lost = confirmed and never delivered; dup =
    delivered more than once; unconfirmed = pushes that failed (never counted as lost); phantom =
    delivered though never sent."""
    lost = dup = phantom = 0
    confirmed = [i for i, s in enumerate(status) if s == 1]
    for cnt in counts.values():
        n = len(cnt)
        lost += sum(1 for i in confirmed if i >= n or cnt[i] == 0)
        dup += sum(1 for c in cnt if c > 1)
        phantom += sum(1 for i in range(len(status), n) if cnt[i])
        phantom += sum(1 for i, c in enumerate(cnt[: len(status)]) if c and status[i] == 0)
    return lost, dup, status.count(2), phantom


def spread_p99(when: dict[Any, bytes]) -> float:
    """p99 (ms) over messages delivered to every group of (latest - earliest group delivery)."""
    cols = []
    for raw in when.values():
        a = array("d")
        a.frombytes(raw)
        cols.append(a)
    if len(cols) < 2:
        return float("nan")
    n = min(len(c) for c in cols)
    spreads = []
    for i in range(n):
        ts = [c[i] for c in cols]
        if all(ts):
            spreads.append(max(ts) - min(ts))
    spreads.sort()
    return pct(spreads, 0.99)


def _split(workers: list[int | None], n: int) -> str:
    """"12/8": how many of these connections each of ``n`` workers held (by worker index); "" when
    unknown (the C++ Queen does not say)."""
    known = [w for w in workers if w is not None]
    if not known:
        return ""
    return "/".join(str(known.count(i)) for i in range(max(n, max(known) + 1)))


def analyse(shape: Shape, broker: str, seconds: float, prod: dict, cons: dict) -> Row:
    row = Row(shape, broker, seconds)
    for part in (prod, cons):
        if "crash" in part:
            row.crash += part["crash"] + " "
    if row.crash:
        return row
    status = prod["status"]
    row.pushed = status.count(1)
    row.push_rate = row.pushed / seconds
    row.pop_rate = cons["in_window"] / seconds
    lat = pairs(prod["lat"])
    xs = sorted(x for _, x in lat)
    row.push_p50, row.push_p99 = pct(xs, 0.5), pct(xs, 0.99)
    row.push_thirds = thirds_p99(lat)
    if cons["e2e"]:
        e2e = pairs(cons["e2e"])
        ys = sorted(x for _, x in e2e)
        row.e2e_p50, row.e2e_p99 = pct(ys, 0.5), pct(ys, 0.99)
        row.e2e_thirds = thirds_p99(e2e)
    if "ack" in cons:
        ack = sorted(x for _, x in pairs(cons["ack"]))
        row.ack_p50, row.ack_p99 = pct(ack, 0.5), pct(ack, 0.99)
    row.lost, row.dup, row.unconfirmed, row.phantom = check_ids(status, cons["counts"])
    if len(cons["when"]) > 1:
        row.spread_p99 = spread_p99(cons["when"])
        rates = [n / seconds for n in cons["group_window"].values()]
        row.group_rates = (min(rates), max(rates))
        p99s = list(cons["group_p99"].values())
        row.group_p99_gap = max(p99s) - min(p99s)
    row.errors = prod.get("errors", 0) + cons.get("errors", 0)
    row.error_sample = prod.get("error_sample") or cons.get("error_sample") or ""
    row.pops, row.answered, row.delivered = cons.get("pops", 0), cons.get("answered", 0), cons.get("delivered", 0)
    row.conns = (prod.get("workers") or [], (cons.get("workers") or []) if cons is not prod else [])
    row.gen_cores = (prod.get("cpu", 0.0) + (cons.get("cpu", 0.0) if cons is not prod else 0.0)) / seconds
    if cons.get("drained", 1) < cons.get("loops", 1):
        row.notes.append(f"drain cut after {cons['loops'] - cons['drained']} consumer(s) still busy: "
                         "what they had not received counts as lost")
    if row.gen_cores > 0.8:  # two generator processes: one of them may have been near a full core
        row.notes.append(f"load generator busy ({row.gen_cores:.2f} cores): it may have limited this row")
    if cons.get("late"):
        row.notes.append(f"{cons['late']} delivered only by the closing sweep")
    if not cons.get("swept", True):
        row.sweep_cut = True
        row.notes.append("closing sweep cut (out of time, or a pop failed): 'lost' counts messages it did not "
                         "reach, which may still be queued (unverified)")
    if prod.get("refused"):
        row.notes.append(f"{prod['refused']} push items refused")
    return row


# ---------------------------------------------------------------- phases


@dataclass
class Target:
    name: str
    url: str
    meter: Meter
    rows: dict[str, Row] = field(default_factory=dict)  # per row: the run the table shows (the median, --repeat)
    runs: dict[str, list[Row]] = field(default_factory=dict)  # per row: every run, in order


async def _checkpoint(server: str) -> None:
    import asyncpg

    c = await asyncpg.connect(server)
    try:
        await c.execute("CHECKPOINT")
    finally:
        await c.close()


def lane_counts(url: str) -> dict[str, float]:
    """Our broker's push-lane counters (broker/log/lanes.py) by result; {} for a broker without a scrape."""
    from loadtest import prom

    try:
        scrape = prom.scrape(url, timeout=10)
    except OSError:
        return {}
    return {r: scrape.counter("queen_push_lane_jobs_total", result=r) for r in ("forwarded", "fallback")}


def run_phase(t: Target, shape: Shape, args: argparse.Namespace, server: str, run_id: str) -> Row:
    seconds = args.long_seconds if shape.long else args.seconds
    base = f"shapes-{run_id}-{shape.name}"
    queues = _queue_names(base, shape)
    ctx = mp.get_context("spawn")
    lead = 0.5  # consumers are polling (and their groups exist) before the first push
    producers, per_group = connections(shape, args)
    if shape.ack:
        specs = [("ack", (t.url, base, seconds))]
    else:
        spread = args.our_workers if args.spread else 1 if args.pack else 0  # 1: every connection on worker 0
        specs = [("consume", (t.url, queues, shape, per_group, seconds, args.drain, lead, args.autopilot, spread)),
                 ("produce", (t.url, queues, shape, producers, seconds, spread))]
    asyncio.run(_checkpoint(server))
    lanes0 = lane_counts(t.url)
    procs, pipes = [], []
    for role, a in specs:
        here, there = ctx.Pipe()
        p = ctx.Process(target=_child, args=(role, there, a), daemon=True)
        p.start()
        procs.append(p)
        pipes.append(here)
    for here in pipes:
        if not here.poll(60):
            raise RuntimeError("a load generator process did not start within 60 s")
        here.recv()
    c0 = t.meter.snap()
    seen = ({**c0[0]}, {**c0[1]})
    w0 = time.monotonic()
    t_start = w0 + 0.2 + (lead if not shape.ack else 0.0)
    for here in pipes:
        here.send(t_start)
    results: list[dict | None] = [None] * len(pipes)
    rss = 0.0
    hard = t_start + seconds + args.drain + 30
    while any(r is None for r in results) and time.monotonic() < hard:
        rss = max(rss, t.meter.rss_mb())
        t.meter.track(seen)
        for k, here in enumerate(pipes):
            if results[k] is None and here.poll(0.5 / len(pipes)):
                results[k] = here.recv()
    wall = time.monotonic() - w0
    t.meter.track(seen)
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    got = [r if r is not None else {"crash": "load generator did not finish in time"} for r in results]
    if shape.ack:
        row = analyse(shape, t.name, seconds, got[0], got[0])
    else:
        row = analyse(shape, t.name, seconds, got[1], got[0])
    row.rss_mb = rss
    lanes1 = lane_counts(t.url)
    if lanes1 and any(lanes1.values()):  # lanes on (QUEEN_PUSH_LANES=1): how the pushes went
        d = {k: lanes1[k] - lanes0.get(k, 0.0) for k in lanes1}
        row.notes.append(f"push lanes: {d.get('forwarded', 0):,.0f} pushes handed to the tenant's owner, "
                         f"{d.get('fallback', 0):,.0f} written where they arrived (owner unavailable)")
    split = [_split(w, args.our_workers) for w in row.conns]
    if split[0] or split[1]:
        row.notes.append(f"connections per worker: producers {split[0] or '-'}, consumers {split[1] or '-'}")
    if row.pushed:
        row.cpu_broker = Meter.used(c0[0], seen[0]) / row.pushed * 1e6
        row.cpu_pg = Meter.used(c0[1], seen[1]) / row.pushed * 1e6
    if not shape.ack:
        row.notes.insert(0, f"{producers} producer / {per_group} consumer connections"
                            f"{' a group' if shape.groups else ''}")
    row.notes.append(f"phase wall {wall:.1f} s")
    return row


# ---------------------------------------------------------------- report


def f0(x: float) -> str:
    return "-" if x != x else f"{x:,.0f}"


def f1(x: float) -> str:
    return "-" if x != x else f"{x:.1f}"


def ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else float("nan")


def describe(r: Row) -> str:
    if r.crash:
        return f"FAILED: {r.crash}"
    s = (f"push {f0(r.push_rate):>7} msg/s p50/p99 {f1(r.push_p50)}/{f1(r.push_p99)} ms | pop {f0(r.pop_rate):>7} msg/s"
         f" e2e p50/p99 {f1(r.e2e_p50)}/{f1(r.e2e_p99)} ms")
    if r.shape.ack:
        s += f" | ack p50/p99 {r.ack_p50:.2f}/{r.ack_p99:.2f} ms"
    if r.shape.groups > 1:
        s += (f" | group spread p99 {f1(r.spread_p99)} ms, per-group e2e p99 gap {f1(r.group_p99_gap)} ms,"
              f" per-group msg/s {f0(r.group_rates[0])}..{f0(r.group_rates[1])}")
    if r.shape.long:
        s += (f" | p99 first/last third: push {f1(r.push_thirds[0])}/{f1(r.push_thirds[1])},"
              f" e2e {f1(r.e2e_thirds[0])}/{f1(r.e2e_thirds[1])} ms")
    s += (f" | cpu s/Mmsg broker {f0(r.cpu_broker)} pg {f0(r.cpu_pg)} | RSS {f0(r.rss_mb)} MB"
          f" | lost {r.lost_text} dup {r.dup} (checked {r.pushed:,} ids"
          f"{f', {r.unconfirmed} unconfirmed' if r.unconfirmed else ''}{f', {r.phantom} phantom' if r.phantom else ''})"
          f" | gen {r.gen_cores:.2f} cores")
    if r.pushed and r.pops and not r.shape.ack:  # what a delivery costs in requests: pops per message pushed
        s += (f" | pops {r.pops / r.pushed:.2f} a msg, {r.answered / r.pops:.0%} answered with"
              f" {r.delivered / max(r.answered, 1):.1f} msgs each")
    if r.errors:
        s += f" | {r.errors} errors, e.g. {r.error_sample}"
    if r.notes:
        s += " | " + "; ".join(r.notes)
    return s


def verdict(o: Row, c: Row | None, base_rate: float | None, others: list[str] | None = None) -> str:
    """The comparison's targets for one row; without the C++ Queen only what ours alone can show.
    ``others``: losses or duplicates of the row's other runs (--repeat), each a miss too."""
    miss: list[str] = []
    if o.crash:
        return "FAILED"
    if o.lost or o.dup or o.phantom:
        miss.append(f"lost {o.lost_text} dup {o.dup}")
    miss.extend(others or [])
    if o.shape.ack and not o.ack_p50 < ACK_P50_MS:
        miss.append(f"ack p50 {o.ack_p50:.2f} >= {ACK_P50_MS} ms")
    if c is not None and not c.crash:
        if not o.shape.ack:
            for what, a, b in (("push", o.push_rate, c.push_rate), ("pop", o.pop_rate, c.pop_rate)):
                x = ratio(a, b)
                if not x >= TARGET_RATIO:
                    miss.append(f"{what} {x:.2f}x < {TARGET_RATIO}x")
            if not o.e2e_p99 <= c.e2e_p99:
                miss.append(f"e2e p99 {f1(o.e2e_p99)} > {f1(c.e2e_p99)} ms")
        else:
            if not o.ack_p99 <= c.ack_p99:
                miss.append(f"ack p99 {o.ack_p99:.2f} > {c.ack_p99:.2f} ms")
        if not o.push_p99 <= c.push_p99:
            miss.append(f"push p99 {f1(o.push_p99)} > {f1(c.push_p99)} ms")
        if not o.cpu_total < c.cpu_total:
            miss.append(f"cpu/msg {f0(o.cpu_total)} >= {f0(c.cpu_total)}")
        if o.shape.groups > 1 and not (o.spread_p99 <= c.spread_p99 or o.spread_p99 < FAIR_MS):
            miss.append(f"spread p99 {f1(o.spread_p99)} > {f1(c.spread_p99)} ms")
    elif o.shape.groups > 1 and not o.spread_p99 < FAIR_MS:
        miss.append(f"spread p99 {f1(o.spread_p99)} >= {FAIR_MS} ms")
    if base_rate and o.shape.groups > 1:
        o.notes.append(f"producer loss vs groups_1 {1 - o.push_rate / base_rate:.0%}")
    head = "MEETS targets" if not miss else "MISSES: " + ", ".join(miss)
    return head + ("" if c is not None else " (ours only: ratios, p99 and CPU comparisons n/a)")


def table(targets: list[Target], shapes: list[Shape]) -> list[str]:
    """The closing Markdown table: one line per row, ours / C++ (ratio) where both ran."""
    ours = targets[0]
    cpp = targets[1] if len(targets) > 1 else None

    def pair(get: Any, fmt: Any, r_o: Row, r_c: Row | None, show_ratio: bool = True) -> str:
        a = get(r_o)
        if r_c is None:
            return fmt(a)
        b = get(r_c)
        return f"{fmt(a)} / {fmt(b)}" + (f" ({ratio(a, b):.2f}x)" if show_ratio else "")

    lines = ["| row | push msg/s | pop msg/s | push p50/p99 ms | e2e p99 ms | extra | cpu s/Mmsg broker+pg | RSS MB |"
             " lost/dup | gen cores | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in shapes:
        o = ours.rows.get(s.name)
        if o is None:
            continue
        c = cpp.rows.get(s.name) if cpp else None
        push_lat = f"{f1(o.push_p50)}/{f1(o.push_p99)}" + (f" / {f1(c.push_p50)}/{f1(c.push_p99)}" if c else "")
        extra = ""
        if s.ack:
            extra = f"ack p50/p99 {o.ack_p50:.2f}/{o.ack_p99:.2f}" + (f" / {c.ack_p50:.2f}/{c.ack_p99:.2f}" if c else "")
        elif s.groups > 1:
            extra = ("spread p99 " + pair(lambda r: r.spread_p99, f1, o, c, False)
                     + ", group p99 gap " + pair(lambda r: r.group_p99_gap, f1, o, c, False))
        elif s.long:
            extra = f"p99 1st/last third e2e {f1(o.e2e_thirds[0])}/{f1(o.e2e_thirds[1])}" + (
                f" / {f1(c.e2e_thirds[0])}/{f1(c.e2e_thirds[1])}" if c else "")
        runs = ours.runs.get(s.name, [])
        if len(runs) > 1:
            keys = [run_key(s, a, b) for a, b in zip(runs, cpp.runs[s.name] if cpp else [None] * len(runs), strict=True)]
            shown = next(k for k, r in enumerate(runs) if r is o)  # by identity: two runs may read alike
            extra = (extra + "; " if extra else "") + runs_text(s, keys, shown, c is not None)
        lost = f"{o.lost_text}/{o.dup}" + (f" / {c.lost_text}/{c.dup}" if c else "")
        gen = f"{o.gen_cores:.2f}" + (f" / {c.gen_cores:.2f}" if c else "")
        cpu = pair(lambda r: r.cpu_total, f0, o, c)
        lines.append(f"| {s.name} | {pair(lambda r: r.push_rate, f0, o, c)} | {pair(lambda r: r.pop_rate, f0, o, c)} | "
                     f"{push_lat} | {pair(lambda r: r.e2e_p99, f1, o, c, False)} | {extra} | {cpu} | "
                     f"{pair(lambda r: r.rss_mb, f0, o, c, False)} | {lost} | {gen} | {o.verdict} |")
    return lines


def header(server: str, cpp: Any, args: argparse.Namespace) -> str:
    import asyncpg

    async def pg() -> tuple[str, str, str, str]:
        c = await asyncpg.connect(server)
        try:
            return (await c.fetchval("SHOW server_version"), await c.fetchval("SHOW shared_buffers"),
                    await c.fetchval("SHOW max_wal_size"), await c.fetchval("SHOW synchronous_commit"))
        finally:
            await c.close()

    v, sb, wal, sc = asyncio.run(pg())
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("queen-broker")
    except PackageNotFoundError:
        ours = "?"
    cpp_v = "not run"
    if cpp is not None:
        sj = cpp.server_dir / "server.json"
        try:
            cpp_v = str(orjson.loads(sj.read_bytes()).get("version", "?")) + f" ({cpp.binary})"
        except (OSError, orjson.JSONDecodeError):
            cpp_v = str(cpp.binary)
    mem = psutil.virtual_memory().total / 2**30
    return (f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | machine {platform.node()} "
            f"{os.cpu_count()} cpus {mem:.0f} GB, {platform.platform()}, load avg {os.getloadavg()[0]:.1f} | "
            f"PostgreSQL {v} shared_buffers {sb} max_wal_size {wal} synchronous_commit {sc} | "
            f"queen-broker {ours} ({args.our_workers} workers), Python {platform.python_version()} | C++ Queen {cpp_v} ({args.workers} workers) | "
            f"rows {args.seconds:g} s, long {args.long_seconds:g} s, drain <= {args.drain:g} s, "
            f"connections {conns_text(args)}, autopilot {'on' if args.autopilot else 'off'}")


def conns_text(args: argparse.Namespace) -> str:
    """The header's account of the rows' connection counts: the reference suite's, or what was given."""
    ref = (f"partitions rows {REF_PARTITION_CONNS[0]} producer / {REF_PARTITION_CONNS[1]} consumer, other rows "
           f"{REF_CONNS[0]} / {REF_CONNS[1]} ({REF_CONNS[1]} a group): the reference suite's")
    given = [f"{what} {n}" for what, n in (("producers", args.producers), ("consumers", args.consumers),
                                           ("per group", args.group_consumers)) if n is not None]
    return ref + (f"; given: {', '.join(given)} (every row)" if given else "")


def postmaster_pid(server: str) -> int | None:
    """The PostgreSQL server's postmaster, when it runs on this machine (its background processes'
    CPU is counted); None otherwise (then only the backends found by database name)."""
    import asyncpg

    async def go() -> int:
        c = await asyncpg.connect(server)
        try:
            return int(await c.fetchval("SELECT pg_backend_pid()"))
        finally:
            await c.close()

    try:
        pid = asyncio.run(go())
        return psutil.Process(pid).ppid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        return None


def run_key(shape: Shape, o: Row, c: Row | None) -> float:
    """What ranks the repeats of a row: the ratio ours/C++ the row is judged on (the ack's p50, C++ over
    ours, for ack_single; push msg/s otherwise), or ours alone without the C++ Queen. A crashed run
    ranks lowest."""
    if o.crash or (c is not None and c.crash):
        return float("-inf")
    if shape.ack:
        return ratio(c.ack_p50, o.ack_p50) if c is not None else -o.ack_p50
    return ratio(o.push_rate, c.push_rate) if c is not None else o.push_rate


def runs_text(shape: Shape, keys: list[float], pick: int, both: bool) -> str:
    """The repeats of a row as printed and tabled: each run's ranking figure and which one is shown."""
    what = "ack p50 C++/ours" if shape.ack and both else "push ours/C++" if both else \
        "ours ack p50 ms" if shape.ack else "ours push msg/s"
    shown = ["failed" if x == float("-inf") else f"{x:.2f}x" if both else f"{-x:.2f}" if shape.ack else f"{x:,.0f}"
             for x in keys]
    return f"{len(keys)} runs, {what}: {', '.join(shown)}; the table shows run {pick + 1}"


def median_run(keys: list[float]) -> int:
    """Index of the median of ``keys``; of an even count, the lower of the two middle ones (a median of
    two runs is the worse one, never an average no run produced)."""
    order = sorted(range(len(keys)), key=lambda k: keys[k])
    return order[(len(keys) - 1) // 2]


def run_all(args: argparse.Namespace, server: str, targets: list[Target], shapes: list[Shape], head: str) -> int:
    print(head, flush=True)
    if len(targets) == 1:
        print("C++ Queen: not given (--cpp-bin / QUEEN_BENCH_CPP_BIN): ours only, no ratios", flush=True)
    run_id = os.urandom(3).hex()
    failed = 0
    reps = args.repeat
    for rep in range(reps):
        if reps > 1:
            print(f"-- run {rep + 1} of {reps}", flush=True)
        for i, shape in enumerate(shapes):
            order = targets if (i + rep) % 2 == 0 else targets[::-1]
            for t in order:
                row = run_phase(t, shape, args, server, run_id)
                t.runs.setdefault(shape.name, []).append(row)
                failed += bool(row.crash)
                print(f"  {shape.name:11s} {t.name:4s} {describe(row)}", flush=True)
            if reps == 1:
                report(targets, shape, 0)
    if reps > 1:
        print(f"-- each row: the median of {reps} runs (ranked by the ratio it is judged on; of an even "
              "count the lower middle one)", flush=True)
        for shape in shapes:
            report(targets, shape, None)
    print("", flush=True)
    print(f"<!-- {head} -->", flush=True)
    for ln in table(targets, shapes):
        print(ln, flush=True)
    return 1 if failed else 0


def report(targets: list[Target], shape: Shape, k: int | None) -> None:
    """Choose the run of ``shape`` the table shows (run ``k``, or the median of the repeats when None),
    judge it and print the ratio and the verdict. Lost or duplicated messages in ANY run fail the row."""
    ours_runs = targets[0].runs[shape.name]
    cpp_runs = targets[1].runs[shape.name] if len(targets) > 1 else [None] * len(ours_runs)
    keys = [run_key(shape, o, c) for o, c in zip(ours_runs, cpp_runs, strict=True)]
    pick = k if k is not None else median_run(keys)
    o, c = ours_runs[pick], cpp_runs[pick]
    targets[0].rows[shape.name] = o
    if c is not None:
        targets[1].rows[shape.name] = c
    base = targets[0].rows.get("groups_1")
    others = [f"run {n + 1} lost {r.lost_text} dup {r.dup}" for n, r in enumerate(ours_runs)
              if n != pick and (r.lost or r.dup or r.phantom)]
    v = verdict(o, c, base.push_rate if base and shape.groups > 1 else None, others)
    o.verdict = v
    if len(ours_runs) > 1:
        print(f"  {shape.name:11s} {runs_text(shape, keys, pick, c is not None)}", flush=True)
    if c is not None and not (o.crash or c.crash):
        if shape.groups > 1 and "groups_1" in targets[1].rows:
            c.notes.append(f"producer loss vs groups_1 {1 - c.push_rate / targets[1].rows['groups_1'].push_rate:.0%}")
        rat = (f"ack p50 {o.ack_p50:.2f} vs {c.ack_p50:.2f} ms" if shape.ack else
               f"push {ratio(o.push_rate, c.push_rate):.2f}x pop {ratio(o.pop_rate, c.pop_rate):.2f}x")
        print(f"  {shape.name:11s} ours/cpp {rat}, cpu/msg {ratio(o.cpu_total, c.cpu_total):.2f}x"
              f"{' ' + '; '.join(n for n in c.notes if n.startswith('producer')) if shape.groups > 1 else ''}",
              flush=True)
    loss = [n for n in o.notes if n.startswith("producer")]
    print(f"  {shape.name:11s} verdict: {v}{' (ours: ' + loss[0] + ')' if loss else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="queen bench shapes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, help="seconds of load per row (default 60; --quick 3)")
    ap.add_argument("--long-seconds", type=float, help="seconds of the long row (default 600; --quick 6)")
    ap.add_argument("--drain", type=float, help="at most this long to drain after the producers stop (default 30; --quick 5)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 s rows, 6 s long row, 5 s drains")
    ap.add_argument("--producers", type=int,
                    help=f"producer connections of every row (default: the reference suite's, {REF_PARTITION_CONNS[0]} "
                         f"in the partitions rows, {REF_CONNS[0]} elsewhere)")
    ap.add_argument("--consumers", type=int,
                    help=f"consumer connections of every queue-mode row (default: the reference suite's, "
                         f"{REF_PARTITION_CONNS[1]} in the partitions rows, {REF_CONNS[1]} elsewhere)")
    ap.add_argument("--group-consumers", type=int,
                    help=f"consumer connections of each group in the groups rows (default: the reference suite's "
                         f"{REF_CONNS[1]})")
    ap.add_argument("--autopilot", action="store_true",
                    help="consumers add autopilot=true to their pops, as the official client (queen-mq 2.6.0) does by "
                         "default (off: the reference suite's own requests)")
    ap.add_argument("--spread", action="store_true",
                    help="reopen each generator connection until it sits on worker k %% workers of our broker (asked "
                         "with /health): producers and each group's consumers split evenly, as many clients "
                         "connecting over time would be; by default the kernel's accept order decides (the split "
                         "is printed per row)")
    ap.add_argument("--pack", action="store_true",
                    help="reopen each generator connection until it sits on the first worker of our broker: every "
                         "producer and consumer on one worker, to set against --spread")
    ap.add_argument("--only", nargs="+", choices=list(BY_NAME), metavar="ROW", help=f"rows to run: {', '.join(BY_NAME)}")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run every row N times (the rows in turn, N rounds; who goes first alternates) and show "
                         "each row's median run: ranked by the ratio it is judged on (ours alone: by ours), of an "
                         "even N the lower middle one; a loss or duplicate in any run fails the row (default 1)")
    ap.add_argument("--workers", type=int, default=2, help="workers of each broker (default 2)")
    ap.add_argument("--our-workers", type=int,
                    help="workers of our broker alone (default: --workers); one against two on two cores shared with "
                         "PostgreSQL: docs/guides/capacity-planning.md")
    ap.add_argument("--cpp-bin", default=os.environ.get("QUEEN_BENCH_CPP_BIN"),
                    help="a built C++ Queen server/bin/queen-server (env QUEEN_BENCH_CPP_BIN); without it: ours only")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra QUEEN_* env for our broker")
    args = ap.parse_args(argv)
    args.our_workers = args.our_workers or args.workers
    args.seconds = args.seconds or (3.0 if args.quick else 60.0)
    args.long_seconds = args.long_seconds or (6.0 if args.quick else 600.0)
    args.drain = args.drain or (5.0 if args.quick else 30.0)
    if args.seconds <= 0 or args.long_seconds <= 0 or args.drain <= 0 or args.our_workers < 1 or args.workers < 1 \
            or args.repeat < 1 \
            or any(n is not None and n < 1 for n in (args.producers, args.consumers, args.group_consumers)):
        ap.error("durations and connection counts must be positive")
    if args.spread and args.pack:
        ap.error("--spread and --pack are exclusive")
    if args.cpp_bin and not Path(args.cpp_bin).is_file():
        ap.error(f"--cpp-bin: no such file {args.cpp_bin}")
    shapes = [BY_NAME[n] for n in args.only] if args.only else list(SHAPES)

    from bench.cpp_queen import CppQueen
    from bench.db import new_db, new_migrated_db
    from broker.process.localserver import LocalBroker

    server = os.environ.get("QUEEN_BENCH_DATABASE_URL") or os.environ.get("QUEEN_TEST_DATABASE_URL")
    emb: Any = None
    b: Any = None
    cpp: Any = None
    try:
        if not server:
            from broker.store import embedded

            emb = embedded.start_scratch("bench-shapes-")
            server = emb.dsn()
        pm = postmaster_pid(server)
        dsn = asyncio.run(new_migrated_db(server, "bench_shapes"))
        env = {"QUEEN_LOG_LEVEL": "WARNING", **dict(kv.split("=", 1) for kv in args.env)}
        b = LocalBroker(dsn=dsn, workers=args.our_workers, env=env,
                        log_path=Path(tempfile.gettempdir()) / f"bench_shapes_broker_{os.getpid()}.log")
        b.start()
        assert b.proc is not None
        targets = [Target("ours", b.url, Meter(b.proc.pid, urlsplit(dsn).path.lstrip("/"), pm))]
        if args.cpp_bin:
            cpp = CppQueen(args.cpp_bin, asyncio.run(new_db(server, "bench_shapes_cpp")), workers=args.workers)
            cpp.start()
            assert cpp.proc is not None
            targets.append(Target("cpp", cpp.url, Meter(cpp.proc.pid, cpp.db, pm)))
        return run_all(args, server, targets, shapes, header(server, cpp, args))
    finally:
        for running in (b, cpp, emb):
            if running is not None:
                running.stop()


if __name__ == "__main__":
    from broker.process.localserver import exit_on_sigterm

    exit_on_sigterm()  # under `timeout`: the brokers and the embedded server it started are stopped
    sys.exit(main())
