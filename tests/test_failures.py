"""Database failure classification: every failure of the database (down, shutting down, a connection
broken between two protocol steps, a retry request) is a 503 with one stable reason on every surface."""

from __future__ import annotations

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from asyncpg import exceptions as pgx

from broker.app import error_middleware
from broker.store.failures import DB_FAILURE, database_error, failure_class

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

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/x", handler)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/x")
        return r.status, await r.json(), dict(r.headers)


@pytest.mark.parametrize("exc", SHUTDOWN_FAILURES[:3], ids=lambda e: type(e).__name__)
async def test_the_error_middleware_answers_503_not_500(exc):
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
