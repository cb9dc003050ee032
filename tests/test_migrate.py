"""The migration runner: ordered, recorded, idempotent, safe under concurrent starts, loud about an
applied migration that changed, atomic per migration; the function files re-applied when they change
with stale routines swept; a database migrated step by step identical to one built from scratch; a
pre-squash database refused in one line; ``queen migrate``; and the schema checked against the house
rules."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from broker.store import migrate


def all_versions() -> list[int]:
    return [m.version for m in migrate.discover()]


# The catalog of our schema, comparable across databases: everything a migration or a function file
# can create, by definition (not by oid or creation order), and the two ledgers' contents.
CATALOG = {
    "relations": """SELECT c.relname, c.relkind::text, c.relpersistence::text, c.reloptions FROM pg_class c
                    WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1""",
    "columns": """SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                         pg_get_expr(d.adbin, d.adrelid), co.collname, a.attidentity::text, a.attgenerated::text
                  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  LEFT JOIN pg_collation co ON co.oid = a.attcollation
                  WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
                    AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2""",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
    "constraints": """SELECT conrelid::regclass::text, conname, contype::text, pg_get_constraintdef(oid)
                      FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2""",
    "sequences": """SELECT sequencename, data_type::text, start_value, min_value, max_value, increment_by, cycle,
                           cache_size FROM pg_sequences WHERE schemaname = 'public' ORDER BY 1""",
    "functions": """SELECT proname, pg_get_function_identity_arguments(oid), pg_get_functiondef(oid) FROM pg_proc
                    WHERE pronamespace = 'public'::regnamespace ORDER BY 1, 2""",
    "triggers": """SELECT tgrelid::regclass::text, tgname, tgenabled::text, pg_get_triggerdef(oid) FROM pg_trigger
                   WHERE NOT tgisinternal ORDER BY 1, 2""",
    "types": """SELECT typname, typtype::text FROM pg_type WHERE typnamespace = 'public'::regnamespace
                AND typtype IN ('e', 'c', 'd') AND typrelid = 0 ORDER BY 1""",
    "recorded": "SELECT version, name, checksum FROM queen_schema_migrations ORDER BY 1",
    "functions_recorded": "SELECT checksum FROM queen_schema_functions",
}


async def fingerprint(dsn: str) -> dict[str, list[tuple]]:
    """What the schema is made of (not what it holds), comparable across databases."""
    conn = await asyncpg.connect(dsn)
    try:
        return {k: [tuple(r) for r in await conn.fetch(sql)] for k, sql in CATALOG.items()}
    finally:
        await conn.close()


async def test_apply_twice_is_a_no_op(pg):
    dsn = pg.new_db(template=False)
    assert (await migrate.run(dsn)).applied == all_versions()
    first = await fingerprint(dsn)
    again = await migrate.run(dsn)
    assert (again.applied, again.functions, again.dropped) == ([], None, [])
    assert await fingerprint(dsn) == first
    assert first["recorded"] == [(m.version, m.name, m.checksum) for m in migrate.discover()]
    assert first["functions_recorded"] == [(migrate.discover_functions().checksum,)]


async def test_concurrent_starts_apply_each_version_once(pg):
    dsn = pg.new_db(template=False)
    results = [out.applied for out in await asyncio.gather(*(migrate.run(dsn) for _ in range(6)))]
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
            await migrate.run(conn, d)
        assert await conn.fetchval("SELECT to_regclass('queen_after_the_edit')") is None
        # The advisory lock was released: another run (with the true files) goes through at once.
        assert (await asyncio.wait_for(migrate.run(conn), 10)).applied == []
    finally:
        await conn.close()


async def test_a_failing_migration_rolls_back_alone(pg, tmp_path):
    dsn = pg.new_db()
    d = _copy_migrations(tmp_path)
    (d / "9998_fine.sql").write_text("CREATE TABLE queen_fine (tenant text PRIMARY KEY);")
    (d / "9999_broken.sql").write_text(
        "CREATE TABLE queen_half (tenant text PRIMARY KEY);\nSELECT FROM WHERE;"
    )
    conn = await asyncpg.connect(dsn)
    try:
        with pytest.raises(asyncpg.PostgresSyntaxError):
            await migrate.run(conn, d)
        recorded = {r[0] for r in await conn.fetch("SELECT version FROM queen_schema_migrations")}
        assert 9998 in recorded and 9999 not in recorded
        assert await conn.fetchval("SELECT to_regclass('queen_fine')") == "queen_fine"
        assert await conn.fetchval("SELECT to_regclass('queen_half')") is None
        (d / "9999_broken.sql").write_text("CREATE TABLE queen_half (tenant text PRIMARY KEY);")
        assert (await migrate.run(conn, d)).applied == [9999]
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
    checksum = migrate.discover_functions().checksum[:12]
    assert out.stdout.splitlines() == [
        f"applied {len(versions)} migration(s): {versions}",
        f"applied broker/sql/functions (checksum {checksum})",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "schema is up to date"


# The one index whose order crosses tenants, on purpose: the sweeper serves every tenant of its cell,
# and which tenants have due timers (and when the next one is due) is the front of a single order of
# due instants (broker/sql/migrations/0023_timers_due_at.sql). A per-tenant walk cost every cycle a descent
# per tenant holding a timer: 105 ms beside 10,000 of them, against 3.4 ms. A tenant's rows still move
# by tenant (its second column; every table and every other index leads with it).
CROSS_TENANT_INDEXES = {"queen_timers_due_at"}


async def test_schema_follows_the_house_rules(pg):
    """Every table and every index leads with ``tenant`` (a tenant can move between cells; no query
    scans across tenants); the two schema ledgers are the exception, and the sweeper's due order
    (CROSS_TENANT_INDEXES), which carries tenant second."""
    dsn = pg.new_db()
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch(
            """SELECT c.relname, a.attname FROM pg_class c
               LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = 1
               WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
                 AND c.relname NOT LIKE 'queen\\_schema\\_%' AND NOT c.relispartition"""
        )
        indexes = await conn.fetch(
            """SELECT i.indexrelid::regclass::text AS name, a.attname, a2.attname AS second FROM pg_index i
               JOIN pg_class c ON c.oid = i.indrelid
               LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               LEFT JOIN pg_attribute a2 ON a2.attrelid = i.indrelid AND a2.attnum = i.indkey[1]
               WHERE c.relnamespace = 'public'::regnamespace AND c.relname NOT LIKE 'queen\\_schema\\_%'"""
        )
    finally:
        await conn.close()
    assert tables and indexes
    assert [r["relname"] for r in tables if r["attname"] != "tenant"] == [], (
        "tables whose first column is not tenant"
    )
    assert [r["name"] for r in indexes if r["attname"] != "tenant" and r["name"] not in CROSS_TENANT_INDEXES] == [], (
        "indexes that do not lead with tenant"
    )
    crossing = {r["name"]: r["second"] for r in indexes if r["name"] in CROSS_TENANT_INDEXES}
    assert crossing == {name: "tenant" for name in CROSS_TENANT_INDEXES}, crossing


# Versions 1-5 are the squashed baseline: never released one without the others, and the function
# files need every one of their tables (a trigger on queen_timers, queen_kv_row takes a queen_kv row).
# From the baseline on, every migration is a release an operator may stop at.
BASELINE = 5


async def test_step_by_step_equals_from_scratch(pg):
    """An operator upgrading release by release (each migration applied on its own, the function files
    re-applied after each) ends with the very catalog of a database built in one go."""
    stepped = pg.new_db(template=False)
    conn = await asyncpg.connect(stepped)
    try:
        for mig in migrate.discover():
            functions = migrate.FUNCTIONS_DIR if mig.version >= BASELINE else None
            out = await migrate.run(conn, functions_dir=functions, upto=mig.version)
            assert out.applied == [mig.version]
            assert (out.functions is not None) == (mig.version >= BASELINE)
            assert out.dropped == []
    finally:
        await conn.close()
    scratch = pg.new_db(template=False)
    assert (await migrate.run(scratch)).applied == all_versions()
    built = await fingerprint(scratch)
    assert await fingerprint(stepped) == built
    assert await fingerprint(pg.new_db()) == built, "the tests' template database is the same schema"
    assert built["functions"] and built["triggers"] and built["indexes"]


def _copy_functions(tmp_path: Path) -> Path:
    d = tmp_path / "functions"
    shutil.copytree(migrate.FUNCTIONS_DIR, d)
    return d


async def test_a_function_file_change_is_applied_at_next_boot(pg, tmp_path):
    dsn = pg.new_db()
    d = _copy_functions(tmp_path)
    kv = d / "kv.sql"
    text = kv.read_text()
    assert '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'' in text
    kv.write_text(text.replace('\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'', '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''))
    conn = await asyncpg.connect(dsn)
    try:
        ts = "SELECT queen_kv_ts('2030-01-02 03:04:05.678901+00')"
        assert await conn.fetchval(ts) == "2030-01-02T03:04:05.678901Z"
        out = await migrate.run(conn, functions_dir=d)
        assert out.applied == [] and out.functions == migrate.discover_functions(d).checksum
        assert await conn.fetchval(ts) == "2030-01-02T03:04:05.678Z", "no new migration needed"
        assert await conn.fetchval("SELECT checksum FROM queen_schema_functions") == out.functions
        again = await migrate.run(conn, functions_dir=d)
        assert again.functions is None, "unchanged files are not applied again"
        # Back to the files of the tree (what the next release's boot does): the old body returns.
        back = await migrate.run(conn)
        assert back.functions == migrate.discover_functions().checksum
        assert await conn.fetchval(ts) == "2030-01-02T03:04:05.678901Z"
    finally:
        await conn.close()
    assert await fingerprint(dsn) == await fingerprint(pg.new_db())


async def test_a_pop_with_other_result_columns_is_replaced(pg):
    """CREATE OR REPLACE cannot change a function's result columns: a database whose queen_pop answers other
    columns (the one before the pop handed out deadline_at) is upgraded at boot all the same."""
    dsn = pg.new_db()
    conn = await asyncpg.connect(dsn)
    try:
        args = await conn.fetchval("SELECT pg_get_function_identity_arguments('queen_pop'::regproc)")
        await conn.execute(f"DROP FUNCTION queen_pop({args})")
        await conn.execute(f"CREATE OR REPLACE FUNCTION queen_pop({args}) RETURNS TABLE (kind text) "
                           "LANGUAGE sql AS $$ SELECT 'idle'::text $$")
        await conn.execute("DELETE FROM queen_schema_functions")
        out = await migrate.run(conn)
        assert out.functions == migrate.discover_functions().checksum
        cols = await conn.fetchval("SELECT proargnames FROM pg_proc WHERE proname = 'queen_pop'")
        assert "deadline_at" in cols
    finally:
        await conn.close()
    assert await fingerprint(dsn) == await fingerprint(pg.new_db())


async def test_stale_functions_and_triggers_are_dropped(pg, tmp_path):
    """What the files stop defining (a removed function, the old signature of a changed one, a removed
    trigger) is dropped in the transaction that applies them; what is not ours is left alone."""
    dsn = pg.new_db()
    d = _copy_functions(tmp_path)
    extra = d / "zz_extra.sql"
    extra.write_text(
        "CREATE OR REPLACE FUNCTION queen_probe(a integer) RETURNS integer LANGUAGE sql AS $$ SELECT a $$;\n"
        "CREATE OR REPLACE FUNCTION queen_probe_trg() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN RETURN NULL; END $$;\n"
        "CREATE OR REPLACE TRIGGER queen_probe_trg AFTER UPDATE ON queen_tenants\n"
        "    FOR EACH STATEMENT EXECUTE FUNCTION queen_probe_trg();\n"
    )
    conn = await asyncpg.connect(dsn)
    procs = "SELECT array_agg(oid::regprocedure::text ORDER BY 1) FROM pg_proc WHERE proname LIKE 'queen\\_probe%'"
    trg = "SELECT count(*) FROM pg_trigger WHERE tgname = 'queen_probe_trg'"
    try:
        await conn.execute("CREATE FUNCTION not_ours() RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$")
        # Inside a caller's transaction the files would run in a savepoint, whose rows carry another
        # transaction id than the top level's: the sweep would take everything. Refused instead.
        with pytest.raises(migrate.MigrationError, match="at top level"):
            async with conn.transaction():
                await migrate.run(conn, functions_dir=d)
        assert (await migrate.run(conn, functions_dir=d)).dropped == []
        assert await conn.fetchval(procs) == ["queen_probe(integer)", "queen_probe_trg()"]
        assert await conn.fetchval(trg) == 1

        # A signature change: the file holds only the new one; the old one is swept.
        extra.write_text(
            extra.read_text().replace(
                "queen_probe(a integer) RETURNS integer LANGUAGE sql AS $$ SELECT a $$",
                "queen_probe(a integer, b integer) RETURNS integer LANGUAGE sql AS $$ SELECT a + b $$",
            )
        )
        out = await migrate.run(conn, functions_dir=d)
        assert out.dropped == ["routine queen_probe(integer)"]
        assert await conn.fetchval(procs) == ["queen_probe(integer,integer)", "queen_probe_trg()"]

        # The file goes: its trigger goes first, then its functions.
        extra.unlink()
        out = await migrate.run(conn, functions_dir=d)
        assert out.dropped == [
            "trigger queen_probe_trg on queen_tenants",
            "routine queen_probe(integer,integer)",
            "routine queen_probe_trg()",
        ]
        assert await conn.fetchval(procs) is None and await conn.fetchval(trg) == 0
        assert await conn.fetchval("SELECT not_ours()") == 1
    finally:
        await conn.close()
    # What is left is exactly what the tree's files define (the stale sweep took nothing of ours).
    ours = await fingerprint(pg.new_db())
    left = await fingerprint(dsn)
    assert [f for f in left["functions"] if f[0] != "not_ours"] == ours["functions"]
    assert left["triggers"] == ours["triggers"]


async def test_a_broken_function_file_changes_nothing(pg, tmp_path):
    dsn = pg.new_db()
    d = _copy_functions(tmp_path)
    (d / "kv.sql").write_text("-- everything of kv.sql gone\n")
    (d / "zz_broken.sql").write_text(
        "CREATE OR REPLACE FUNCTION queen_broken() RETURNS integer LANGUAGE sql AS $$ SELECT nope $$;"
    )
    conn = await asyncpg.connect(dsn)
    try:
        with pytest.raises(
            migrate.MigrationError, match=r"^broker/sql/functions/zz_broken.sql: UndefinedColumnError"
        ):
            await migrate.run(conn, functions_dir=d)
        assert await conn.fetchval("SELECT to_regproc('queen_kv_apply') IS NOT NULL"), "nothing was swept"
        assert (
            await conn.fetchval("SELECT checksum FROM queen_schema_functions")
            == migrate.discover_functions().checksum
        )
        assert (await asyncio.wait_for(migrate.run(conn), 10)).functions is None, "the lock was released"
    finally:
        await conn.close()


async def _pre_squash_database(pg) -> str:
    """A database as the pre-squash runner left it: its ledger (no functions ledger) with old versions."""
    dsn = pg.new_db(template=False)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE TABLE queen_schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                   checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
               INSERT INTO queen_schema_migrations (version, name, checksum)
               VALUES (1, 'foundation', 'an older checksum'), (10, 'log_consumers', 'x'), (33, 'kv_switch', 'y');
               CREATE TABLE queen_tenants (tenant text PRIMARY KEY)"""
        )
    finally:
        await conn.close()
    return dsn


async def test_a_pre_squash_database_is_refused_in_one_line(pg):
    dsn = await _pre_squash_database(pg)
    with pytest.raises(migrate.MigrationError) as exc:
        await migrate.run(dsn)
    assert str(exc.value) == migrate.PRE_SQUASH and "\n" not in migrate.PRE_SQUASH
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('queen_schema_functions')") is None, (
            "nothing was changed"
        )
        assert await conn.fetchval("SELECT count(*) FROM queen_schema_migrations") == 3
    finally:
        await conn.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")} | {"QUEEN_DATABASE_URL": dsn}
    cmd = [str(Path(sys.executable).with_name("queen")), "migrate"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == f"queen migrate: {migrate.PRE_SQUASH}", "one line, no traceback"


async def test_a_database_with_unknown_versions_is_refused(pg, tmp_path):
    """Recorded versions this tree does not have (a newer release's database) are refused, untouched."""
    dsn = pg.new_db()
    d = _copy_migrations(tmp_path)
    (d / "9999_later.sql").write_text("CREATE TABLE queen_later (tenant text PRIMARY KEY);")
    conn = await asyncpg.connect(dsn)
    try:
        assert (await migrate.run(conn, d)).applied == [9999]
        with pytest.raises(
            migrate.MigrationError, match=r"records migration\(s\) 9999_later that .* recreate"
        ):
            await migrate.run(conn)
    finally:
        await conn.close()


_CREATE_FUNCTION = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|TRIGGER)\s+([a-z_0-9]+)", re.I
)


def test_each_function_is_defined_once_and_only_in_sql_functions():
    """Migrations hold no routine or trigger; a function file defines each one once, re-runnably."""
    sql_dir = migrate.MIGRATIONS_DIR.parent
    seen: dict[tuple[str, str], str] = {}
    for path in sorted(sql_dir.rglob("*.sql")):
        for kind, name in _CREATE_FUNCTION.findall(path.read_text()):
            where = str(path.relative_to(sql_dir))
            assert where.startswith("functions/"), f"{where} defines {kind.lower()} {name}"
            key = (kind.upper(), name)
            assert key not in seen, f"{kind.lower()} {name} in {seen.get(key)} and again in {where}"
            seen[key] = where
    text = "\n".join(p.read_text() for p in migrate.FUNCTIONS_DIR.glob("*.sql"))
    assert not re.search(r"CREATE\s+(FUNCTION|TRIGGER)", text), (
        "function files must be re-runnable: OR REPLACE"
    )
    assert len([k for k in seen if k[0] == "FUNCTION"]) >= 29
