-- The KV store: rows per (tenant, namespace, key), sequence-based versions, expiry compared with
-- now() in SQL (an expired row is never returned and never counts as existing, pruned or not).
-- queen_kv_apply (every op of one call, or of one transaction's kv rider, in ONE function call) and
-- the pruner are in broker/sql/functions/kv.sql.
CREATE TABLE queen_kv (
    tenant     text NOT NULL,
    ns         text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      jsonb NOT NULL,
    version    bigint NOT NULL,
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ns, key)
);
CREATE INDEX queen_kv_expiry ON queen_kv (tenant, expires_at) WHERE expires_at IS NOT NULL;

-- Versions are never reused, not even for a key deleted and created again. 0 means "absent".
CREATE SEQUENCE queen_kv_version AS bigint START 1;
