-- Named queries of the KV surface (broker/kv).

-- name: kv_apply
-- Every op of one call in one round trip: $1 tenant, $2 normalised ops (jsonb array), $3 base index,
-- $4 read byte budget, $5 metering period seconds, $6 meter the ops (kv_ops) in this transaction.
SELECT queen_kv_apply($1, $2::jsonb, $3, $4, $5, $6)

-- name: kv_prune
-- Remove at most $1 expired rows; returns how many went.
SELECT queen_kv_prune($1)
