"""A lock's acquire + release, one pair at a time, against bare SQL doing the least a lock on a KV row can.

Baseline: two statements on one asyncpg connection: an upsert that takes the permit row when it is absent
or expired (a new version from the KV's sequence) and a DELETE at that version (``bench/sql/locks.sql``):
no per-name serialisation, no key lock, no slot search, no metering or storage gauge.
Ours, in two groups against that same baseline:

- ``(SQL)``: ``queen_locks_apply`` called for the acquire and for the release on the same kind of
  connection: what the function adds (the name and key locks, the slot search, meter and gauge);
- ``(HTTP)``: ``POST /api/v1/locks`` acquire then release on a real ``queen serve`` (2 workers): the whole
  route (parse, admission, the function, rendering) plus the HTTP hop.

Each pair uses a fresh lock name; every test has its own database.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import asyncpg
import httpx
import pytest

from broker import metering
from broker.store.queries import Q
from broker.store.queries import parse as parse_queries

ROUNDS = 300
SQL = parse_queries((Path(__file__).parent / "sql" / "locks.sql").read_text())
GROUPS = ("lock acquire + release (SQL)", "lock acquire + release (HTTP)")
_seq = itertools.count()


async def _connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


def _name() -> str:
    return f"bench-{next(_seq)}"


@pytest.mark.parametrize("group", GROUPS)
def test_bare_sql_baseline(benchmark, bench_pg, loop, group):  # type: ignore[no-untyped-def]
    benchmark.group = group
    benchmark.extra_info["role"] = "baseline"
    conn = loop.run_until_complete(_connect(bench_pg.new_db()))
    released: list[str] = []
    try:
        async def pair() -> None:
            key = f"{_name()}#0"
            version = await conn.fetchval(SQL["bare_acquire"], "acme", key, {"owner": "o"})
            released.append(await conn.execute(SQL["bare_release"], "acme", key, version))

        benchmark.pedantic(lambda: loop.run_until_complete(pair()), rounds=ROUNDS, iterations=1)
        assert released and all(r == "DELETE 1" for r in released)
    finally:
        loop.run_until_complete(conn.close())


def test_locks_apply_sql(benchmark, bench_pg, loop):  # type: ignore[no-untyped-def]
    benchmark.group = GROUPS[0]
    benchmark.extra_info["role"] = "ours"
    conn = loop.run_until_complete(_connect(bench_pg.new_db()))
    period = metering.period_seconds()
    released: list[bool] = []
    try:
        async def pair() -> None:
            name = _name()
            got = await conn.fetchval(Q.locks_apply, "acme", [{"op": "acquire", "name": name, "ttl": 30, "owner": "o",
                                                                "limit": 1}], period)
            token = got["results"][0]["token"]
            out = await conn.fetchval(Q.locks_apply, "acme", [{"op": "release", "name": name, "token": token,
                                                                "slot": 0}], period)
            released.append(out["results"][0]["released"])

        benchmark.pedantic(lambda: loop.run_until_complete(pair()), rounds=ROUNDS, iterations=1)
        assert released and all(released)
    finally:
        loop.run_until_complete(conn.close())


def test_locks_route_http(benchmark, bench_broker, loop):  # type: ignore[no-untyped-def]
    benchmark.group = GROUPS[1]
    benchmark.extra_info["role"] = "ours"
    client = httpx.AsyncClient(base_url=bench_broker.url, timeout=30)
    released: list[bool] = []
    try:
        async def pair() -> None:
            name = _name()
            r = await client.post("/api/v1/locks", json={"operations": [
                {"op": "acquire", "name": name, "ttlSeconds": 30, "owner": "o"}]})
            token = r.json()["results"][0]["token"]
            r = await client.post("/api/v1/locks", json={"operations": [
                {"op": "release", "name": name, "token": token, "slot": 0}]})
            released.append(r.json()["results"][0]["released"])

        benchmark.pedantic(lambda: loop.run_until_complete(pair()), rounds=ROUNDS, iterations=1)
        assert released and all(released)
    finally:
        loop.run_until_complete(client.aclose())
