"""The asyncpg pool: JSON codecs via orjson, sizes from Settings, and asyncpg's client-side command
timeout (60 s: the client stops waiting for a statement and cancels it; the server sets no
statement_timeout of its own).

Every connection the broker opens (the pool, the sweeper's, the LISTEN one, the migration runner's)
asks for a writable server: ``target_session_attrs=read-write`` unless the DSN or
``PGTARGETSESSIONATTRS`` says otherwise. A standby reached through a stale name, a load balancer that
has not switched yet, or a multi-host DSN is then refused at connect (asyncpg's
``TargetServerAttributeNotMatched``, a ``DB_DOWN`` failure: 503) instead of being handed requests that
fail one by one; the next connect tries again and lands on the primary once there is one.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, urlsplit

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


def session_attrs(dsn: str) -> dict[str, Any]:
    """``{"target_session_attrs": "read-write"}`` unless the DSN or the environment chose one."""
    if os.environ.get("PGTARGETSESSIONATTRS"):
        return {}
    try:
        query = parse_qs(urlsplit(dsn).query)
    except ValueError:
        query = {}
    if "target_session_attrs" in query or "target_session_attrs=" in dsn:
        return {}
    return {"target_session_attrs": "read-write"}


def dsn_hosts(dsn: str) -> str:
    """The ``host:port`` list a URL DSN names (no credentials), for operators' messages."""
    try:
        netloc = urlsplit(dsn).netloc
    except ValueError:
        return "?"
    return netloc.rpartition("@")[2] or "the default host"


# The open pools of this process (asyncpg's Pool takes no weak reference: closed ones are pruned here),
# replaced wholesale when a call meets a server that cannot write.
_POOLS: list[asyncpg.Pool] = []


def drop_stale() -> None:
    """A call met a standby (``failures.is_standby_answer``): every pooled connection may point at the
    wrong node. asyncpg closes idle ones now and busy ones when they are released; the next acquire
    connects again (asking for a writable server, ``session_attrs``)."""
    _POOLS[:] = [p for p in _POOLS if not p.is_closing()]
    for pool in _POOLS:
        # A coroutine only by signature (it bumps the pool's generation and never suspends): run to its
        # end here, so the sync error paths (``failures.database_error``) can drop the pool at once.
        step = pool.expire_connections()
        try:
            step.send(None)
        except StopIteration:
            continue
        step.close()
        raise RuntimeError("asyncpg's Pool.expire_connections suspended; drop_stale needs another way")


async def create_pool(settings: Settings, dsn: str, *, min_size: int | None = None, max_size: int | None = None) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
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
        **session_attrs(dsn),
    )
    _POOLS[:] = [p for p in _POOLS if not p.is_closing()]
    _POOLS.append(pool)
    return pool


async def connect(dsn: str, *, application_name: str = "queen-broker") -> asyncpg.Connection:
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, server_settings={"application_name": application_name, "timezone": "UTC"}, **session_attrs(dsn)
    )
    await init_connection(conn)
    return conn


async def ping(pool: asyncpg.Pool) -> dict[str, Any]:
    """Does the database answer on a pooled connection, and can it write? (``/health``): the server's
    address as it sees itself (None over a Unix socket), ``role`` ``primary`` or ``standby`` and
    ``writable``."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(Q.store_ping)
    assert row is not None
    return {"server": row["server"], "role": "standby" if row["in_recovery"] else "primary",
            "writable": not row["in_recovery"] and row["read_only"] == "off"}
