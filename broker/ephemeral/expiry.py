"""The ephemeral queues' expiry: a supervised loop (``ephemeral-expiry``) that drops expired messages in
batches of ``EXPIRY_BATCH`` every ``QUEEN_EPHEMERAL_EXPIRY_INTERVAL_MS`` (at once again while batches come
back full), forgetting on the way implicit queues empty and idle for ``QUEEN_EPHEMERAL_IDLE_S``."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from broker.config import Settings
from broker.metrics import EPHEMERAL_MESSAGES
from broker.process.loops import in_batches
from broker.store.pool import Executor
from broker.store.queries import Q

EXPIRY_BATCH = 10_000


async def expire_once(pool: Executor, idle_s: int) -> int:
    """One pass: how many expired messages went."""
    n = int(await pool.fetchval(Q.eph_sweep, EXPIRY_BATCH, idle_s))
    if n:
        EPHEMERAL_MESSAGES.labels("expired").inc(n)
    return n


async def run(pool: Callable[[], asyncpg.Pool], s: Settings) -> None:
    """The ``ephemeral-expiry`` loop body (started by ``broker.services``)."""
    await in_batches(lambda: expire_once(pool(), s.ephemeral_idle_s), EXPIRY_BATCH,
                     s.ephemeral_expiry_interval_ms / 1000.0)
