"""``queen tenant move TENANT --from DSN --to DSN``: move one tenant between cells.

``--from`` and ``--to`` are the PostgreSQL DSNs of the two cells' databases: a cell's state lives only
there (its brokers are stateless), and the freeze is a row the database itself enforces. The role must
be allowed to ``SET session_replication_role`` (a superuser, or PostgreSQL 15's ``GRANT SET``): the copy
and the clean-up run with it so the guard and the gauge triggers stay out of the way.

The steps, each a transaction (docs/guides/cells.md, "Moving a tenant"):

1. check: both cells run the same schema; the target holds nothing of the tenant;
2. the target marks the tenant ``moving_in`` (its writes there are refused until step 6);
3. **freeze** in the source: under ``LOCK queen_tenant_freeze IN ACCESS EXCLUSIVE MODE`` (waits for
   every transaction that has written to end) the tenant's row ``moving_out`` commits. From then on
   every write of the tenant in the source rolls back inside PostgreSQL (SQLSTATE 57Q01 -> 503
   ``tenant_frozen`` with Retry-After), the sweeper leaves its timers alone;
4. **copy**: one REPEATABLE READ snapshot of the source, every guarded table's rows of the tenant
   (binary COPY, all columns: queues and their options, partitions with their next offsets, messages,
   log floors, groups, cursors with their leases, per-message state, DLQ, timers with their due
   instants and keys, KV with versions, plans, switches, usage, gauges, rate buckets, traces, ephemeral
   queues, streams) into the target in one transaction, whose row counts must equal the snapshot's
   before it commits; the target's sequences are raised to the source's (ids are never reused);
5. **switch** the proxy's map through HAProxy's runtime API (``set map`` over the stats socket, no
   reload) and its file;
6. **resume** in the target: the ``moving_in`` row goes, sweepers and limits caches are woken;
7. **clean** the source: every row of the tenant is deleted and its freeze row says ``moved`` (a late
   request that still reaches the source is told to retry, and the proxy now sends it to the target);
   its long polls still waiting there are woken, so they answer 503 at once instead of at their timeout.

A failure before step 5 undoes the move (the target forgets what it got, both freeze rows go): the
tenant stays in the source. The freeze window (step 3 to 6) is measured and reported.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from broker.cells import haproxy
from broker.store.pool import connect
from broker.store.queries import Q

# While the freeze waits for the writers in flight, every new writer of the cell queues behind it: keep
# each wait short and try again rather than stall the whole cell.
LOCK_TIMEOUT_MS = 500
FREEZE_ATTEMPTS = 10


class MoveError(RuntimeError):
    pass


@dataclass
class Proxy:
    socket_path: Path
    map_path: Path
    cell: str  # the target cell's name in the map


@dataclass
class MoveReport:
    tenant: str
    rows: dict[str, int] = field(default_factory=dict)
    freeze_s: float = 0.0  # source frozen -> target open
    copy_s: float = 0.0
    switch_s: float = 0.0
    total_s: float = 0.0
    proxy_switched: bool = False
    frozen_at: float = 0.0  # Unix time the source froze (committed) ...
    resumed_at: float = 0.0  # ... and the target opened

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "rows": self.rows, "rows_total": sum(self.rows.values()),
                "freeze_s": round(self.freeze_s, 4), "copy_s": round(self.copy_s, 4),
                "switch_s": round(self.switch_s, 4), "total_s": round(self.total_s, 4),
                "proxy_switched": self.proxy_switched, "frozen_at": self.frozen_at, "resumed_at": self.resumed_at}


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _census(conn: asyncpg.Connection, tenant: str) -> dict[str, int]:
    return {r["tbl"]: int(r["n"]) for r in await conn.fetch(Q.cells_census, tenant)}


async def _freeze_source(conn: asyncpg.Connection, tenant: str, peer: str, retry_after_s: int) -> None:
    """Step 3: the freeze commits once every writer in flight has ended (bounded waits, retried)."""
    for attempt in range(FREEZE_ATTEMPTS):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                await conn.execute(Q.cells_freeze_lock)
                await conn.execute(Q.cells_freeze_set, tenant, "moving_out", peer, retry_after_s)
            return
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError):
            if attempt == FREEZE_ATTEMPTS - 1:
                raise MoveError(f"could not freeze {tenant!r}: writers held the cell for {FREEZE_ATTEMPTS} x "
                                f"{LOCK_TIMEOUT_MS} ms") from None
            await asyncio.sleep(0.1)


async def _copy(src: asyncpg.Connection, dst: asyncpg.Connection, tenant: str, tables: list[str]) -> dict[str, int]:
    """Step 4: the tenant's rows of every table, from one snapshot, in one target transaction."""
    async with src.transaction(isolation="repeatable_read", readonly=True):
        want = await _census(src, tenant)
        seqs = await src.fetch(Q.cells_sequences)
        async with dst.transaction():
            await dst.execute("SET LOCAL session_replication_role = replica")
            for table in tables:
                if not want.get(table):
                    continue
                cols = [r["col"] for r in await src.fetch(Q.cells_columns, table)]
                have = {r["col"] for r in await dst.fetch(Q.cells_columns, table)}
                if set(cols) != have:
                    raise MoveError(f"{table}: the cells' columns differ ({sorted(set(cols) ^ have)})")
                collist = ", ".join(_ident(c) for c in cols)
                with tempfile.TemporaryFile() as buf:
                    await src.copy_from_query(f"SELECT {collist} FROM {_ident(table)} WHERE tenant = $1",
                                              tenant, output=buf, format="binary")
                    buf.seek(0)
                    await dst.copy_to_table(table, source=buf, columns=cols, format="binary")
            got = await _census(dst, tenant)
            if got != want:
                diff = {t: (want.get(t), got.get(t)) for t in set(want) | set(got) if want.get(t) != got.get(t)}
                raise MoveError(f"the copy does not match the source's snapshot (source, target): {diff}")
            for s in seqs:
                await dst.execute(Q.cells_sequence_raise, s["name"], int(s["last_value"]))
    return {t: n for t, n in want.items() if n}


async def _forget(conn: asyncpg.Connection, tenant: str) -> None:
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.fetchval(Q.cells_forget, tenant)


async def move(
    tenant: str,
    source_dsn: str,
    target_dsn: str,
    *,
    proxy: Proxy | None = None,
    retry_after_s: int = 1,
    source_name: str = "source",
    target_name: str = "target",
) -> MoveReport:
    if not haproxy.TENANT.match(tenant):
        raise MoveError(f"{tenant!r} is not a tenant id (1-128 of a-z A-Z 0-9 . _ - :)")
    report = MoveReport(tenant)
    t0 = time.monotonic()
    src = await connect(source_dsn)
    dst = await connect(target_dsn)
    try:
        # 1. check
        a, b = await src.fetchrow(Q.cells_schema), await dst.fetchrow(Q.cells_schema)
        if a is None or b is None or (a["versions"], a["functions"]) != (b["versions"], b["functions"]):
            raise MoveError("the cells run different schemas: migrate both to the same release first")
        tables = [r["tbl"] for r in await src.fetch(Q.cells_tables)]
        if tables != [r["tbl"] for r in await dst.fetch(Q.cells_tables)]:
            raise MoveError("the cells guard different tables: migrate both to the same release first")
        held = {t: n for t, n in (await _census(dst, tenant)).items() if n}
        if held:
            raise MoveError(f"the target already holds rows of {tenant!r}: {held}")
        src_frozen = await src.fetchrow(Q.cells_freeze_get, tenant)
        if src_frozen is not None:
            raise MoveError(f"{tenant!r} is frozen in the source ({src_frozen['state']}): not living there")
        before = await dst.fetchrow(Q.cells_freeze_get, tenant)  # a 'moved' row from an earlier move out
        # 2. the target refuses the tenant until it opens
        await dst.execute(Q.cells_freeze_set, tenant, "moving_in", source_name, retry_after_s)
        switched = False
        try:
            # 3. freeze
            await _freeze_source(src, tenant, target_name, retry_after_s)
            frozen_at = time.monotonic()
            report.frozen_at = time.time()
            # 4. copy
            report.rows = await _copy(src, dst, tenant, tables)
            report.copy_s = time.monotonic() - frozen_at
            # 5. switch
            if proxy is not None:
                s0 = time.monotonic()
                await asyncio.to_thread(haproxy.switch, proxy.socket_path, proxy.map_path, tenant, proxy.cell)
                report.switch_s = time.monotonic() - s0
                report.proxy_switched = True
            switched = True
        except BaseException:
            if not switched:
                await _forget(dst, tenant)
                if before is None:
                    await dst.execute(Q.cells_freeze_drop, tenant)
                else:
                    await dst.execute(Q.cells_freeze_set, tenant, before["state"], before["peer"], before["retry_after_s"])
                await src.execute(Q.cells_freeze_drop, tenant)
            raise
        # 6. resume
        await dst.execute(Q.cells_freeze_drop, tenant)
        report.freeze_s = time.monotonic() - frozen_at
        report.resumed_at = time.time()
        await dst.execute(Q.cells_wake, tenant)
        # 7. clean the source
        queues = [r["name"] for r in await src.fetch(Q.cells_queue_names, tenant)]
        async with src.transaction():
            await src.execute("SET LOCAL session_replication_role = replica")
            await src.fetchval(Q.cells_forget, tenant)
            await src.execute(Q.cells_freeze_set, tenant, "moved", target_name, retry_after_s)
        await src.execute(Q.cells_wake, tenant)
        await src.execute(Q.cells_wake_pollers, tenant, queues)
    finally:
        await src.close()
        await dst.close()
    report.total_s = time.monotonic() - t0
    return report


async def unfreeze(tenant: str, dsn: str) -> dict[str, Any] | None:
    """Drop a tenant's freeze row in one cell (an operator's way out of an interrupted move); returns the
    row that was there."""
    conn = await connect(dsn)
    try:
        row = await conn.fetchrow(Q.cells_freeze_get, tenant)
        await conn.execute(Q.cells_freeze_drop, tenant)
        await conn.execute(Q.cells_wake, tenant)
        return dict(row) if row else None
    finally:
        await conn.close()
