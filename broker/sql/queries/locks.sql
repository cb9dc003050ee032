-- Named queries of the locks surface (broker/locks).

-- name: locks_apply
-- Every op of one locks call in one round trip: $1 tenant, $2 normalised ops (jsonb array), $3 metering
-- period seconds. Returns {"results": [...]} index-aligned.
SELECT queen_locks_apply($1, $2::jsonb, $3)
