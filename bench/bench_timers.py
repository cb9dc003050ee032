"""Timer benches: schedule throughput, fire lag and burst fire rate, each beside a baseline measured in the
same run. Not part of any default run:

    .venv/bin/python bench/bench_timers.py [--duration 60] [--dsn postgresql://...] [--only NAME ...]

Scenarios (a real ``queen serve`` with 2 workers on a fresh database; lag is measured twice: from the
database, message ``created_at`` minus the timer's ``deliverAt``, and from the broker's
``queen_timers_fire_lag_seconds`` histogram, scraped before and after):

  schedule   POST /api/v1/timers in 256-op batches, 8 concurrent callers (ops/s), beside the bare SQL
             upsert of the same rows (unnest + INSERT .. ON CONFLICT) over 8 connections. Ratio = ours / raw.
  sustained  1,000 timers/s become due, evenly, for --duration seconds (scheduled over HTTP 1 s ahead in
             batches of 10 every 10 ms). Targets: p50 <= 10 ms, p99 <= 25 ms.
  instant    1,000 timers due at the same instant. Target: p99 <= 50 ms.
  burst      100,000 timers due at once, fired by the broker (timers/s), beside the raw-SQL bound: the same
             claim (SKIP LOCKED, token, lease) + queen_push + delete by key by bare SQL in batches of 1,000
             on the same schema, one statement each. Target: ours >= 70 % of raw.
  tenants    tenant A: 100,000 due at once; tenant B: 50 timers/s due steadily. Target: B's p99 < 100 ms.
  profile    where a sweep cycle's time goes (claim / pack / commit) on a 20,000-row burst, in process.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.codec import Codec  # noqa: E402
from broker.localserver import LocalBroker  # noqa: E402
from broker.store import migrate  # noqa: E402
from broker.sweeper import Sweeper, SweeperConfig  # noqa: E402

PAYLOAD = base64.b64encode(b'{"kind": "reminder", "n": 1}').decode()

# --- bench-only SQL (baselines and seeding; the broker never runs these) -------------------------------
RAW_UPSERT = """
INSERT INTO queen_timers AS t (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub,
                               deliver_at, due_at)
SELECT $1, $2, k, 'Default', x, gen_random_uuid(), $5, 'bench', now() + interval '1 hour', now() + interval '1 hour'
FROM unnest($3::text[], $4::text[]) AS u(k, x)
ON CONFLICT (tenant, queue, timer_key) DO UPDATE
   SET txn = excluded.txn, message_id = excluded.message_id, payload = excluded.payload, attempts = 0,
       last_error = NULL, deliver_at = excluded.deliver_at, due_at = excluded.due_at, updated_at = now()
"""
SEED = """
INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, producer_sub,
                          deliver_at, due_at)
SELECT $1, $2, $3 || g, 'p' || (g % 16), $3 || g, gen_random_uuid(), convert_to('{"n": ' || g || '}', 'UTF8'),
       'bench', $4::timestamptz, $4::timestamptz
FROM generate_series(1, $5::integer) AS g
"""
ENSURE_TENANT = "INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING"
RAW_CLAIM = """
WITH due AS (
    SELECT tenant, queue, timer_key FROM queen_timers
    WHERE tenant = $1 AND due_at <= now() ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE queen_timers t SET claim_token = $3, claimed_until = now() + interval '30 s', due_at = now() + interval '30 s'
FROM due WHERE t.tenant = due.tenant AND t.queue = due.queue AND t.timer_key = due.timer_key
RETURNING t.queue, t.timer_key, t.payload
"""
RAW_FIRE = """
WITH gone AS (DELETE FROM queen_timers t USING unnest($3::text[], $4::text[]) AS u(q, k)
              WHERE t.tenant = $1 AND t.queue = u.q AND t.timer_key = u.k AND t.claim_token = $2 RETURNING t.*),
agg AS (SELECT array_agg(queue COLLATE "default" ORDER BY queue, partition, deliver_at) qs,
               array_agg(partition COLLATE "default" ORDER BY queue, partition, deliver_at) ps,
               array_agg(message_id ORDER BY queue, partition, deliver_at) ids,
               array_agg(txn COLLATE "default" ORDER BY queue, partition, deliver_at) txns,
               array_agg(payload ORDER BY queue, partition, deliver_at) pls, count(*)::int n FROM gone)
SELECT count(*) FROM agg, LATERAL queen_push($1, qs, ps, ids, txns, array_fill(NULL::uuid, ARRAY[n]), pls,
       array_fill(0::smallint, ARRAY[n]), array_fill(NULL::text, ARRAY[n]), array_fill('bench'::text, ARRAY[n]),
       array_fill(NULL::bigint, ARRAY[n])) WHERE n > 0
"""
LAGS_BY_TXN = """
SELECT m.txn, extract(epoch FROM m.created_at)::float8 AS created FROM queen_messages m
JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id
WHERE m.tenant = $1 AND p.queue = $2 AND m.txn = ANY($3::text[])
"""
LAGS_SEEDED = """
SELECT extract(epoch FROM m.created_at - $3::timestamptz)::float8 AS lag FROM queen_messages m
JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id
WHERE m.tenant = $1 AND p.queue = $2
"""


# --- helpers ---------------------------------------------------------------------------------------------
def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def summary(name: str, lags: list[float]) -> str:
    return (f"{name}: n={len(lags)} p50={ms(pct(lags, 50))} p90={ms(pct(lags, 90))} p99={ms(pct(lags, 99))} "
            f"max={ms(max(lags) if lags else float('nan'))}")


def scrape_hist(url: str, name: str = "queen_timers_fire_lag_seconds") -> dict[float, float]:
    text = httpx.get(url + "/metrics/prometheus", timeout=10).text
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = out.get(float(le) if le != "+Inf" else float("inf"), 0) + float(line.split()[-1])
    return out


def hist_quantiles(before: dict[float, float], after: dict[float, float], qs=(0.5, 0.99)) -> dict[float, float]:
    les = sorted(after)
    cum = [after[le] - before.get(le, 0.0) for le in les]
    total = cum[-1] if cum else 0
    out = {}
    for q in qs:
        target, prev_le, prev_c = q * total, 0.0, 0.0
        for le, c in zip(les, cum, strict=True):
            if c >= target and total:
                span = c - prev_c
                frac = (target - prev_c) / span if span else 1.0
                out[q] = prev_le + (le - prev_le) * frac if le != float("inf") else prev_le
                break
            prev_le, prev_c = le, c
    return out


def hist_line(before: dict, after: dict) -> str:
    q = hist_quantiles(before, after)
    n = (after.get(float("inf"), 0) - before.get(float("inf"), 0))
    return f"histogram (queen_timers_fire_lag_seconds): n={n:.0f} p50~{ms(q.get(0.5, float('nan')))} p99~{ms(q.get(0.99, float('nan')))}"


async def new_db(admin_dsn: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    name = f"bench_timers_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    p = urlsplit(admin_dsn)
    dsn = urlunsplit((p.scheme, p.netloc, "/" + name, p.query, p.fragment))
    await migrate.apply_url(dsn)
    return dsn


async def wait_empty(conn: asyncpg.Connection, tenant: str, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queen_timers WHERE tenant = $1)", tenant):
            return time.perf_counter() - t0
        await asyncio.sleep(0.02)
    raise TimeoutError(f"timers of {tenant} not fired within {timeout}s")


# --- scenarios ------------------------------------------------------------------------------------------
async def bench_schedule(url: str, conn_dsn: str, batches: int = 120, conc: int = 8) -> None:
    print("\n== schedule: 256-op batches over HTTP vs bare SQL upsert ==")
    q = f"sched-{uuid.uuid4().hex[:6]}"

    async def http_worker(c: httpx.AsyncClient, w: int) -> None:
        for b in range(w, batches, conc):
            ops = [{"op": "schedule", "queue": q, "timerKey": f"k{b}-{i}", "payload": PAYLOAD, "delayMs": 3_600_000,
                    "txn": f"t{b}-{i}"} for i in range(256)]
            r = await c.post("/api/v1/timers", json={"operations": ops})
            assert r.status_code == 200, r.text

    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(http_worker(c, w) for w in range(conc)))
        ours = batches * 256 / (time.perf_counter() - t0)

    conns = [await asyncpg.connect(conn_dsn) for _ in range(conc)]
    payload = base64.b64decode(PAYLOAD)

    async def sql_worker(conn: asyncpg.Connection, w: int) -> None:
        for b in range(w, batches, conc):
            keys = [f"k{b}-{i}" for i in range(256)]
            await conn.execute(RAW_UPSERT, "default", q + "-raw", keys, [f"t{b}-{i}" for i in range(256)], payload)

    t0 = time.perf_counter()
    await asyncio.gather(*(sql_worker(c, w) for w, c in enumerate(conns)))
    raw = batches * 256 / (time.perf_counter() - t0)
    for c in conns:
        await c.execute("DELETE FROM queen_timers WHERE queue = ANY($1::text[])", [q, q + "-raw"])
        await c.close()
        break
    for c in conns[1:]:
        await c.close()
    print(f"ours (HTTP, validate + queen_timers_apply + meter): {ours:,.0f} ops/s")
    print(f"raw  (bare INSERT .. ON CONFLICT over unnest):       {raw:,.0f} ops/s")
    print(f"ratio ours/raw = {ours / raw:.2f}")


async def bench_sustained(url: str, conn: asyncpg.Connection, duration: float, rate: int = 1000) -> None:
    print(f"\n== sustained: {rate} timers/s due, evenly, for {duration:.0f} s ==")
    q = f"sus-{uuid.uuid4().hex[:6]}"
    per_tick, tick = rate // 100, 0.01
    deliver: dict[str, float] = {}
    h0 = scrape_hist(url)
    sent = 0
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=32)) as c:
        inflight: set[asyncio.Task] = set()

        async def send(batch_no: int) -> None:
            ops = [{"op": "schedule", "queue": q, "timerKey": f"k{batch_no}-{i}", "payload": PAYLOAD,
                    "delayMs": 1000 + i * (1000 // rate), "txn": f"s{batch_no}-{i}"} for i in range(per_tick)]
            r = await c.post("/api/v1/timers", json={"operations": ops})
            for res in r.json()["results"]:
                deliver[res["txn"]] = _parse_iso(res["deliverAt"])

        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < duration:
            target = start + n * tick
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.get_running_loop().create_task(send(n))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
            n += 1
            sent += per_tick
        await asyncio.gather(*inflight)
    await asyncio.sleep(2.0)
    created = {r["txn"]: r["created"] for r in await conn.fetch(LAGS_BY_TXN, "default", q, list(deliver))}
    lags = [created[t] - deliver[t] for t in created]
    print(f"scheduled {sent} over {duration:.0f} s, fired {len(created)}")
    print(summary("db lag (created_at - deliverAt)", lags))
    print(hist_line(h0, scrape_hist(url)))
    print("targets: p50 <= 10 ms, p99 <= 25 ms")


def _parse_iso(s: str) -> float:
    from datetime import datetime

    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=__import__("datetime").UTC).timestamp()


async def bench_instant(url: str, conn: asyncpg.Connection, n: int = 1000) -> None:
    print(f"\n== instant: {n} timers due at one instant ==")
    q = f"inst-{uuid.uuid4().hex[:6]}"
    await conn.execute(ENSURE_TENANT, "default")
    at = await conn.fetchval("SELECT now() + interval '1500 ms'")
    h0 = scrape_hist(url)
    await conn.execute(SEED, "default", q, "i", at, n)
    await conn.execute("SELECT pg_notify('queen_timers', '1500')")
    await asyncio.sleep(0.5)
    await wait_empty_queue(conn, q, 20)
    lags = [r["lag"] for r in await conn.fetch(LAGS_SEEDED, "default", q, at)]
    print(summary("db lag", lags))
    print(hist_line(h0, scrape_hist(url)))
    print("target: p99 <= 50 ms")


async def wait_empty_queue(conn: asyncpg.Connection, queue: str, timeout: float) -> None:
    t0 = time.perf_counter()
    while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queen_timers WHERE queue = $1)", queue):
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(queue)
        await asyncio.sleep(0.02)


async def raw_burst(dsn: str, n: int, batch: int = 1000) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(ENSURE_TENANT, "raw")
        at = await conn.fetchval("SELECT now() - interval '1 s'")
        await conn.execute(SEED, "raw", "burst", "r", at, n)
        await conn.execute("VACUUM ANALYZE queen_timers")
        t0 = time.perf_counter()
        done = 0
        while done < n:
            tok = uuid.uuid4()
            rows = await conn.fetch(RAW_CLAIM, "raw", batch, tok)
            if not rows:
                break
            done += await conn.fetchval(RAW_FIRE, "raw", tok, [r["queue"] for r in rows], [r["timer_key"] for r in rows]) or 0
        return done / (time.perf_counter() - t0)
    finally:
        await conn.close()


async def bench_burst(url: str, conn: asyncpg.Connection, raw_dsn: str, n: int = 100_000) -> None:
    print(f"\n== burst: {n:,} timers due at once ==")
    async with httpx.AsyncClient(base_url=url) as c:
        await c.post("/api/v1/admin/timers/sweeper", json={"paused": True})
        await conn.execute(ENSURE_TENANT, "burst")
        at = await conn.fetchval("SELECT now() - interval '1 s'")
        await conn.execute(SEED, "burst", "burst", "b", at, n)
        await conn.execute("VACUUM ANALYZE queen_timers")
        h0 = scrape_hist(url)
        await c.post("/api/v1/admin/timers/sweeper", json={"paused": False})
        took = await wait_empty(conn, "burst", 600)
    ours = n / took
    raw = await raw_burst(raw_dsn, n)
    print(f"ours (broker sweeper, claim + pack + fire): {ours:,.0f} timers/s ({took:.1f} s)")
    print(f"raw  (bare SQL claim + queen_push + delete): {raw:,.0f} timers/s")
    print(f"ratio ours/raw = {ours / raw:.2f} (target >= 0.70)")
    print(hist_line(h0, scrape_hist(url)))


async def bench_tenants(url: str, conn: asyncpg.Connection, n: int = 100_000, rate: int = 50) -> None:
    print(f"\n== tenants: A {n:,} due at once, B {rate}/s steady ==")
    qb = f"ten-b-{uuid.uuid4().hex[:6]}"
    deliver: dict[str, float] = {}
    await conn.execute(ENSURE_TENANT, "tenant-a")
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        at = await conn.fetchval("SELECT now() + interval '500 ms'")
        await conn.execute(SEED, "tenant-a", "burst-a", "a", at, n)
        await conn.execute("VACUUM ANALYZE queen_timers")
        start = time.perf_counter()
        i = 0
        # B schedules 300 ms ahead, one timer every 1/rate s, until A has drained (at least 5 s)
        while True:
            target = start + i / rate
            d = target - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            r = await c.post("/api/v1/timers", json={"operations": [
                {"op": "schedule", "queue": qb, "timerKey": f"b{i}", "payload": PAYLOAD, "delayMs": 300, "txn": f"b{i}"}]})
            res = r.json()["results"][0]
            deliver[res["txn"]] = _parse_iso(res["deliverAt"])
            i += 1
            if time.perf_counter() - start > 5 and i % rate == 0:
                if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queen_timers WHERE tenant = 'tenant-a')"):
                    break
            if time.perf_counter() - start > 300:
                break
        a_took = time.perf_counter() - start
    await asyncio.sleep(1.5)
    created = {r["txn"]: r["created"] for r in await conn.fetch(LAGS_BY_TXN, "default", qb, list(deliver))}
    lags = [created[t] - deliver[t] for t in created]
    a_left = await conn.fetchval("SELECT count(*) FROM queen_timers WHERE tenant = 'tenant-a'")
    print(f"A drained in ~{a_took:.1f} s (left: {a_left}); B scheduled {len(deliver)}, fired {len(created)}")
    print(summary("B db lag", lags))
    print("target: B p99 < 100 ms")


async def bench_profile(dsn: str, n: int = 20_000) -> None:
    print(f"\n== profile: one sweeper in process, {n:,} due rows, phase times per cycle ==")
    conn = await asyncpg.connect(dsn)
    await conn.execute(ENSURE_TENANT, "prof")
    at = await conn.fetchval("SELECT now() - interval '1 s'")
    await conn.execute(SEED, "prof", "prof", "p", at, n)
    await conn.execute("VACUUM ANALYZE queen_timers")
    sw = Sweeper(dsn, SweeperConfig(batch=1000), Codec(1024), name="bench-profile")
    phases = {"claim": 0.0, "pack": 0.0, "commit": 0.0}
    orig_pack, orig_commit = sw.pack, sw._commit

    def pack(rows):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        try:
            return orig_pack(rows)
        finally:
            phases["pack"] += time.perf_counter() - t

    async def commit(c, tok, p):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        try:
            return await orig_commit(c, tok, p)
        finally:
            phases["commit"] += time.perf_counter() - t

    sw.pack, sw._commit = pack, commit  # type: ignore[method-assign]
    t0 = time.perf_counter()
    cycles = 0
    while True:
        res = await sw.run_once()
        cycles += 1
        if not res.claimed:
            break
    total = time.perf_counter() - t0
    phases["claim"] = total - phases["pack"] - phases["commit"]
    print(f"{n:,} rows in {total:.2f} s = {n / total:,.0f} timers/s over {cycles} cycles")
    for k, v in phases.items():
        print(f"  {k:<7} {v:6.2f} s  {100 * v / total:5.1f} %  ({1000 * v / max(1, cycles - 1):.1f} ms/cycle)")
    await sw.stop()
    await conn.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of the sustained 1,000/s scenario")
    ap.add_argument("--dsn", help="admin DSN of a PostgreSQL to create bench databases on (default: embedded)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="scenarios: schedule sustained instant burst tenants profile")
    ap.add_argument("--burst", type=int, default=100_000)
    args = ap.parse_args()
    wanted = set(args.only or ["schedule", "sustained", "instant", "burst", "tenants", "profile"])
    emb = None
    admin = args.dsn
    if admin is None:
        from broker.store import embedded

        d = Path(tempfile.mkdtemp(prefix="bench-timers-"))
        os.chmod(d, 0o755)
        emb = embedded.start(d)
        admin = emb.dsn()
    dsn = await new_db(admin)
    raw_dsn = await new_db(admin)
    b = LocalBroker(dsn=dsn, workers=2, log_path=Path(tempfile.gettempdir()) / "bench-timers-broker.log")
    await asyncio.to_thread(b.start)
    conn = await asyncpg.connect(dsn)
    print(f"broker {b.url} (2 workers), database {dsn.rsplit('/', 1)[-1].split('?')[0]}; cpu count {os.cpu_count()}")
    try:
        if "schedule" in wanted:
            await bench_schedule(b.url, dsn)
        if "sustained" in wanted:
            await bench_sustained(b.url, conn, args.duration)
        if "instant" in wanted:
            await bench_instant(b.url, conn)
        if "burst" in wanted:
            await bench_burst(b.url, conn, raw_dsn, args.burst)
        if "tenants" in wanted:
            await bench_tenants(b.url, conn, args.burst)
        if "profile" in wanted:
            await bench_profile(await new_db(admin))
    finally:
        await conn.close()
        await asyncio.to_thread(b.stop)
        if emb is not None:
            emb.stop()


if __name__ == "__main__":
    asyncio.run(main())
