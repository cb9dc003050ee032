-- queen_timers_fire gains f_wrap: per failed row, whether its payload is itself the failure (not JSON,
-- not a zstd frame). Such a row reaches the DLQ with its bytes inside a JSON envelope
-- {"undeliverable": true, "error", "payloadZstd", "payloadBase64"}: the DLQ, like the log, stores JSON,
-- so GET /api/v1/dlq stays a JSON answer, and the operator still sees the original bytes.
DROP FUNCTION queen_timers_fire(uuid, text[], text[], text[], bytea[], smallint[], text[], text[], text[], text[],
                                integer[], integer, bigint, bigint);

CREATE FUNCTION queen_timers_fire(
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
    f_wrap         boolean[],
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
        -- A payload that is itself the failure (not JSON, not zstd) is kept inside a JSON envelope, so
        -- the DLQ holds JSON like every other stored message and the original bytes stay readable.
        WITH inp AS (
            SELECT * FROM unnest(f_tenants, f_queues, f_keys, f_wrap) AS u(te, q, k, wrap)
        ),
        dead AS (
            DELETE FROM queen_timers t USING inp
            WHERE t.tenant = inp.te AND t.queue = inp.q AND t.timer_key = inp.k
              AND t.claim_token IS NULL AND t.attempts >= p_max_attempts
            RETURNING t.*, inp.wrap
        )
        INSERT INTO queen_dlq (tenant, id, queue, partition_id, partition, consumer_group, synthetic,
                               message_id, txn, payload, codec, key_id, producer_sub, error,
                               retry_count, original_created_at)
        SELECT d.tenant, gen_random_uuid(), d.queue, qp.id, d.partition, '__timers__', true,
               d.message_id, d.txn,
               CASE WHEN coalesce(d.wrap, false)
                    THEN convert_to(json_build_object(
                             'undeliverable', true, 'error', d.last_error, 'payloadZstd', d.payload_zstd,
                             'payloadBase64', translate(encode(d.payload, 'base64'), E'\n', ''))::text, 'UTF8')
                    ELSE d.payload END,
               CASE WHEN coalesce(d.wrap, false) THEN 0 WHEN d.payload_zstd THEN 1 ELSE 0 END,
               CASE WHEN coalesce(d.wrap, false) THEN NULL ELSE d.key_id END,
               d.producer_sub, d.last_error, d.attempts, d.created_at
        FROM dead d
        LEFT JOIN queen_partitions qp ON qp.tenant = d.tenant AND qp.queue = d.queue AND qp.name = d.partition;
    END IF;
END
$$;
