-- Named queries of the tenant mover (broker/cells/move.py).

-- name: cells_tables
SELECT queen_cells_tables() AS tbl

-- name: cells_columns
-- The stored columns of a table, in order (the copy names them, so column order never matters).
SELECT a.attname::text AS col FROM pg_attribute a
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum

-- name: cells_census
SELECT tbl, n FROM queen_cells_census($1)

-- name: cells_forget
SELECT queen_cells_forget($1)

-- name: cells_schema
-- The schema a database runs: its migrations and its functions' checksum (a tenant moves only between
-- cells that run the same).
SELECT (SELECT array_agg(version ORDER BY version) FROM queen_schema_migrations) AS versions,
       (SELECT checksum FROM queen_schema_functions LIMIT 1) AS functions

-- name: cells_freeze_lock
-- Waits for every transaction that has written to a guarded table to end, and holds new writers until
-- the freeze commits (broker/sql/functions/cells.sql).
LOCK TABLE queen_tenant_freeze IN ACCESS EXCLUSIVE MODE

-- name: cells_freeze_set
INSERT INTO queen_tenant_freeze (tenant, state, peer, retry_after_s) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant) DO UPDATE SET state = excluded.state, peer = excluded.peer,
    retry_after_s = excluded.retry_after_s, frozen_at = now()

-- name: cells_freeze_get
SELECT tenant, state, peer, retry_after_s, frozen_at FROM queen_tenant_freeze WHERE tenant = $1

-- name: cells_freeze_drop
DELETE FROM queen_tenant_freeze WHERE tenant = $1

-- name: cells_sequences
SELECT sequencename::text AS name, coalesce(last_value, 0) AS last_value FROM pg_sequences
WHERE schemaname = current_schema() AND sequencename LIKE 'queen\_%'

-- name: cells_sequence_raise
-- A sequence of the target moves up to at least the source's value: ids a sequence hands out (partition
-- numbers, KV versions, ephemeral offsets) are never reused, and the tenant's copied rows hold the
-- source's.
SELECT setval($1::text::regclass, $2::bigint)
WHERE $2::bigint > coalesce((SELECT last_value FROM pg_sequences
                             WHERE schemaname = current_schema() AND sequencename = $1::text), 0)

-- name: cells_wake
-- After a tenant arrives or leaves: sweepers re-read the next due instant, workers re-read its limits.
SELECT pg_notify('queen_timers', '0'), pg_notify('queen_limits', $1)

-- name: cells_queue_names
SELECT name::text FROM queen_queues WHERE tenant = $1

-- name: cells_wake_pollers
-- Long polls of the moved tenant still waiting in the source wake up (queen_push's own NOTIFY, see
-- broker/log/waiters.py), try again, meet the freeze and answer 503: the client's retry goes through
-- the proxy to the target instead of sitting out its wait in a cell that will never see a push.
SELECT pg_notify('queen_push', $1 || E'\t' || q) FROM unnest($2::text[]) AS u(q)
