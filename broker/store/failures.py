"""Database failures a caller cannot fix, in two classes shared by every surface, and the one 503 each
of them answers.

``DB_DOWN``: the database is unreachable, refused the connection, is shutting down, or the connection
broke under a call (503 ``unavailable`` / ``database_unavailable``, retry later). This includes
asyncpg's ``InternalClientError`` ("cannot switch to state N; another operation is in progress"),
which a connection raises when the server goes away between two protocol steps, and the server's
"operator intervention" class (57: admin/crash shutdown, cannot connect now, statement cancelled).
A server that cannot take writes counts as down too: a standby or a demoted primary (25006
read_only_sql_transaction: "cannot execute ... in a read-only transaction" / "during recovery"), one
still recovering (57P03), and a hot-standby conflict (``is_standby_answer``). A call that met such a
server has not changed anything, and the connection it used points at the wrong node: ``database_error``
then has the pools replace their connections (``broker.store.pool.drop_stale``), so the next attempt
connects again and finds the primary, whatever the DSN's shape.
``DB_RETRY``: the database asked to retry the transaction (serialization failure, deadlock): 503
``unavailable`` / ``database_conflict``.

A tenant frozen by ``queen tenant move`` (broker/cells/move.py) is refused by the database itself: its
guard trigger raises SQLSTATE ``57Q01`` (class 57, so it is a ``DB_DOWN`` error for every loop that
only asks "transient?") and this answers 503 ``unavailable`` / ``tenant_frozen`` with the Retry-After the
freeze row names, in the header and in the envelope (``retryAfterS``).

``database_error(exc)`` turns either into the ``Unavailable`` every surface answers (the HTTP error
middleware, the KV routes, ``/health``): one stable ``reason``, the exception's class in ``detail``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from asyncpg import exceptions as pgx

from broker.errors import ApiError, Unavailable
from broker.metrics import CONFLICT_RETRIES
from broker.store.pool import drop_stale

FROZEN_SQLSTATE = "57Q01"
T = TypeVar("T")


class TenantFrozenError(pgx.OperatorInterventionError):
    """SQLSTATE 57Q01, raised by the freeze guard (broker/sql/functions/cells.sql). Defining it registers
    the code with asyncpg, so the error arrives as this class: a class-57 ``DB_DOWN`` error (transient
    for the sweeper, re-raised by the coalescers) instead of an unknown one."""

    sqlstate = FROZEN_SQLSTATE


DB_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    pgx.OperatorInterventionError,  # 57P01 admin shutdown, 57P02 crash shutdown, 57P03, 57014
    pgx.InsufficientResourcesError,  # 53xxx: out of connections, memory, disk
    pgx.InternalClientError,  # a protocol step interrupted by the server going away
    ConnectionError,
    OSError,
    TimeoutError,
    pgx.ReadOnlySQLTransactionError,  # 25006: a standby, a demoted primary, default_transaction_read_only
)
DB_RETRY: tuple[type[BaseException], ...] = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
DB_FAILURE: tuple[type[BaseException], ...] = DB_RETRY + DB_DOWN
CONFLICT_ATTEMPTS = 3


async def retry_conflicts(call: Callable[[], Awaitable[T]], attempts: int = CONFLICT_ATTEMPTS) -> T:
    """Run ``call`` (one statement that is its own transaction) again when the database aborted it to
    resolve a conflict (``DB_RETRY``: a deadlock between concurrent pops and pushes creating a queue's
    partitions and cursors, a serialization failure): nothing of it committed, so running it again is the
    same request, and the caller never sees the conflict. The last attempt's failure propagates (503
    ``database_conflict``)."""
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except DB_RETRY:
            if attempt == attempts:
                raise
            CONFLICT_RETRIES.inc()
    raise AssertionError("unreachable")


DOWN_REASON = "database_unavailable"
FROZEN_REASON = "tenant_frozen"
RETRY_REASON = "database_conflict"


# SQLSTATEs a server answers while it is not (or not yet) a writable primary.
STANDBY_STATES = frozenset({"25006", "57P03"})


def is_standby_answer(exc: BaseException) -> bool:
    """Did a server that cannot take writes answer ``exc``? (read-only, starting up or recovering, a
    query cancelled by a hot-standby conflict: 40001 "... due to conflict with recovery", or a lock a
    standby cannot take: 0A000 "... while recovery is in progress")."""
    state = getattr(exc, "sqlstate", None)
    if state in STANDBY_STATES:
        return True
    return state in ("40001", "0A000") and "recovery" in str(exc)


def database_error(exc: BaseException) -> Unavailable:
    """The 503 for a database failure (``exc`` must be one of ``DB_FAILURE``); one a standby answered
    also drops the pooled connections (module docstring)."""
    if is_standby_answer(exc):
        drop_stale()
        return Unavailable(
            DOWN_REASON, f"the database server is not a writable primary ({type(exc).__name__}); retry", code="unavailable"
        )
    if isinstance(exc, TenantFrozenError):
        hint = getattr(exc, "hint", None) or ""
        after = int(hint) if hint.isdigit() else 1
        return Unavailable(FROZEN_REASON, "this tenant is being moved to another cell; retry after the pause",
                           code="unavailable", retry_after_s=after, extra={"retryAfterS": after})
    if isinstance(exc, DB_RETRY):
        return Unavailable(RETRY_REASON, f"the database asked to retry the call ({type(exc).__name__}); retry", code="unavailable")
    what = "did not answer in time" if isinstance(exc, TimeoutError) else "is unreachable or shutting down"
    return Unavailable(DOWN_REASON, f"the database {what} ({type(exc).__name__})", code="unavailable")


def api_error(exc: BaseException) -> ApiError | None:
    """What a surface answers for ``exc``: the ``ApiError`` itself, the 503 of ``database_error`` for a
    database failure (``DB_FAILURE``: down, shutting down, broken mid-call, timed out, a standby, or asked
    to retry; or a standby's refusal outside those classes, 0A000 "... during recovery"), None for
    anything else (a bug: the caller answers 500). The HTTP error middleware and the push lanes
    (broker/log/lanes.py) both answer by it."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, DB_FAILURE) or is_standby_answer(exc):
        return database_error(exc)
    return None


def describe(exc: BaseException) -> str:
    """Operator-facing detail for a database failure (class and message, bounded)."""
    return f"{type(exc).__name__}: {exc}"[:300]


# The SQLSTATEs of DB_FAILURE, for a failure known only by its code (an error a PL/pgSQL function caught
# and answered as a row): connection exceptions, insufficient resources, operator intervention, and the
# two "retry the transaction" states, and a server that cannot take writes (STANDBY_STATES).
_TRANSIENT_CLASSES = ("08", "53", "57")
_TRANSIENT_STATES = frozenset({"40001", "40P01"}) | STANDBY_STATES


def failure_class(exc: BaseException) -> str:
    """``transient`` (the database's state, not the work: retrying the same work may succeed) or
    ``permanent`` (the database refused this work). The timers' fire spends an attempt only on a
    permanent failure."""
    if isinstance(exc, DB_FAILURE):  # incl. InternalClientError: a connection broken mid-protocol
        return "transient"
    state = getattr(exc, "sqlstate", None)
    if state and (state in _TRANSIENT_STATES or state.startswith(_TRANSIENT_CLASSES)):
        return "transient"
    return "permanent"
