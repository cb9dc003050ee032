"""The schema: forward-only migrations for tables, plus function files re-applied when they change.

- ``broker/sql/migrations/NNNN_description.sql`` hold tables, sequences, indexes, constraints and seed rows.
  They are applied in order, each in its own transaction, recorded in ``queen_schema_migrations``, and
  never edited once applied (a recorded migration whose file changed is refused loudly).
- ``broker/sql/functions/*.sql`` hold every function body (and the triggers that bind them), each defined
  once with ``CREATE OR REPLACE``. After the migrations, when the files' combined checksum differs
  from the one recorded in ``queen_schema_functions`` (or a migration was just applied), they are
  re-applied, in file name order, in ONE transaction, and every ``queen_*`` function and every
  trigger on a ``queen_*`` table that this transaction did not (re)define is dropped in it: a
  renamed function, or the old signature of a changed one, does not survive.

  How the sweep knows what the files defined: ``CREATE OR REPLACE`` rewrites the routine's (or
  trigger's) catalog row even when nothing changed, so exactly the rows the files touched carry the
  current transaction id as ``xmin``. The files therefore run at top level, never in a savepoint (a
  savepoint's rows carry its own id), and the run refuses to start inside a caller's transaction. The
  one miss possible errs on the safe side: a row frozen 2^32 transactions ago whose raw ``xmin``
  happens to equal the current id would survive one sweep.

The whole run holds a session advisory lock, so many workers and many brokers may start at once: the
first applies, the others wait and find nothing left to do.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable

import asyncpg

from broker.store import lock_keys
from broker.store.pool import session_attrs
from broker.store.queries import SQL_DIR, QueryError, sql_files

log = logging.getLogger("queen.migrate")

MIGRATIONS_DIR = SQL_DIR / "migrations"
FUNCTIONS_DIR = SQL_DIR / "functions"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_COMMENT = re.compile(r"--[^\n]*")

# A database built before the squash has the migrations ledger but not the functions ledger (both are
# created together since). Nothing was released then, so there is no upgrade path: one line, no trace.
PRE_SQUASH = (
    "this database was built by the pre-release migrations (0001-0033), which were squashed into a new "
    "baseline; nothing was released, so it cannot be upgraded: drop it and create it again "
    "(`queen migrate` or a broker start builds the schema)"
)

_LEDGERS = """
CREATE TABLE IF NOT EXISTS queen_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS queen_schema_functions (
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());
"""

# Everything in our schema that the function files own, and that this transaction did not touch.
_STALE_TRIGGERS = r"""
SELECT format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass) AS ddl
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE 'queen\_%'
  AND NOT t.tgisinternal AND t.xmin <> pg_current_xact_id()::xid
ORDER BY 1
"""
_STALE_ROUTINES = r"""
SELECT format('DROP ROUTINE %s', p.oid::regprocedure) AS ddl
FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'queen\_%'
  AND p.xmin <> pg_current_xact_id()::xid
ORDER BY 1
"""


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


@dataclass(frozen=True)
class Functions:
    """The function files, in the order they are applied (file name order)."""

    files: tuple[tuple[str, str], ...]

    @property
    def checksum(self) -> str:
        h = hashlib.sha256()
        for name, sql in self.files:
            h.update(name.encode() + b"\0" + sql.encode() + b"\0")
        return h.hexdigest()


@dataclass
class Outcome:
    applied: list[int] = field(default_factory=list)  # migration versions applied by this run
    functions: str | None = None  # checksum of the function files, when this run (re)applied them
    dropped: list[str] = field(default_factory=list)  # stale routines and triggers dropped


def _files(directory: Traversable) -> list[Traversable]:
    try:
        return sql_files(directory)
    except QueryError as exc:
        raise MigrationError(str(exc)) from None


def discover(directory: Traversable = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in _files(directory):
        m = _FILE.match(path.name)
        if not m:
            raise MigrationError(f"migration file {path.name!r} does not match NNNN_description.sql")
        found.append(Migration(int(m.group(1)), m.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version number in {directory}")
    return found


def discover_functions(directory: Traversable = FUNCTIONS_DIR) -> Functions:
    """The function files; an empty set is refused (a broken install must never read as "none wanted")."""
    return Functions(tuple((p.name, p.read_text()) for p in _files(directory)))


async def run(
    target: asyncpg.Connection | str,
    directory: Traversable = MIGRATIONS_DIR,
    functions_dir: Traversable | None = FUNCTIONS_DIR,
    *,
    upto: int | None = None,
) -> Outcome:
    """The one migration run (``queen migrate``, every worker's boot, the tests): apply every pending
    migration (up to version ``upto`` when given), then the function files when they changed
    (``functions_dir=None``: leave functions alone). ``target`` is a connection, or a DSN to connect to
    for the run, which asks for a writable server (``pool.session_attrs``): migrations are never
    attempted on a standby."""
    if isinstance(target, str):
        conn = await asyncpg.connect(target, **session_attrs(target))
        try:
            return await run(conn, directory, functions_dir, upto=upto)
        finally:
            await conn.close()
    conn = target
    every = discover(directory)
    migrations = [m for m in every if upto is None or m.version <= upto]
    functions = discover_functions(functions_dir) if functions_dir is not None else None
    out = Outcome()
    await conn.execute("SELECT pg_advisory_lock($1)", lock_keys.MIGRATE)
    try:
        legacy = await conn.fetchval(
            "SELECT to_regclass('queen_schema_migrations') IS NOT NULL AND to_regclass('queen_schema_functions') IS NULL"
        )
        if legacy and await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queen_schema_migrations)"):
            raise MigrationError(PRE_SQUASH)
        await conn.execute(_LEDGERS)
        rows = await conn.fetch(
            "SELECT version, name, checksum FROM queen_schema_migrations ORDER BY version"
        )
        known = {m.version for m in every}
        unknown = [f"{r['version']:04d}_{r['name']}" for r in rows if r["version"] not in known]
        if unknown:
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise MigrationError(
                f"the database records migration(s) {', '.join(unknown[:3])}{more} that {directory} does not "
                "have: it was built by another release; run that release, or recreate the database"
            )
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
            out.applied.append(mig.version)
        if functions is not None:
            recorded = await conn.fetchval("SELECT checksum FROM queen_schema_functions")
            if out.applied or recorded != functions.checksum:
                out.dropped = await _apply_functions(conn, functions)
                out.functions = functions.checksum
                log.info(
                    "applied function files %s (checksum %s)%s",
                    ", ".join(name for name, _ in functions.files),
                    functions.checksum[:12],
                    f"; dropped stale {', '.join(out.dropped)}" if out.dropped else "",
                )
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", lock_keys.MIGRATE)
    return out


async def _apply_functions(conn: asyncpg.Connection, functions: Functions) -> list[str]:
    """Run the function files, drop what they did not define, record the checksum: one transaction."""
    dropped: list[str] = []
    if conn.is_in_transaction():
        raise MigrationError("the function files must be applied at top level, not inside a transaction")
    async with conn.transaction():
        for name, sql in functions.files:
            if not _COMMENT.sub("", sql).strip():
                continue  # nothing but comments (asyncpg cannot execute an empty query)
            try:
                await conn.execute(sql)
            except asyncpg.PostgresError as exc:
                raise MigrationError(f"broker/sql/functions/{name}: {type(exc).__name__}: {exc}") from exc
        touched = await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
            " AND xmin = pg_current_xact_id()::xid"
        )
        if touched == 0 and any(_COMMENT.sub("", sql).strip() for _, sql in functions.files):
            raise MigrationError(
                "the function files defined no routine this transaction can see; nothing swept"
            )
        # Triggers first: a stale trigger function cannot be dropped while a stale trigger uses it.
        for query in (_STALE_TRIGGERS, _STALE_ROUTINES):
            for r in await conn.fetch(query):
                await conn.execute(r["ddl"])
                dropped.append(r["ddl"].removeprefix("DROP ").lower())
        await conn.execute("DELETE FROM queen_schema_functions")
        await conn.execute("INSERT INTO queen_schema_functions(checksum) VALUES ($1)", functions.checksum)
    return dropped
