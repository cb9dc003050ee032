-- Queries of the store itself (not of a surface).

-- name: store_ping
-- /health: does the database answer on a pooled connection, which server is it, and can it write?
SELECT host(inet_server_addr()) || ':' || inet_server_port()::text AS server, pg_is_in_recovery() AS in_recovery,
       current_setting('transaction_read_only') AS read_only

-- name: store_warm_types
-- Prepared (never run) by every new pooled connection: asyncpg has no built-in codec for these array
-- types and introspects each (a recursive walk of pg_type) the first time a statement uses it; described
-- here once, their codecs are cached for the connection's life, not looked up inside a request.
-- The hot statements' array parameters and results: push (bytea[], smallint[], bigint[], uuid[]),
-- timers (boolean[], timestamptz[], tid[]), and the rest the named queries use.
SELECT $1::bytea[], $2::int2[], $3::int4[], $4::int8[], $5::uuid[], $6::bool[], $7::text[], $8::timestamptz[],
       $9::float8[], $10::tid[], $11::jsonb[]
