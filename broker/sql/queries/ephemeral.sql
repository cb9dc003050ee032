-- Named queries of the ephemeral queues (broker/ephemeral). Each is one function call of
-- broker/sql/functions/ephemeral.sql, one round trip.

-- name: eph_configure
-- $1 tenant, $2 queue, $3 maxBytes, $4 maxLength, $5 policy, $6 ttlSeconds, $7 leaseSeconds,
-- $8 retryLimit, $9 windowBuffer ms, $10 windowBuffer count (NULL: the default).
SELECT queen_eph_configure($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)

-- name: eph_push
-- $1 tenant, $2 queue, $3 partition, $4 payloads (JSON texts), $5 metering period seconds.
SELECT pushed, dropped FROM queen_eph_push($1, $2, $3, $4::text[]::jsonb[], $5)

-- name: eph_pop
-- $1 tenant, $2 queue, $3 partition (NULL: any), $4 group, $5 batch, $6 autoAck.
SELECT seq, partition, payload, attempts, last_error, tag, window_ms, window_count, due_ms
FROM queen_eph_pop($1, $2, $3, $4, $5, $6)

-- name: eph_ack
-- $1 tenant, $2 queue, $3 group, then per item: $4 tags, $5 seqs, $6 attempts, $7 statuses, $8 errors.
SELECT idx, outcome FROM queen_eph_ack($1, $2, $3, $4::text[], $5::bigint[], $6::integer[], $7::text[], $8::text[])

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
