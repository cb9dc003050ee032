-- Bench-only SQL for bench_sweep.py (not loaded by the broker).

-- name: seed_due
-- $4 due timers for tenant $1 in queue $2 (keys prefixed $3), all due one second ago; $5 = payload_ready
-- (true: as POST /api/v1/timers stores these JSON payloads, fired inside the database; false: packed in Python).
INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload, deliver_at, due_at,
                          producer_sub, payload_ready)
SELECT $1, $2, $3 || g, 'p' || (g % 8), md5($3 || g), gen_random_uuid(),
       convert_to('{"n":' || g || ',"kind":"reminder"}', 'UTF8'),
       now() - interval '1 second', now() - interval '1 second', 'bench', $5::boolean
FROM generate_series(1, $4::integer) AS g;

-- name: ensure_tenant
INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: bare_take
-- The floor of a claim: delete up to $2 due rows of tenant $1 (SKIP LOCKED) and return them: no lease,
-- no token, no second pass over the rows.
DELETE FROM queen_timers t
WHERE (t.tenant, t.queue, t.timer_key) IN (
    SELECT d.tenant, d.queue, d.timer_key FROM queen_timers d
    WHERE d.tenant = $1 AND d.due_at <= now()
    ORDER BY d.due_at LIMIT $2
    FOR UPDATE SKIP LOCKED)
RETURNING t.queue, t.partition, t.message_id, t.txn, t.payload, t.producer_sub, t.deliver_at, t.timer_key;

-- name: bare_push
-- ... and write them into the log through the same queen_push the sweeper uses ($6 = row count).
-- (Calling queen_push in the same statement as the DELETE, as a LATERAL over its aggregate, was tried:
-- it slowed down round after round, so the floor is two statements in one transaction.)
SELECT count(*) FILTER (WHERE p.status = 'queued')
FROM queen_push($1, $2::text[], $3::text[], $4::uuid[], $5::text[], array_fill(NULL::uuid, ARRAY[$6::integer]),
                $7::bytea[], array_fill(0::smallint, ARRAY[$6::integer]), array_fill(NULL::text, ARRAY[$6::integer]),
                $8::text[], array_fill(NULL::bigint, ARRAY[$6::integer])) AS p;
