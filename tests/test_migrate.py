"""The migration runner: ordered, recorded, idempotent, safe under concurrent starts, loud about an
applied migration that changed, atomic per migration; ``queen migrate``; and the schema the
migrations build checked against the house rules."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from broker.store import migrate


def all_versions() -> list[int]:
    return [m.version for m in migrate.discover()]


async def fingerprint(dsn: str) -> dict[str, list[tuple]]:
    """What the schema is made of (not what it holds), comparable across databases."""
    conn = await asyncpg.connect(dsn)
    try:
        q = {
            "columns": """SELECT table_name, column_name, ordinal_position, data_type, is_nullable, column_default
                          FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 3""",
            "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
            "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                              WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2""",
            "functions": """SELECT proname, pg_get_function_identity_arguments(oid), md5(prosrc) FROM pg_proc
                            WHERE pronamespace = 'public'::regnamespace ORDER BY 1, 2""",
            "triggers": """SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
                           WHERE NOT tgisinternal ORDER BY 1, 2""",
            "relations": """SELECT relname, relkind FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY 1""",
            "types": """SELECT typname, typtype FROM pg_type WHERE typnamespace = 'public'::regnamespace
                        AND typtype IN ('e', 'c', 'd') ORDER BY 1""",
            "recorded": "SELECT version, name, checksum FROM queen_schema_migrations ORDER BY 1",
        }
        return {k: [tuple(r) for r in await conn.fetch(sql)] for k, sql in q.items()}
    finally:
        await conn.close()


async def test_apply_twice_is_a_no_op(pg):
    dsn = pg.new_db(template=False)
    assert await migrate.apply_url(dsn) == all_versions()
    first = await fingerprint(dsn)
    assert await migrate.apply_url(dsn) == []
    assert await fingerprint(dsn) == first
    assert first["recorded"] == [(m.version, m.name, m.checksum) for m in migrate.discover()]


async def test_concurrent_starts_apply_each_version_once(pg):
    dsn = pg.new_db(template=False)
    results = await asyncio.gather(*(migrate.apply_url(dsn) for _ in range(6)))
    flat = sorted(v for r in results for v in r)
    assert flat == all_versions(), f"versions applied per caller: {results}"
    assert sum(1 for r in results if r) == 1, "the first runner under the lock applies everything"
    # The schema is the one a lone runner builds (the session template was built that way).
    assert await fingerprint(dsn) == await fingerprint(pg.new_db())


def _copy_migrations(tmp_path: Path) -> Path:
    d = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, d)
    return d


async def test_a_changed_applied_migration_is_refused(pg, tmp_path):
    dsn = pg.new_db()  # every current migration applied
    d = _copy_migrations(tmp_path)
    last = sorted(d.glob("*.sql"))[-1]
    last.write_text(last.read_text() + "\n-- an innocent looking edit\n")
    (d / "9999_after.sql").write_text("CREATE TABLE queen_after_the_edit (tenant text PRIMARY KEY);")
    conn = await asyncpg.connect(dsn)
    try:
        with pytest.raises(migrate.MigrationError, match=rf"{last.stem} was changed after it was applied"):
            await migrate.apply(conn, d)
        assert await conn.fetchval("SELECT to_regclass('queen_after_the_edit')") is None
        # The advisory lock was released: another run (with the true files) goes through at once.
        assert await asyncio.wait_for(migrate.apply(conn), 10) == []
    finally:
        await conn.close()


async def test_a_failing_migration_rolls_back_alone(pg, tmp_path):
    dsn = pg.new_db()
    d = _copy_migrations(tmp_path)
    (d / "9998_fine.sql").write_text("CREATE TABLE queen_fine (tenant text PRIMARY KEY);")
    (d / "9999_broken.sql").write_text("CREATE TABLE queen_half (tenant text PRIMARY KEY);\nSELECT FROM WHERE;")
    conn = await asyncpg.connect(dsn)
    try:
        with pytest.raises(asyncpg.PostgresSyntaxError):
            await migrate.apply(conn, d)
        recorded = {r[0] for r in await conn.fetch("SELECT version FROM queen_schema_migrations")}
        assert 9998 in recorded and 9999 not in recorded
        assert await conn.fetchval("SELECT to_regclass('queen_fine')") == "queen_fine"
        assert await conn.fetchval("SELECT to_regclass('queen_half')") is None
        (d / "9999_broken.sql").write_text("CREATE TABLE queen_half (tenant text PRIMARY KEY);")
        assert await migrate.apply(conn, d) == [9999]
    finally:
        await conn.close()


def test_discover_refuses_bad_names_and_duplicate_versions(tmp_path):
    (tmp_path / "0001_ok.sql").write_text("SELECT 1;")
    assert [m.version for m in migrate.discover(tmp_path)] == [1]
    (tmp_path / "0001_again.sql").write_text("SELECT 1;")
    with pytest.raises(migrate.MigrationError, match="share a version"):
        migrate.discover(tmp_path)
    (tmp_path / "0001_again.sql").unlink()
    (tmp_path / "2_Bad-Name.sql").write_text("SELECT 1;")
    with pytest.raises(migrate.MigrationError, match="does not match NNNN_description.sql"):
        migrate.discover(tmp_path)


def test_queen_migrate_cli(pg):
    dsn = pg.new_db(template=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")} | {"QUEEN_DATABASE_URL": dsn}
    cmd = [str(Path(sys.executable).with_name("queen")), "migrate"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    versions = all_versions()
    assert out.stdout.strip() == f"applied {len(versions)} migration(s): {versions}"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "schema is up to date"


async def test_schema_follows_the_house_rules(pg):
    """Every table and every index leads with ``tenant`` (a tenant can move between cells; no query
    scans across tenants); the migrations ledger is the one exception."""
    dsn = pg.new_db()
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch(
            """SELECT c.relname, a.attname FROM pg_class c
               LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = 1
               WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
                 AND c.relname <> 'queen_schema_migrations' AND NOT c.relispartition"""
        )
        indexes = await conn.fetch(
            """SELECT i.indexrelid::regclass::text AS name, a.attname FROM pg_index i
               JOIN pg_class c ON c.oid = i.indrelid
               LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'queen_schema_migrations'"""
        )
    finally:
        await conn.close()
    assert tables and indexes
    assert [r["relname"] for r in tables if r["attname"] != "tenant"] == [], "tables whose first column is not tenant"
    assert [r["name"] for r in indexes if r["attname"] != "tenant"] == [], "indexes that do not lead with tenant"
