"""Database failures a caller cannot fix, in two classes shared by every surface, and the one 503 each
of them answers.

``DB_DOWN``: the database is unreachable, refused the connection, is shutting down, or the connection
broke under a call (503 ``unavailable`` / ``database_unavailable``, retry later). This includes
asyncpg's ``InternalClientError`` ("cannot switch to state N; another operation is in progress"),
which a connection raises when the server goes away between two protocol steps, and the server's
"operator intervention" class (57: admin/crash shutdown, cannot connect now, statement cancelled).
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

import asyncpg
from asyncpg import exceptions as pgx

from broker.errors import Unavailable

FROZEN_SQLSTATE = "57Q01"


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
)
DB_RETRY: tuple[type[BaseException], ...] = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
DB_FAILURE: tuple[type[BaseException], ...] = DB_RETRY + DB_DOWN

DOWN_REASON = "database_unavailable"
FROZEN_REASON = "tenant_frozen"
RETRY_REASON = "database_conflict"


def database_error(exc: BaseException) -> Unavailable:
    """The 503 for a database failure (``exc`` must be one of ``DB_FAILURE``)."""
    if isinstance(exc, TenantFrozenError):
        hint = getattr(exc, "hint", None) or ""
        after = int(hint) if hint.isdigit() else 1
        return Unavailable(FROZEN_REASON, "this tenant is being moved to another cell; retry after the pause",
                           code="unavailable", retry_after_s=after, extra={"retryAfterS": after})
    if isinstance(exc, DB_RETRY):
        return Unavailable(RETRY_REASON, f"the database asked to retry the call ({type(exc).__name__}); retry", code="unavailable")
    what = "did not answer in time" if isinstance(exc, TimeoutError) else "is unreachable or shutting down"
    return Unavailable(DOWN_REASON, f"the database {what} ({type(exc).__name__})", code="unavailable")


def describe(exc: BaseException) -> str:
    """Operator-facing detail for a database failure (class and message, bounded)."""
    return f"{type(exc).__name__}: {exc}"[:300]
