"""Database failures a caller cannot fix, in two classes shared by every surface.

``DB_DOWN``: the database is unreachable or refused the connection (503, retry later).
``DB_RETRY``: the database asked to retry the transaction (serialization failure, deadlock).
"""

from __future__ import annotations

import asyncpg

DB_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    ConnectionError,
    OSError,
)
DB_RETRY: tuple[type[BaseException], ...] = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
