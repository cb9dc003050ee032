-- The operator's KV kill switch, cluster-wide: with kv_enabled = false every KV call is refused
-- (POST /api/v1/kv and the path routes: 503 kv_disabled with Retry-After; the transaction rider: 403
-- kv_disabled). Read by every worker through the limits cache (NOTIFYed on change).
ALTER TABLE queen_cell_switches ADD COLUMN kv_enabled boolean NOT NULL DEFAULT true;
