"""One fresh, migrated database per bench run, on the server the bench was given."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from broker.store import migrate


async def new_db(server_dsn: str, prefix: str) -> str:
    """Create an empty ``<prefix>_<random>`` on the server of ``server_dsn``, return its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return urlsplit(server_dsn)._replace(path="/" + name).geturl()


async def new_migrated_db(server_dsn: str, prefix: str) -> str:
    """``new_db`` with our schema migrated in."""
    dsn = await new_db(server_dsn, prefix)
    await migrate.run(dsn)
    return dsn


def run_on_a_server(main: Callable[[str], Coroutine[Any, Any, None]], prefix: str) -> None:
    """Run ``main(server_dsn)`` against QUEEN_BENCH_DATABASE_URL / QUEEN_TEST_DATABASE_URL, or an embedded
    PostgreSQL in a fresh temporary directory (stopped afterwards)."""
    server = os.environ.get("QUEEN_BENCH_DATABASE_URL") or os.environ.get("QUEEN_TEST_DATABASE_URL")
    emb = None
    if not server:
        from broker.store import embedded

        emb = embedded.start_scratch(prefix)
        server = emb.dsn()
    try:
        asyncio.run(main(server))
    finally:
        if emb is not None:
            emb.stop()
