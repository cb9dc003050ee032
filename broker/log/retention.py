"""Retention of the message log: the supervised ``log-retention`` loop of every worker.

Each pass calls ``queen_log_prune(batch)`` (broker/sql/functions/log.sql), which deletes, over
every queue with a ``retentionSeconds`` / ``completedRetentionSeconds`` option, at most
``QUEEN_LOG_RETENTION_BATCH`` messages from the heads of their partitions, one statement per queue
and batch. Workers do not collide: a queue is pruned by one worker at a time (a tried per-queue
advisory lock), and "old enough" is judged by the database clock. While a pass comes back full the
next one starts at once; otherwise the loop sleeps ``QUEEN_LOG_RETENTION_INTERVAL_MS``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import asyncpg

from broker.config import Settings
from broker.metrics import LOG_PRUNED
from broker.process.loops import in_batches
from broker.store.pool import Executor
from broker.store.queries import Q

log = logging.getLogger("queen.log.retention")


async def prune_once(pool: Executor, batch: int) -> int:
    """One pass; returns the number of messages deleted."""
    rows = await pool.fetch(Q.log_retention_prune, batch)
    n = sum(int(r["deleted"]) for r in rows)
    if n:
        LOG_PRUNED.inc(n)
        log.debug("retention removed %d messages from %d queues", n, len(rows))
    return n


async def run(pool: Callable[[], asyncpg.Pool], s: Settings) -> None:
    """The ``log-retention`` loop body (started by ``broker.services``)."""
    await in_batches(
        lambda: prune_once(pool(), s.log_retention_batch),
        s.log_retention_batch,
        s.log_retention_interval_ms / 1000.0,
    )
