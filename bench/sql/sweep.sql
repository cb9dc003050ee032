-- Bench-only SQL for bench_sweep.py (not loaded by the broker).

-- name: seed_due
-- $4 due timers for tenant $1 in queue $2 (keys prefixed $3), all due one second ago.
INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, deliver_at, due_at,
                          producer_sub)
SELECT $1, $2, $3 || g, 'p' || (g % 8), md5($3 || g), gen_random_uuid(),
       convert_to('{"n":' || g || ',"kind":"reminder"}', 'UTF8'),
       now() - interval '1 second', now() - interval '1 second', 'bench'
FROM generate_series(1, $4::integer) AS g;

-- name: ensure_tenant
INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: bare_fire
-- The floor of a fire: take up to $2 due rows of tenant $1 (SKIP LOCKED), delete them and write their
-- messages through queen_push, in one statement: no lease, no token, no packing in between.
WITH gone AS (
    DELETE FROM queen_timers t
    WHERE (t.tenant, t.queue, t.timer_key) IN (
        SELECT d.tenant, d.queue, d.timer_key FROM queen_timers d
        WHERE d.tenant = $1 AND d.due_at <= now()
        ORDER BY d.due_at LIMIT $2
        FOR UPDATE SKIP LOCKED)
    RETURNING t.*
),
agg AS (
    SELECT array_agg(queue ORDER BY queue, partition, deliver_at, timer_key) AS qs,
           array_agg(partition ORDER BY queue, partition, deliver_at, timer_key) AS ps,
           array_agg(message_id ORDER BY queue, partition, deliver_at, timer_key) AS ids,
           array_agg(txn ORDER BY queue, partition, deliver_at, timer_key) AS txns,
           array_agg(payload ORDER BY queue, partition, deliver_at, timer_key) AS pls,
           array_agg(producer_sub ORDER BY queue, partition, deliver_at, timer_key) AS subs,
           count(*)::integer AS n
    FROM gone
)
SELECT count(*) FILTER (WHERE p.status = 'queued')
FROM agg, LATERAL queen_push($1, agg.qs, agg.ps, agg.ids, agg.txns, array_fill(NULL::uuid, ARRAY[agg.n]),
                             agg.pls, array_fill(0::smallint, ARRAY[agg.n]), array_fill(NULL::text, ARRAY[agg.n]),
                             agg.subs, array_fill(NULL::bigint, ARRAY[agg.n])) AS p;
