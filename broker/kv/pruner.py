"""The KV pruner: a supervised loop (``kv-pruner``) that deletes expired rows in batches of
``QUEEN_KV_PRUNE_BATCH`` every ``QUEEN_KV_PRUNE_INTERVAL_MS`` (at once again while batches come back full).

Pruning is housekeeping only: reads never depend on it, because expiry is compared with now() in SQL.
Every worker runs one; concurrent pruners do not double-count (only rows a DELETE really removed give
their bytes back to the storage gauge).
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from broker.config import Settings
from broker.metrics import KV_PRUNED
from broker.process.loops import in_batches
from broker.store.pool import Executor
from broker.store.queries import Q


async def prune_once(pool: Executor, batch: int) -> int:
    n = await pool.fetchval(Q.kv_prune, batch)
    if n:
        KV_PRUNED.inc(n)
    return int(n)


async def run(pool: Callable[[], asyncpg.Pool], s: Settings) -> None:
    """The ``kv-pruner`` loop body (started by ``broker.services``)."""
    await in_batches(
        lambda: prune_once(pool(), s.kv_prune_batch),
        s.kv_prune_batch,
        s.kv_prune_interval_ms / 1000.0,
    )
