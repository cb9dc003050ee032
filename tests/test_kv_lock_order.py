"""KV calls that write the same keys in opposite orders never deadlock: a call takes
its keys' locks in one global order before touching a row, so neither waits on the other in a cycle."""

from __future__ import annotations

import asyncio

import httpx
from conftest import uniq

KEYS = 40
ROUNDS = 30


async def test_opposite_orders_do_not_deadlock(broker):
    ns = "lockorder"
    base = uniq("k")
    keys = [f"{base}-{i:03d}" for i in range(KEYS)]

    def call(order: list[str], tag: int) -> dict:
        return {"operations": [{"op": "put", "ns": ns, "key": k, "value": tag, "forever": True} for k in order]
                + [{"op": "incr", "ns": ns, "key": f"{base}-count", "delta": 1, "forever": True}]}

    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as c:
        async def one(order: list[str], tag: int) -> None:
            r = await c.post("/api/v1/kv", json=call(order, tag))
            statuses.append(r.status_code)
            assert r.status_code == 200, r.text

        for n in range(ROUNDS):
            await asyncio.gather(one(keys, n), one(keys[::-1], -n), one(keys[KEYS // 2:] + keys[:KEYS // 2], n))
        r = await c.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": ns, "key": f"{base}-count"}]})
        assert r.json()["results"][0]["value"] == 3 * ROUNDS
    assert statuses == [200] * (3 * ROUNDS)
