"""broker/store/pool.py: how a connection is prepared before it serves requests."""

from __future__ import annotations

import asyncpg
from conftest import run_sync

from broker.store import pool
from broker.store.queries import Q


def test_a_new_connection_knows_the_hot_statements_types_before_its_first_request(pg, monkeypatch):
    """asyncpg introspects an array type it has no codec for (bytea[], uuid[], ...) at the first statement
    that uses it: a recursive pg_type query inside a request. init_connection describes them all once, so
    no hot statement introspects anything afterwards."""
    seen: list[list[int]] = []
    real = asyncpg.Connection._introspect_types

    async def spy(self, typeoids, timeout):  # type: ignore[no-untyped-def]
        seen.append(sorted(typeoids))
        return await real(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", spy)

    async def check() -> None:
        conn = await pool.connect(pg.new_db())
        try:
            assert seen, "init_connection described no type"
            seen.clear()
            for name in Q.names():
                try:
                    await conn.prepare(getattr(Q, name))
                except asyncpg.PostgresError:
                    continue  # a query for a table a test hook creates, or one that needs a transaction
            assert seen == [], f"statements still introspected types {seen}"
        finally:
            await conn.close()

    run_sync(check())


def test_the_pool_opens_whole_and_never_closes_a_connection_for_idling(pg):
    """By default every connection is open when boot ends, and none is closed after an idle spell: either
    would leave the next burst's first requests to pay a connect, the codecs and the first planning."""
    from broker.config import Settings

    async def check() -> None:
        p = await pool.create_pool(Settings.from_env({"QUEEN_POOL_MAX": "3"}), pg.new_db())
        try:
            assert p.get_size() == 3 and p.get_idle_size() == 3
            assert p._max_inactive_connection_lifetime == 0  # asyncpg's own setting (no public reader)
        finally:
            await p.close()

    run_sync(check())
