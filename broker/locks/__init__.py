"""Locks and semaphores (``POST /api/v1/locks``, docs/protocol.md §5): validation (``ops``) and the
one-round-trip call with its admission (``service``). A permit is a KV row in the reserved namespace
``queen-locks`` (docs/decisions.md §8); the SQL is ``broker/sql/functions/locks.sql``. HTTP lives in
``broker.http.locks``."""
