"""Scenario ``cells_move``: a tenant moves between two cells under steady load (docs/guides/cells.md).

Two cells and HAProxy start for the run (``broker.cells.local.LocalCells``: an embedded PostgreSQL and a
``queen serve`` per cell, authentication on). The tenant lives in cell ``a``. Before the load it is given
a backlog: ``--timers`` pending timers due in an hour and ``--messages`` unconsumed messages, the state
whose copy the freeze has to wait for. Then, all through the proxy:

- producers push one message at a time to ``work`` (``--producers`` of them, no pacing: as fast as the
  cell answers), and every fifth push also schedules a timer due ``--timer-delay-ms`` later into
  ``work`` (so some fall due during the freeze);
- consumers long-poll ``work`` and acknowledge what they get;
- at ``--move-at`` seconds the tenant moves to cell ``b`` (``broker.cells.move.move``, the proxy's map
  switched over its stats socket).

A refused call (503 ``tenant_frozen``, Retry-After) is retried after a short pause; a write counts as
acknowledged only on its 2xx. After ``--duration`` s the producers stop and the consumers drain until
every acknowledged push and timer has been delivered or ``--drain`` s pass. The checks: acknowledged
writes lost (acknowledged, never delivered) 0; delivered twice 0; the backlog all in cell ``b`` and none
of the tenant's rows left in cell ``a``.

The proxy's cost is measured in the same run, before the load: ``--latency-samples`` single-message
pushes alternating between cell ``b``'s own URL and the proxy, one keep-alive connection each, so both
see the same machine at the same moment (p50/p99 of each and their difference).

    python -m loadtest.cells_move --timers 10000 --json out.json
    queen loadtest cells_move -- --timers 100000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

TENANT = "moving-tenant"
BATCH_TIMERS = 256
BATCH_MESSAGES = 1000


@dataclass
class Params:
    timers: int = 10_000
    messages: int = 0
    duration: float = 20.0
    move_at: float = 8.0
    producers: int = 4
    consumers: int = 2
    timer_delay_ms: int = 1_000
    drain: float = 30.0
    latency_samples: int = 1_000
    workers: int = 1
    base_dir: str | None = None
    dsn_a: str | None = None
    dsn_b: str | None = None


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def _b64(obj: Any) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


class Run:
    def __init__(self, p: Params, cells: Any, token: str) -> None:
        self.p = p
        self.cells = cells
        self.headers = {"Authorization": f"Bearer {token}"}
        self.acked: list[str] = []
        self.timers: list[str] = []
        self.delivered: Counter[str] = Counter()
        self.refused = 0
        self.errors: list[str] = []
        self.stop = asyncio.Event()
        self.report: dict[str, Any] = {}

    def client(self, url: str | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=url or self.cells.proxy_url, headers=self.headers, timeout=60.0)

    async def backlog(self) -> dict[str, float]:
        """The state the move has to carry: pending far timers and unconsumed messages."""
        out: dict[str, float] = {}
        async with self.client() as c:
            t0 = time.monotonic()
            for start in range(0, self.p.timers, BATCH_TIMERS):
                ops = [{"op": "schedule", "queue": "backlog-timers", "timerKey": f"k{i}", "delayMs": 3_600_000,
                        "txn": f"bt{i}", "partition": f"p{i % 16}", "payload": _b64({"i": i})}
                       for i in range(start, min(self.p.timers, start + BATCH_TIMERS))]
                r = await c.post("/api/v1/timers", json={"operations": ops})
                r.raise_for_status()
            out["timers_s"] = time.monotonic() - t0
            t0 = time.monotonic()
            for start in range(0, self.p.messages, BATCH_MESSAGES):
                items = [{"queue": "backlog-messages", "partition": f"p{i % 16}", "payload": {"i": i}, "transactionId": f"bm{i}"}
                         for i in range(start, min(self.p.messages, start + BATCH_MESSAGES))]
                r = await c.post("/api/v1/push", json={"items": items})
                r.raise_for_status()
            out["messages_s"] = time.monotonic() - t0
        return out

    async def latency(self) -> dict[str, Any]:
        """The proxy's cost: requests alternating between cell b's own URL and the proxy (one keep-alive
        connection each), for two calls: ``whoami`` (authentication only, no database work: the proxy's
        hop alone) and a single-message push (a write as a client sees it)."""
        out: dict[str, Any] = {}
        async with self.client(self.cells.url("b")) as d, self.client() as v:
            for call in ("whoami", "push"):
                direct: list[float] = []
                proxied: list[float] = []
                for i in range(self.p.latency_samples):
                    for c, sink in ((d, direct), (v, proxied)) if i % 2 == 0 else ((v, proxied), (d, direct)):
                        t0 = time.perf_counter()
                        if call == "whoami":
                            r = await c.get("/api/v1/whoami")
                        else:
                            r = await c.post("/api/v1/push", json={"items": [{"queue": "lat", "payload": {"i": i},
                                                                              "transactionId": uuid.uuid4().hex}]})
                        sink.append((time.perf_counter() - t0) * 1000)
                        r.raise_for_status()
                row: dict[str, Any] = {}
                for name, xs in (("direct", direct), ("proxy", proxied)):
                    row[name] = {"p50_ms": round(_pct(xs, 50) or 0, 3), "p99_ms": round(_pct(xs, 99) or 0, 3), "n": len(xs)}
                row["added"] = {k: round(row["proxy"][k] - row["direct"][k], 3) for k in ("p50_ms", "p99_ms")}
                out[call] = row
        return out

    async def producer(self, n: int) -> None:
        async with self.client() as c:
            i = 0
            while not self.stop.is_set():
                txn = f"w{n}-{i}"
                r = await c.post("/api/v1/push", json={"items": [{"queue": "work", "payload": {"t": txn}, "transactionId": txn}]})
                if r.status_code in (200, 201):
                    self.acked.append(txn)
                    i += 1
                    if i % 5 == 0:
                        await self.timer(c)
                elif r.status_code == 503:
                    self.refused += 1
                    await asyncio.sleep(0.02)
                else:
                    self.errors.append(f"push {r.status_code} {r.text[:200]}")

    async def timer(self, c: httpx.AsyncClient) -> None:
        t = uuid.uuid4().hex
        while True:
            r = await c.post("/api/v1/timers", json={"operations": [{"op": "schedule", "queue": "work", "timerKey": t,
                                                                      "delayMs": self.p.timer_delay_ms, "txn": t,
                                                                      "payload": _b64({"t": t})}]})
            if r.status_code == 200:
                if r.json()["results"][0]["status"] == "scheduled":
                    self.timers.append(t)
                else:
                    self.errors.append(f"timer {r.text[:200]}")
                return
            if r.status_code != 503:
                self.errors.append(f"timer {r.status_code} {r.text[:200]}")
                return
            self.refused += 1
            await asyncio.sleep(0.02)

    async def consumer(self) -> None:
        async with self.client() as c:
            while True:
                if self.stop.is_set() and (set(self.acked) | set(self.timers)) <= set(self.delivered):
                    return
                r = await c.get("/api/v1/pop/queue/work", params={"batch": "100", "wait": "true", "timeout": "500"})
                if r.status_code == 503:
                    self.refused += 1
                    await asyncio.sleep(0.02)
                    continue
                if r.status_code == 204:
                    continue
                if r.status_code != 200:
                    self.errors.append(f"pop {r.status_code} {r.text[:200]}")
                    continue
                msgs = [m for m in r.json()["messages"] if m]
                for m in msgs:
                    self.delivered[m["transactionId"]] += 1
                body = {"acknowledgments": [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                             "leaseId": m["leaseId"], "status": "completed"} for m in msgs]}
                while (a := await c.post("/api/v1/ack/batch", json=body)).status_code == 503:
                    self.refused += 1
                    await asyncio.sleep(0.02)
                if a.status_code != 200:
                    self.errors.append(f"ack {a.status_code} {a.text[:200]}")

    async def mover(self) -> None:
        from broker.cells.move import Proxy, move

        await asyncio.sleep(self.p.move_at)
        # on its own thread and event loop: the freeze window is not stretched by the load's own tasks
        rep = await asyncio.to_thread(asyncio.run, move(TENANT, self.cells.dsn("a"), self.cells.dsn("b"),
                                                        proxy=Proxy(self.cells.socket_path, self.cells.map_path, "b"),
                                                        target_name="b"))
        self.report = rep.as_dict()

    async def load(self) -> None:
        tasks = [asyncio.create_task(self.producer(n)) for n in range(self.p.producers)]
        consumers = [asyncio.create_task(self.consumer()) for _ in range(self.p.consumers)]
        mover = asyncio.create_task(self.mover())
        await asyncio.sleep(self.p.duration)
        await mover  # the move finishes before the load stops (a long copy stretches the run)
        self.stop.set()
        await asyncio.gather(*tasks)
        try:
            await asyncio.wait_for(asyncio.gather(*consumers), self.p.drain)
        except TimeoutError:
            for t in consumers:
                t.cancel()


def census(dsn: str) -> dict[str, int]:
    import asyncpg

    async def go() -> dict[str, int]:
        conn = await asyncpg.connect(dsn)
        try:
            return {r["tbl"]: int(r["n"]) for r in await conn.fetch("SELECT tbl, n FROM queen_cells_census($1)", TENANT) if r["n"]}
        finally:
            await conn.close()

    return asyncio.run(go())


def run(p: Params) -> dict[str, Any]:
    from broker.auth import mint
    from broker.cells.local import LocalCells

    base = Path(p.base_dir or tempfile.mkdtemp(prefix="queen-cells-move-"))
    dsns = {k: v for k, v in (("a", p.dsn_a), ("b", p.dsn_b)) if v}
    cells = LocalCells(base, workers=p.workers, mapping={TENANT: "a", "lat-b": "b"}, dsns=dsns)
    cells.start()
    try:
        token = mint(tenant=TENANT, sub="load", grants=["produce", "consume"], secret=cells.secret)
        lat_token = mint(tenant="lat-b", sub="load", grants=["produce", "consume"], secret=cells.secret)
        r = Run(p, cells, token)
        latency = asyncio.run(Run(p, cells, lat_token).latency())
        backlog_s = asyncio.run(r.backlog())
        before = census(cells.dsn("a"))
        t0 = time.monotonic()
        asyncio.run(r.load())
        wall = time.monotonic() - t0
        after_a, after_b = census(cells.dsn("a")), census(cells.dsn("b"))
    finally:
        cells.stop()
        if p.base_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    acked = set(r.acked) | set(r.timers)
    lost = sorted(acked - set(r.delivered))
    twice = sorted(t for t, n in r.delivered.items() if n > 1)
    result = {
        "scenario": "cells_move",
        "params": asdict(p),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)},
        "backlog": {"timers": p.timers, "messages": p.messages, "load_s": {k: round(v, 2) for k, v in backlog_s.items()},
                    "rows_in_source_before": before},
        "move": r.report,
        "freeze_ms": round(r.report.get("freeze_s", 0) * 1000, 1),
        "load": {"wall_s": round(wall, 2), "pushes_acked": len(r.acked), "timers_acked": len(r.timers),
                 "refused_503": r.refused, "delivered": sum(r.delivered.values()), "errors": r.errors[:10]},
        "lost": len(lost), "lost_sample": lost[:5],
        "delivered_twice": len(twice), "twice_sample": twice[:5],
        "source_rows_after": after_a,
        "backlog_in_target": {"timers": after_b.get("queen_timers", 0), "messages": after_b.get("queen_messages", 0)},
        "proxy_latency": latency,
    }
    result["ok"] = (not lost and not twice and not after_a and not r.errors
                    and after_b.get("queen_timers", 0) >= p.timers and after_b.get("queen_messages", 0) >= p.messages)
    return result


def table(res: dict[str, Any]) -> str:
    lat = res["proxy_latency"]
    rows = [
        ("backlog moved", f"{res['backlog']['timers']} timers, {res['backlog']['messages']} messages"),
        ("rows copied", str(res["move"].get("rows_total"))),
        ("freeze window", f"{res['freeze_ms']} ms (copy {res['move'].get('copy_s')} s, map switch {res['move'].get('switch_s')} s)"),
        ("pushes / timers acknowledged", f"{res['load']['pushes_acked']} / {res['load']['timers_acked']}"),
        ("calls refused 503 (retried)", str(res["load"]["refused_503"])),
        ("acknowledged writes lost", str(res["lost"])),
        ("delivered twice", str(res["delivered_twice"])),
        ("rows left in the source", str(sum(res["source_rows_after"].values()))),
    ]
    for call in ("whoami", "push"):
        x = lat[call]
        rows += [(f"{call} direct p50/p99", f"{x['direct']['p50_ms']} / {x['direct']['p99_ms']} ms"),
                 (f"{call} via proxy p50/p99", f"{x['proxy']['p50_ms']} / {x['proxy']['p99_ms']} ms"),
                 (f"{call}: added by the proxy p50/p99", f"{x['added']['p50_ms']} / {x['added']['p99_ms']} ms")]
    w = max(len(k) for k, _ in rows)
    lines = [f"{k:<{w}}  {v}" for k, v in rows]
    lines.append(f"machine: {res['machine']['cpus']} CPUs, load average {res['machine']['loadavg_1m']} "
                 "(a shared machine: figures are provisional)")
    lines.append("verdict: " + ("PASS" if res["ok"] else "FAIL"))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.cells_move", description=__doc__.split("\n\n")[0])
    d = Params()
    ap.add_argument("--timers", type=int, default=d.timers, help="pending timers (due in an hour) the tenant holds")
    ap.add_argument("--messages", type=int, default=d.messages, help="unconsumed messages the tenant holds")
    ap.add_argument("--duration", type=float, default=d.duration, help="seconds of steady load")
    ap.add_argument("--move-at", type=float, default=d.move_at, help="seconds into the load when the move starts")
    ap.add_argument("--producers", type=int, default=d.producers)
    ap.add_argument("--consumers", type=int, default=d.consumers)
    ap.add_argument("--timer-delay-ms", type=int, default=d.timer_delay_ms)
    ap.add_argument("--drain", type=float, default=d.drain, help="longest wait for the consumers to catch up (s)")
    ap.add_argument("--latency-samples", type=int, default=d.latency_samples)
    ap.add_argument("--workers", type=int, default=d.workers, help="broker workers per cell")
    ap.add_argument("--dir", dest="base_dir", help="keep the cells' data and logs here (default: a temporary directory)")
    ap.add_argument("--dsn-a", help="cell a's database (default: an embedded PostgreSQL of its own)")
    ap.add_argument("--dsn-b", help="cell b's database (default: an embedded PostgreSQL of its own)")
    ap.add_argument("--json", default="", help="write the result as JSON here")
    return ap


def params_from(ns: argparse.Namespace) -> Params:
    return Params(timers=ns.timers, messages=ns.messages, duration=ns.duration, move_at=ns.move_at, producers=ns.producers,
                  consumers=ns.consumers, timer_delay_ms=ns.timer_delay_ms, drain=ns.drain,
                  latency_samples=ns.latency_samples, workers=ns.workers, base_dir=ns.base_dir,
                  dsn_a=ns.dsn_a, dsn_b=ns.dsn_b)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.move_at >= ns.duration:
        print("cells_move: --move-at must fall inside --duration", file=sys.stderr)
        return 2
    result = run(params_from(ns))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
