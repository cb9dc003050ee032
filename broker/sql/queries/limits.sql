-- Named queries of the limits, plans, switches and metering surface (broker/limits.py,
-- broker/metering.py, broker/http/admin_limits.py, broker/http/usage.py).

-- name: limits_state
-- One round trip for a worker's cache refresh: the cell switch, the seconds left in the current
-- metering period (by the database clock), and for each tenant of $1 its stored plan, its switches,
-- its usage in the current period and its gauges (at most 16 slot rows per counter; never a count
-- over the data). $2 = period seconds. With an empty $1 there is one row with tenant NULL.
SELECT c.suspended, c.kv_enabled,
       extract(epoch FROM queen_period_start(now(), $2) + $2 * interval '1 second' - now())::float8 AS period_left_s,
       t.tenant,
       p.timers_horizon_ms, p.max_payload_bytes, p.timers_row_quota, p.rate_limit_per_s,
       p.period_quota_messages, p.storage_quota_bytes,
       coalesce(s.timers_paused, false) AS timers_paused,
       coalesce((SELECT sum(u.messages) FROM queen_usage u
                 WHERE u.tenant = t.tenant AND u.period_start = queen_period_start(now(), $2)), 0)::bigint AS messages,
       coalesce((SELECT sum(g.storage_bytes) FROM queen_usage_gauges g WHERE g.tenant = t.tenant), 0)::bigint AS storage_bytes,
       coalesce((SELECT sum(g.timers_pending) FROM queen_usage_gauges g WHERE g.tenant = t.tenant), 0)::bigint AS timers_pending
FROM queen_cell_switches c
LEFT JOIN unnest($1::text[]) AS t(tenant) ON true
LEFT JOIN queen_tenant_plans p ON p.tenant = t.tenant
LEFT JOIN queen_tenant_switches s ON s.tenant = t.tenant
WHERE c.tenant = '*'

-- name: limits_rate_take
-- $1 tenant, $2 tokens wanted, $3 rate per second; returns 0 (granted) or ms to wait.
SELECT queen_rate_take($1, $2, $3)

-- name: limits_notify
-- Tell every worker of every broker to drop its cached state for tenant $1 ('*' = all).
SELECT pg_notify('queen_limits', $1)

-- name: limits_plan_get
SELECT tenant, timers_horizon_ms, max_payload_bytes, timers_row_quota, rate_limit_per_s,
       period_quota_messages, storage_quota_bytes, updated_at
FROM queen_tenant_plans WHERE tenant = $1

-- name: limits_plan_put
INSERT INTO queen_tenant_plans AS p (tenant, timers_horizon_ms, max_payload_bytes, timers_row_quota,
                                     rate_limit_per_s, period_quota_messages, storage_quota_bytes, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, now())
ON CONFLICT (tenant) DO UPDATE SET
    timers_horizon_ms = excluded.timers_horizon_ms, max_payload_bytes = excluded.max_payload_bytes,
    timers_row_quota = excluded.timers_row_quota, rate_limit_per_s = excluded.rate_limit_per_s,
    period_quota_messages = excluded.period_quota_messages, storage_quota_bytes = excluded.storage_quota_bytes,
    updated_at = now()
RETURNING tenant, timers_horizon_ms, max_payload_bytes, timers_row_quota, rate_limit_per_s,
          period_quota_messages, storage_quota_bytes, updated_at

-- name: limits_plan_delete
DELETE FROM queen_tenant_plans WHERE tenant = $1 RETURNING tenant

-- name: limits_paused_get
SELECT coalesce((SELECT timers_paused FROM queen_tenant_switches WHERE tenant = $1), false)

-- name: limits_paused_set
INSERT INTO queen_tenant_switches AS s (tenant, timers_paused, updated_at) VALUES ($1, $2, now())
ON CONFLICT (tenant) DO UPDATE SET timers_paused = excluded.timers_paused, updated_at = now()
RETURNING timers_paused

-- name: limits_kv_enabled_get
SELECT kv_enabled FROM queen_cell_switches WHERE tenant = '*'

-- name: limits_kv_enabled_set
UPDATE queen_cell_switches SET kv_enabled = $1, updated_at = now() WHERE tenant = '*' RETURNING kv_enabled

-- name: limits_suspended_get
SELECT suspended FROM queen_cell_switches WHERE tenant = '*'

-- name: limits_suspended_set
UPDATE queen_cell_switches SET suspended = $1, updated_at = now() WHERE tenant = '*' RETURNING suspended

-- name: metering_record
-- $1 tenant, $2 period seconds, $3 messages, $4 kv ops; inside the caller's transaction.
SELECT queen_meter($1, $2, $3, $4)

-- name: usage_tenants
-- Current-period usage and gauges; $1 = period seconds, $2 = tenant or NULL for every tenant with a
-- meter or a gauge row.
WITH tenants AS (
    SELECT tenant FROM queen_usage WHERE period_start = queen_period_start(now(), $1) AND ($2::text IS NULL OR tenant = $2)
    UNION
    SELECT tenant FROM queen_usage_gauges WHERE $2::text IS NULL OR tenant = $2
    UNION
    SELECT $2::text WHERE $2::text IS NOT NULL
)
SELECT t.tenant,
       queen_kv_ts(queen_period_start(now(), $1)) AS period_start,
       queen_kv_ts(queen_period_start(now(), $1) + $1 * interval '1 second') AS period_end,
       coalesce((SELECT sum(u.messages) FROM queen_usage u
                 WHERE u.tenant = t.tenant AND u.period_start = queen_period_start(now(), $1)), 0)::bigint AS messages,
       coalesce((SELECT sum(u.kv_ops) FROM queen_usage u
                 WHERE u.tenant = t.tenant AND u.period_start = queen_period_start(now(), $1)), 0)::bigint AS kv_ops,
       coalesce((SELECT sum(g.storage_bytes) FROM queen_usage_gauges g WHERE g.tenant = t.tenant), 0)::bigint AS storage_bytes,
       coalesce((SELECT sum(g.timers_pending) FROM queen_usage_gauges g WHERE g.tenant = t.tenant), 0)::bigint AS timers_pending
FROM tenants t
ORDER BY t.tenant

-- name: usage_period
-- The current metering period's bounds; $1 = period seconds.
SELECT queen_kv_ts(queen_period_start(now(), $1)) AS period_start,
       queen_kv_ts(queen_period_start(now(), $1) + $1 * interval '1 second') AS period_end
