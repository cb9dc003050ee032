-- queen_timers_fire, same signature and semantics as in 0020: the queue, partition and txn arrays
-- handed to queen_push now carry the default collation. Aggregated straight from queen_timers' COLLATE
-- "C" columns they made queen_push's call collation "C", and queen_push planned that call ~50x slower
-- (2.4 s instead of 50 ms for 1,000 items, measured), which bounded the fire at a few hundred timers/s.

CREATE OR REPLACE FUNCTION queen_timers_fire(
    p_token        uuid,
    g_tenants      text[],
    g_queues       text[],
    g_keys         text[],
    g_payloads     bytea[],
    g_codecs       smallint[],
    f_tenants      text[],
    f_queues       text[],
    f_keys         text[],
    f_errors       text[],
    f_costs        integer[],
    p_max_attempts integer,
    p_backoff_base_ms bigint,
    p_backoff_cap_ms  bigint
) RETURNS TABLE (kind text, tenant text, queue text, timer_key text, lag_s double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    FOR r IN
        WITH inp AS (
            SELECT * FROM unnest(g_tenants, g_queues, g_keys, g_payloads, g_codecs) AS u(te, q, k, pl, c)
        ),
        gone AS (
            DELETE FROM queen_timers t USING inp
            WHERE t.tenant = inp.te AND t.queue = inp.q AND t.timer_key = inp.k AND t.claim_token = p_token
            RETURNING t.tenant, t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.payload,
                      t.payload_zstd, t.key_id, t.producer_sub, t.deliver_at
        ),
        j AS (
            SELECT g.*, coalesce(inp.pl, g.payload) AS sealed,
                   CASE WHEN inp.pl IS NOT NULL THEN inp.c
                        WHEN g.payload_zstd THEN 1::smallint ELSE 0::smallint END AS codec
            FROM gone g JOIN inp ON inp.te = g.tenant AND inp.q = g.queue AND inp.k = g.timer_key
        )
        SELECT j.tenant,
               array_agg(j.queue COLLATE "default" ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS qs,
               array_agg(j.partition COLLATE "default" ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS ps,
               array_agg(j.message_id ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS ids,
               array_agg(j.txn COLLATE "default" ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS txns,
               array_agg(j.sealed ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS pls,
               array_agg(j.codec ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS cs,
               array_agg(j.key_id ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS kids,
               array_agg(j.producer_sub ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS subs,
               array_agg(j.timer_key ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS keys,
               array_agg(j.deliver_at ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS dats
        FROM j GROUP BY j.tenant ORDER BY j.tenant
    LOOP
        RETURN QUERY
        SELECT CASE WHEN qp.st = 'queued' THEN 'fired' ELSE 'duplicate' END,
               r.tenant, r.qs[qp.n], r.keys[qp.n],
               extract(epoch FROM clock_timestamp() - r.dats[qp.n])::double precision
        FROM queen_push(r.tenant, r.qs, r.ps, r.ids, r.txns,
                        array_fill(NULL::uuid, ARRAY[cardinality(r.qs)]), r.pls, r.cs, r.kids, r.subs,
                        array_fill(NULL::bigint, ARRAY[cardinality(r.qs)]))
             WITH ORDINALITY AS qp(i, st, mid, pid, seq, n);
    END LOOP;

    IF cardinality(f_tenants) > 0 THEN
        RETURN QUERY
        WITH inp AS (
            SELECT * FROM unnest(f_tenants, f_queues, f_keys, f_errors, f_costs) AS u(te, q, k, err, cost)
        ),
        upd AS (
            UPDATE queen_timers t
               SET attempts = t.attempts + inp.cost, failures = t.failures + 1, last_error = inp.err,
                   claim_token = NULL, claimed_until = NULL, claimed_by = NULL, updated_at = now(),
                   due_at = now() + least(p_backoff_cap_ms,
                                          p_backoff_base_ms * power(2, least(t.failures, 40))::bigint)
                                    * interval '1 millisecond'
            FROM inp
            WHERE t.tenant = inp.te AND t.queue = inp.q AND t.timer_key = inp.k AND t.claim_token = p_token
            RETURNING t.tenant, t.queue, t.timer_key, t.attempts
        )
        SELECT CASE WHEN upd.attempts >= p_max_attempts THEN 'dlq' ELSE 'backoff' END,
               upd.tenant, upd.queue, upd.timer_key, NULL::double precision
        FROM upd;

        -- Out of budget: the row leaves for its queue's DLQ (the rows just updated are locked by us).
        WITH inp AS (
            SELECT * FROM unnest(f_tenants, f_queues, f_keys) AS u(te, q, k)
        ),
        dead AS (
            DELETE FROM queen_timers t USING inp
            WHERE t.tenant = inp.te AND t.queue = inp.q AND t.timer_key = inp.k
              AND t.claim_token IS NULL AND t.attempts >= p_max_attempts
            RETURNING t.*
        )
        INSERT INTO queen_dlq (tenant, id, queue, partition_id, partition, consumer_group, synthetic,
                               message_id, txn, payload, codec, key_id, producer_sub, error,
                               retry_count, original_created_at)
        SELECT d.tenant, gen_random_uuid(), d.queue, qp.id, d.partition, '__timers__', true,
               d.message_id, d.txn, d.payload, CASE WHEN d.payload_zstd THEN 1 ELSE 0 END,
               d.key_id, d.producer_sub, d.last_error, d.attempts, d.created_at
        FROM dead d
        LEFT JOIN queen_partitions qp ON qp.tenant = d.tenant AND qp.queue = d.queue AND qp.name = d.partition;
    END IF;
END
$$;
