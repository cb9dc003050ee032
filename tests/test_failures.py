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


@pytest.mark.parametrize("exc", SHUTDOWN_FAILURES[:3], ids=lambda e: type(e).__name__)
async def test_the_error_middleware_answers_503_not_500(exc):
    async def handler(_request: web.Request) -> web.Response:
        raise exc

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/x", handler)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/x")
        assert r.status == 503, await r.text()
        body = await r.json()
        assert body["error"] == "unavailable" and body["reason"] == "database_unavailable"
        assert r.headers["Retry-After"] == "1"


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
    assert [failure_class(_Answered(s)) for s in ("23505", "22P02", "P0001")] == ["permanent"] * 3
