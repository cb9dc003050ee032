"""Usage metering (issue 6 fills this in; the interface is fixed here).

``await record(conn, tenant, messages=n)`` is called INSIDE the caller's database transaction, so a
rolled-back bundle meters nothing. Units: each pushed message 1, each schedule/reschedule op 1, a
cancel 0 (no refund), a timer fire 0 (it was billed at schedule). Counted per operation, never per call.
"""

from __future__ import annotations

import asyncpg


async def record(conn: asyncpg.Connection, tenant: str, *, messages: int = 0, kv_ops: int = 0) -> None:
    return None
