-- Cells: a tenant frozen in this cell while it moves to another (`queen tenant move`, broker/cells/move.py).
--
-- A row here refuses every write of that tenant in this database: the guard triggers of
-- broker/sql/functions/cells.sql run in the writer's own transaction and raise SQLSTATE 57Q01, which
-- rolls the whole transaction back (nothing of it is half-written) and which every surface answers
-- with 503 tenant_frozen and Retry-After (broker/store/failures.py). PostgreSQL decides, not a cache.
--
-- state: 'moving_out' (this cell is the source: copying), 'moved' (the tenant lives elsewhere now:
-- this cell keeps nothing of it but this row, so a request that still reaches it is told to retry,
-- and the proxy has already been switched), 'moving_in' (this cell is the target: filled, not open yet).
-- peer names the other cell for operators; retry_after_s is what the 503 tells clients.
CREATE TABLE queen_tenant_freeze (
    tenant        text PRIMARY KEY,
    state         text NOT NULL CHECK (state IN ('moving_out', 'moved', 'moving_in')),
    peer          text,
    retry_after_s integer NOT NULL DEFAULT 1 CHECK (retry_after_s BETWEEN 1 AND 3600),
    frozen_at     timestamptz NOT NULL DEFAULT now()
);
