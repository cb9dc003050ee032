"""Database failures a caller cannot fix, in two classes shared by every surface, and the one 503 each
of them answers.

``DB_DOWN``: the database is unreachable, refused the connection, is shutting down, or the connection
broke under a call (503 ``unavailable`` / ``database_unavailable``, retry later). This includes
asyncpg's ``InternalClientError`` ("cannot switch to state N; another operation is in progress"),
which a connection raises when the server goes away between two protocol steps, and the server's
"operator intervention" class (57: admin/crash shutdown, cannot connect now, statement cancelled).
``DB_RETRY``: the database asked to retry the transaction (serialization failure, deadlock): 503
``unavailable`` / ``database_conflict``.

``database_error(exc)`` turns either into the ``Unavailable`` every surface answers (the HTTP error
middleware, the KV routes, ``/health``): one stable ``reason``, the exception's class in ``detail``.
"""

from __future__ import annotations

import asyncpg
from asyncpg import exceptions as pgx

from broker.errors import Unavailable

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
RETRY_REASON = "database_conflict"


def database_error(exc: BaseException) -> Unavailable:
    """The 503 for a database failure (``exc`` must be one of ``DB_FAILURE``)."""
    if isinstance(exc, DB_RETRY):
        return Unavailable(RETRY_REASON, f"the database asked to retry the call ({type(exc).__name__}); retry", code="unavailable")
    what = "did not answer in time" if isinstance(exc, TimeoutError) else "is unreachable or shutting down"
    return Unavailable(DOWN_REASON, f"the database {what} ({type(exc).__name__})", code="unavailable")


def describe(exc: BaseException) -> str:
    """Operator-facing detail for a database failure (class and message, bounded)."""
    return f"{type(exc).__name__}: {exc}"[:300]


# The SQLSTATEs of DB_FAILURE, for a failure known only by its code (an error a PL/pgSQL function caught
# and answered as a row): connection exceptions, insufficient resources, operator intervention, and the
# two "retry the transaction" states.
_TRANSIENT_CLASSES = ("08", "53", "57")
_TRANSIENT_STATES = frozenset({"40001", "40P01"})


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
