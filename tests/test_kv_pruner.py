"""Expiry after pruning: the kv-pruner loop removes expired rows in batches and gives their bytes back;
reads answer the same before and after it ran (expiry is judged in SQL, never by the pruner)."""

from __future__ import annotations

import time

import httpx
from conftest import uniq
from helpers import db_fetch


def count_rows(dsn, ns):
    return db_fetch(dsn, "SELECT count(*) AS n FROM queen_kv WHERE ns = $1", ns)[0]["n"]


def test_pruner_removes_expired_rows_in_batches(start_broker):
    b = start_broker(env={"QUEEN_KV_PRUNE_INTERVAL_MS": "100", "QUEEN_KV_PRUNE_BATCH": "7"})
    ns = uniq("pr")
    with httpx.Client(base_url=b.url, timeout=30) as c:
        ops = [{"op": "put", "ns": ns, "key": f"e{i:02d}", "value": "x" * 100, "ttlSeconds": 1} for i in range(20)]
        ops.append({"op": "put", "ns": ns, "key": "keep", "value": 1, "forever": True})
        assert c.post("/api/v1/kv", json={"operations": ops}).status_code == 200
        storage = c.get("/api/v1/usage").json()["storageBytes"]
        before = c.post("/api/v1/kv", json={"operations": [{"op": "getPrefix", "ns": ns, "prefix": "e"}]}).json()
        assert len(before["results"][0]["rows"]) == 20
        deadline = time.monotonic() + 10
        while count_rows(b.dsn, ns) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert count_rows(b.dsn, ns) == 1  # 20 rows, batches of 7: the loop went on until done
        res = c.post("/api/v1/kv", json={"operations": [
            {"op": "getPrefix", "ns": ns, "prefix": "e"}, {"op": "get", "ns": ns, "key": "e00"},
            {"op": "get", "ns": ns, "key": "keep"}]}).json()["results"]
        assert res[0]["rows"] == [] and res[1]["found"] is False and res[2]["found"] is True
        freed = storage - c.get("/api/v1/usage").json()["storageBytes"]
        assert freed == 20 * (3 + 102)
        metrics = c.get("/metrics").text
        assert "queen_kv_pruned_total" in metrics
