-- Named queries of the ephemeral queues (broker/ephemeral). Each is one function call of
-- broker/sql/functions/ephemeral.sql, one round trip.

-- name: eph_configure
-- The parameters of eph_configure, eph_pop and eph_ack are built by broker.ephemeral.calls, in $n order.
-- A NULL option keeps the stored (or default) one.
SELECT queen_eph_configure(p_tenant => $1, p_queue => $2, p_max_bytes => $3, p_max_length => $4, p_policy => $5,
                           p_ttl_s => $6, p_lease_s => $7, p_retry_limit => $8, p_window_ms => $9,
                           p_window_count => $10)

-- name: eph_push
-- $1 tenant, $2 queue, $3 partition, $4 payloads (JSON texts), $5 metering period seconds.
SELECT pushed, dropped FROM queen_eph_push($1, $2, $3, $4::text[]::jsonb[], $5)

-- name: eph_pop
SELECT seq, partition, payload, attempts, last_error, tag, window_ms, window_count, due_ms
FROM queen_eph_pop(p_tenant => $1, p_queue => $2, p_partition => $3, p_grp => $4, p_batch => $5, p_auto_ack => $6)

-- name: eph_ack
SELECT idx, outcome
FROM queen_eph_ack(p_tenant => $1, p_queue => $2, p_grp => $3, p_tags => $4::text[], p_seqs => $5::bigint[],
                   p_attempts => $6::integer[], p_statuses => $7::text[], p_errors => $8::text[])

-- name: eph_reset
SELECT queen_eph_reset($1, $2)

-- name: eph_delete
SELECT queen_eph_delete($1, $2)

-- name: eph_list
SELECT queen_eph_list($1)

-- name: eph_depth
SELECT queen_eph_depth($1, $2)

-- name: eph_sweep
-- The ephemeral-expiry loop: drop expired messages of every queue with a TTL (about $1 at most), forget
-- implicit queues empty and idle for $2 seconds.
SELECT queen_eph_sweep($1, $2)
