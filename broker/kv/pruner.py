"""The KV pruner: a supervised loop (``kv-pruner``) that deletes expired rows in batches of
``QUEEN_KV_PRUNE_BATCH`` every ``QUEEN_KV_PRUNE_INTERVAL_MS`` (at once again while batches come back full).

Pruning is housekeeping only: reads never depend on it, because expiry is compared with now() in SQL.
Every worker runs one; concurrent pruners do not double-count (only rows a DELETE really removed give
their bytes back to the storage gauge).
"""

from __future__ import annotations

from typing import Any

from broker.loops import in_batches
from broker.metrics import KV_PRUNED
from broker.store.queries import Q


async def prune_once(pool: Any, batch: int) -> int:
    n = await pool.fetchval(Q.kv_prune, batch)
    if n:
        KV_PRUNED.inc(n)
    return int(n)


async def run(broker: Any) -> None:
    s = broker.settings
    await in_batches(
        lambda: prune_once(broker.require_pool(), s.kv_prune_batch),
        s.kv_prune_batch,
        s.kv_prune_interval_ms / 1000.0,
    )


async def start(broker: Any) -> None:
    broker.loops.start("kv-pruner", lambda: run(broker))
