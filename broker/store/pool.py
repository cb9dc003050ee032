"""The asyncpg pool: JSON codecs via orjson, sizes from Settings, and asyncpg's client-side command
timeout (60 s: the client stops waiting for a statement and cancels it; the server sets no
statement_timeout of its own)."""

from __future__ import annotations

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from broker.config import Settings
from broker.store.queries import Q

# A connection as the broker holds one: its own (``connect``) or one acquired from the pool.
Conn = asyncpg.Connection | PoolConnectionProxy
# What a query helper runs on: the pool, or a connection (inside the caller's transaction).
Executor = asyncpg.Pool | Conn


def _dumps(v: object) -> str:
    return orjson.dumps(v).decode()


async def init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")
    # asyncpg introspects an array type the first time a statement uses it: done here, once (the query's
    # comment in broker/sql/queries/store.sql), not in the middle of a request.
    await conn.prepare(Q.store_warm_types)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release hook that skips asyncpg's default reset query (advisory unlock all, CLOSE ALL, UNLISTEN,
    RESET ALL): one round trip on every release, a large share of a one-item push's CPU
    (docs/performance.md).

    Safe because pooled connections never carry session state: every advisory lock the broker takes on
    them is transaction-scoped (the timers-vacuum loop's session lock and its vacuum_cost_delay are undone
    before it releases the connection), LISTEN has its own connection (store/listen.py), nothing else SETs
    a session variable, and asyncpg still rolls back a transaction left open before this hook runs. The one
    deliberate per-connection object is queen_push's scratch temp table, whose rows vanish at commit.
    """
    return None


async def create_pool(settings: Settings, dsn: str, *, min_size: int | None = None, max_size: int | None = None) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        dsn,
        min_size=settings.pool_min if min_size is None else min_size,
        max_size=settings.pool_max if max_size is None else max_size,
        init=init_connection,
        reset=_keep_session,
        command_timeout=60,
        # Connections stay open: one closed after an idle spell is reopened by the next burst's first
        # requests, each paying the connect, the codecs' type introspection (init_connection) and the
        # first planning of every statement it runs.
        max_inactive_connection_lifetime=0,
        server_settings={"application_name": "queen-broker", "timezone": "UTC"},
    )


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "queen-broker", "timezone": "UTC"})
    await init_connection(conn)
    return conn


async def ping(pool: asyncpg.Pool) -> None:
    """Does the database answer on a pooled connection? (``/health``)"""
    async with pool.acquire() as conn:
        await conn.fetchval(Q.store_ping)
