"""Schema migrations: ``sql/migrations/NNNN_description.sql`` applied in order, each in its own
transaction, recorded in ``queen_schema_migrations``. The whole run holds a session advisory lock, so
many workers and many brokers may start at once: the first applies, the others wait and find nothing
left to do. Applying twice is a no-op; a recorded migration whose file changed is refused loudly.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from broker.store.queries import SQL_DIR

log = logging.getLogger("queen.migrate")

MIGRATIONS_DIR = SQL_DIR / "migrations"
ADVISORY_LOCK_KEY = 0x51_55_45_45_4E  # "QUEEN"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        m = _FILE.match(path.name)
        if not m:
            raise MigrationError(f"migration file {path.name!r} does not match NNNN_description.sql")
        found.append(Migration(int(m.group(1)), m.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version number in {directory}")
    return found


async def apply(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply every pending migration; return the versions applied by this call."""
    migrations = discover(directory)
    applied_now: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS queen_schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        rows = await conn.fetch("SELECT version, checksum FROM queen_schema_migrations")
        done = {r["version"]: r["checksum"] for r in rows}
        for mig in migrations:
            if mig.version in done:
                if done[mig.version] != mig.checksum:
                    raise MigrationError(
                        f"migration {mig.version:04d}_{mig.name} was changed after it was applied; "
                        "write a new migration instead"
                    )
                continue
            async with conn.transaction():
                await conn.execute(mig.sql)
                await conn.execute(
                    "INSERT INTO queen_schema_migrations(version, name, checksum) VALUES ($1, $2, $3)",
                    mig.version,
                    mig.name,
                    mig.checksum,
                )
            log.info("applied migration %04d_%s", mig.version, mig.name)
            applied_now.append(mig.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
    return applied_now


async def apply_url(dsn: str) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        return await apply(conn)
    finally:
        await conn.close()
