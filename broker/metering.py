"""Usage metering.

``await record(conn, tenant, messages=n, kv_ops=n)`` is called INSIDE the caller's database transaction,
so a rolled-back bundle meters nothing. One statement (``queen_meter``), adding to the tenant's row of
the current period in ``queen_usage`` (slotted per backend: concurrent writers of one tenant do not
queue on one row). Periods are ``QUEEN_PERIOD_SECONDS`` long, aligned on the Unix epoch, by the database
clock.

Units, counted per operation, never per call:

- ``messages``: each pushed message 1 (a duplicate that was not written is not counted by the log's
  caller), each timer schedule op 1 and each reschedule op 1 (the same upsert), a cancel 0 (no refund),
  a timer fire 0 (it was billed at schedule). This is the unit of the period quota.
- ``kv_ops``: each KV operation of a call that committed, read or write, 1 (a getMany is one op
  whatever its key count). A call rolled back by a lost ``required`` precondition meters nothing.
  KV ops are metered by ``queen_kv_apply`` itself (the same ``queen_meter`` function, in the same
  statement as the ops), so a KV call stays one round trip. KV ops do not count toward the period
  quota of messages (but a tenant whose quota is spent is refused KV writes too: see broker.limits).
"""

from __future__ import annotations

from typing import Any

from broker.config import Settings
from broker.store.pool import Conn, Executor
from broker.store.queries import Q

_period_s: int = Settings().period_seconds


def configure(settings: Settings) -> None:
    """Set the metering period (called once per worker, by ``broker.services.build``)."""
    global _period_s
    _period_s = int(settings.period_seconds)


def period_seconds() -> int:
    return _period_s


async def record(conn: Conn, tenant: str, *, messages: int = 0, kv_ops: int = 0) -> None:
    if messages < 0 or kv_ops < 0:
        raise ValueError("usage only grows: messages and kv_ops must be >= 0")
    if not messages and not kv_ops:
        return
    await conn.execute(Q.metering_record, tenant, _period_s, messages, kv_ops)


async def usage(pool: Executor, tenant: str | None) -> list[dict[str, Any]]:
    """Current-period usage and gauges of one tenant (always one element) or of every metered tenant."""
    rows = await pool.fetch(Q.usage_tenants, _period_s, tenant)
    return [
        {
            "tenant": r["tenant"],
            "periodStart": r["period_start"],
            "periodEnd": r["period_end"],
            "messages": r["messages"],
            "kvOps": r["kv_ops"],
            "storageBytes": r["storage_bytes"],
            "timersPending": r["timers_pending"],
        }
        for r in rows
    ]


async def period_bounds(pool: Executor) -> tuple[str, str]:
    row = await pool.fetchrow(Q.usage_period, _period_s)
    assert row is not None
    return row["period_start"], row["period_end"]
