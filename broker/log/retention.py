"""Retention of the message log: the supervised ``log-retention`` loop of every worker.

Each pass calls ``queen_log_prune(batch)`` (sql/functions/log.sql), which deletes, over
every queue with a ``retentionSeconds`` / ``completedRetentionSeconds`` option, at most
``QUEEN_LOG_RETENTION_BATCH`` messages from the heads of their partitions, one statement per queue
and batch. Workers do not collide: a queue is pruned by one worker at a time (a tried per-queue
advisory lock), and "old enough" is judged by the database clock. While a pass comes back full the
next one starts at once; otherwise the loop sleeps ``QUEEN_LOG_RETENTION_INTERVAL_MS``.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.loops import in_batches
from broker.metrics import LOG_PRUNED
from broker.store.queries import Q

log = logging.getLogger("queen.log.retention")


async def prune_once(pool: Any, batch: int) -> int:
    """One pass; returns the number of messages deleted."""
    rows = await pool.fetch(Q.log_retention_prune, batch)
    n = sum(int(r["deleted"]) for r in rows)
    if n:
        LOG_PRUNED.inc(n)
        log.debug("retention removed %d messages from %d queues", n, len(rows))
    return n


async def run(broker: Any) -> None:
    s = broker.settings
    await in_batches(
        lambda: prune_once(broker.require_pool(), s.log_retention_batch),
        s.log_retention_batch,
        s.log_retention_interval_ms / 1000.0,
    )


async def start(broker: Any) -> None:
    broker.loops.start("log-retention", lambda: run(broker))
