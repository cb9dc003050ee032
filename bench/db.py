"""One fresh, migrated database per bench run, on the server the bench was given."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import asyncpg

from broker.store import migrate


async def new_migrated_db(server_dsn: str, prefix: str) -> str:
    """Create ``<prefix>_<random>`` on the server of ``server_dsn``, migrate it, return its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    dsn = urlsplit(server_dsn)._replace(path="/" + name).geturl()
    await migrate.apply_url(dsn)
    return dsn
