-- Named queries of the KV surface (broker/kv).

-- name: kv_apply
-- Every op of one call in one round trip; the parameters are built by broker.kv.calls.KvApply.
SELECT queen_kv_apply(p_tenant => $1, p_ops => $2::jsonb, p_base => $3, p_budget => $4, p_period_s => $5,
                      p_meter => $6)

-- name: kv_prune
-- Remove at most $1 expired rows; returns how many went.
SELECT queen_kv_prune($1)
