"""Database failure classification: every failure of the database (down, shutting down, a connection
broken between two protocol steps, a retry request) is a 503 with one stable reason on every surface."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from asyncpg import exceptions as pgx

from broker.app import edge_middleware
from broker.metrics import CONFLICT_RETRIES
from broker.store.failures import (
    CONFLICT_ATTEMPTS,
    DB_FAILURE,
    database_error,
    failure_class,
    retry_conflicts,
)

SHUTDOWN_FAILURES = [
    pgx.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
    pgx.AdminShutdownError("terminating connection due to administrator command"),
    pgx.CrashShutdownError("crash"),
    pgx.CannotConnectNowError("the database system is shutting down"),
    pgx.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.InterfaceError("pool is closing"),
    ConnectionResetError("reset"),
    FileNotFoundError(2, "No such file or directory"),
    TimeoutError(),
]


@pytest.mark.parametrize("exc", SHUTDOWN_FAILURES, ids=lambda e: type(e).__name__)
def test_every_shutdown_failure_is_database_unavailable(exc):
    assert isinstance(exc, DB_FAILURE)
    err = database_error(exc)
    assert (err.status, err.code, err.reason) == (503, "unavailable", "database_unavailable")
    assert err.headers["Retry-After"] == "1" and type(exc).__name__ in err.detail


def test_retry_requests_are_database_conflict():
    for exc in (pgx.DeadlockDetectedError("d"), pgx.SerializationError("s")):
        err = database_error(exc)
        assert (err.status, err.code, err.reason) == (503, "unavailable", "database_conflict")


async def _answer_of(exc: BaseException) -> tuple[int, dict, dict]:
    """What the error middleware answers for a handler that raised ``exc``: status, JSON body, headers."""

    async def handler(_request: web.Request) -> web.Response:
        raise exc

    app = web.Application(middlewares=[edge_middleware])
    app.router.add_post("/x", handler)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/x")
        return r.status, await r.json(), dict(r.headers)


@pytest.mark.parametrize("exc", SHUTDOWN_FAILURES[:3], ids=lambda e: type(e).__name__)
async def test_the_edge_middleware_answers_503_not_500(exc):
    status, body, headers = await _answer_of(exc)
    assert status == 503, body
    assert body["error"] == "unavailable" and body["reason"] == "database_unavailable"
    assert headers["Retry-After"] == "1"


# ---- a server that cannot write (a standby, a demoted primary) is unavailable, never an error

STANDBY_FAILURES = [
    pgx.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
    pgx.ReadOnlySQLTransactionError("cannot execute nextval() in a read-only transaction"),
    pgx.CannotConnectNowError("the database system is not yet accepting connections"),
    pgx.SerializationError("canceling statement due to conflict with recovery"),
    pgx.FeatureNotSupportedError("cannot acquire lock mode ExclusiveLock on database objects while recovery is in progress"),
]


@pytest.mark.parametrize("exc", STANDBY_FAILURES, ids=lambda e: f"{type(e).__name__}:{str(e)[:30]}")
async def test_a_standby_answer_is_503_and_drops_the_pooled_connections(exc, monkeypatch):
    from broker.store import failures

    dropped = []
    monkeypatch.setattr(failures, "drop_stale", lambda: dropped.append(1))

    status, body, headers = await _answer_of(exc)
    assert status == 503, body
    assert (body["error"], body["reason"]) == ("unavailable", "database_unavailable")
    assert "not a writable primary" in body["detail"]
    assert headers["Retry-After"] == "1"
    assert dropped == [1]


async def test_drop_stale_replaces_every_pooled_connection(pg):
    """A pooled connection opened before the drop is closed at its release, never handed out again."""
    from broker.config import Settings
    from broker.store.pool import create_pool, drop_stale

    pool = await create_pool(Settings.from_env({}), pg.dsn_for("postgres"), min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            before = await conn.fetchval("SELECT pg_backend_pid()")
        drop_stale()
        async with pool.acquire() as conn:
            after = await conn.fetchval("SELECT pg_backend_pid()")
        assert after != before
    finally:
        await pool.close()


def test_every_connection_asks_for_a_writable_server_unless_the_dsn_says(monkeypatch):
    from broker.store.pool import session_attrs

    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    assert session_attrs("postgresql://u@h:5432/db") == {"target_session_attrs": "read-write"}
    assert session_attrs("postgresql://u@h1:5432,h2:5433/db?target_session_attrs=primary") == {}
    assert session_attrs("host=h target_session_attrs=any") == {}
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "any")
    assert session_attrs("postgresql://u@h:5432/db") == {}


def test_standby_answers_are_classified():
    from broker.store.failures import is_standby_answer

    for exc in STANDBY_FAILURES:
        assert is_standby_answer(exc), exc
    for exc in (pgx.SerializationError("could not serialize access"), pgx.FeatureNotSupportedError("nope"),
                pgx.UniqueViolationError("dup"), ConnectionResetError()):
        assert not is_standby_answer(exc), exc


class _Answered(Exception):
    """A failure known only by its SQLSTATE (a function caught it and answered it as a row)."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def test_failure_classes():
    assert failure_class(asyncpg.exceptions.SerializationError("x")) == "transient"  # 40001
    assert failure_class(asyncpg.exceptions.DeadlockDetectedError("x")) == "transient"  # 40P01
    assert failure_class(asyncpg.exceptions.TooManyConnectionsError("x")) == "transient"  # 53300
    assert failure_class(asyncpg.exceptions.AdminShutdownError("x")) == "transient"  # 57P01
    assert failure_class(ConnectionResetError()) == "transient"
    assert failure_class(asyncpg.exceptions.UniqueViolationError("x")) == "permanent"
    assert failure_class(asyncpg.exceptions.CheckViolationError("x")) == "permanent"
    assert [failure_class(_Answered(s)) for s in ("40001", "40P01", "08006", "53200", "57014")] == ["transient"] * 5
    assert [failure_class(_Answered(s)) for s in ("25006", "57P03")] == ["transient"] * 2  # a standby answered
    assert [failure_class(_Answered(s)) for s in ("23505", "22P02", "P0001")] == ["permanent"] * 3


async def test_a_statement_the_database_chose_as_a_deadlock_victim_is_run_again(pg):
    """A real deadlock: a transaction holds row 1 and then asks for row 2 while one statement (its own
    transaction, run through ``retry_conflicts``) holds row 2 and waits for row 1. The database aborts
    the waiter whose deadlock_timeout runs out once the cycle exists (the statement's 1 s, against the
    holder's 10 s); it is run again, waits for the transaction to commit, and succeeds: the caller never
    sees the deadlock."""
    dsn = pg.new_db()
    holder, other = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        await holder.execute("CREATE TABLE dl (id int PRIMARY KEY, v int); INSERT INTO dl VALUES (1, 0), (2, 0)")
        await holder.execute("SET deadlock_timeout = '10s'")  # so the statement, not the holder, is the victim
        await other.execute("SET deadlock_timeout = '1s'")
        tx = holder.transaction()
        await tx.start()
        await holder.execute("UPDATE dl SET v = v + 1 WHERE id = 1")
        runs = []
        holder_has_row_2 = asyncio.Event()

        async def statement() -> str:
            runs.append(1)  # row 2 first, then row 1: the opposite order of the holder
            if len(runs) > 1:
                # the rerun starts once the holder got row 2: an aborted transaction's row is free at once,
                # so on a busy machine a rerun could take row 2 before the woken holder does and make the
                # same cycle again (a third run)
                await holder_has_row_2.wait()
            return await other.execute(
                "WITH a AS (UPDATE dl SET v = v + 10 WHERE id = 2 RETURNING 1) "
                "UPDATE dl SET v = v + 10 WHERE id = 1 AND (SELECT count(*) FROM a) = 1")

        before = CONFLICT_RETRIES._value.get()
        task = asyncio.ensure_future(retry_conflicts(statement))
        await asyncio.sleep(0.3)  # the statement holds row 2 and waits for row 1
        # the cycle: the holder asks for row 2; at the statement's deadlock_timeout the database aborts it,
        # the holder gets row 2, and the statement's rerun waits for row 1 until the holder commits
        await asyncio.wait_for(holder.execute("UPDATE dl SET v = v + 1 WHERE id = 2"), 5)
        holder_has_row_2.set()
        await tx.commit()
        assert await asyncio.wait_for(task, 10) == "UPDATE 1"
        assert len(runs) == 2 and CONFLICT_RETRIES._value.get() == before + 1
        assert [r["v"] for r in await holder.fetch("SELECT v FROM dl ORDER BY id")] == [11, 11]
    finally:
        await holder.close()
        await other.close()


async def test_a_conflict_that_keeps_coming_back_is_answered_503_after_the_last_attempt():
    calls = []

    async def always() -> None:
        calls.append(1)
        raise pgx.DeadlockDetectedError("deadlock detected")

    with pytest.raises(pgx.DeadlockDetectedError):
        await retry_conflicts(always)
    assert len(calls) == CONFLICT_ATTEMPTS
    assert database_error(pgx.DeadlockDetectedError("d")).reason == "database_conflict"
