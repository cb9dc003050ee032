-- queen_push, fourth body: the general path's duplicate lookup is a correlated probe per item (same
-- signature, rows and semantics as 0016; the one-partition fast path is unchanged). With the
-- (tenant, txn) index gone (0016), the general path's LEFT JOIN against queen_messages was planned
-- (generic plan, made once per connection) as a nested loop on the unique (tenant, partition_id, txn) index with only tenant and txn as index conditions (partition_id
-- a join filter): a scan of the tenant's whole index per item, so a batch over several partitions (the
-- sweeper's) grew slower as the log grew (1,000 items over 8 partitions: 43 ms on a fresh database,
-- 390 ms eight batches later; EXPLAIN showed 0.3 ms per probe). A scalar subquery is never flattened
-- into the join: it runs per item with all three key columns bound, one unique-index probe each.
-- (Measured after the change: 1,000 items over 8 partitions 18-24 ms flat over eight batches; the
-- same correlated form in the fast path got a plan that grew with the partition, so it keeps its join,
-- which binds partition_id as a parameter: 18-24 ms flat for 1,000 items into one partition.)

CREATE OR REPLACE FUNCTION queen_push(
    p_tenant      text,
    p_queues      text[],
    p_partitions  text[],
    p_ids         uuid[],
    p_txns        text[],
    p_traces      uuid[],
    p_payloads    bytea[],
    p_codecs      smallint[],
    p_key_ids     text[],
    p_subs        text[],
    p_deadline_ms bigint[]
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id uuid, seq bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_new  integer;
    v_q    text := p_queues[1];
    v_p    text := p_partitions[1];
    v_pid  uuid;
    v_next bigint;
BEGIN
    -- Fast path: every item goes to one partition (what a client batch does). Scalar lookups by key,
    -- and when the partition exists (the common case) nothing else is looked at: its row lock is
    -- taken by the same statement that reads its next offset.
    IF v_q IS NOT NULL AND v_p IS NOT NULL AND v_q = ALL (p_queues) AND v_p = ALL (p_partitions) THEN
        SELECT qp.id, qp.next_seq INTO v_pid, v_next FROM queen_partitions qp
        WHERE qp.tenant = p_tenant AND qp.queue = v_q AND qp.name = v_p
        FOR UPDATE;
        IF NOT FOUND THEN
            IF NOT EXISTS (SELECT 1 FROM queen_tenants t WHERE t.tenant = p_tenant) THEN
                INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
            END IF;
            IF NOT EXISTS (SELECT 1 FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = v_q) THEN
                INSERT INTO queen_queues (tenant, name) VALUES (p_tenant, v_q) ON CONFLICT DO NOTHING;
            END IF;
            INSERT INTO queen_partitions (tenant, id, queue, name)
            VALUES (p_tenant, gen_random_uuid(), v_q, v_p)
            ON CONFLICT (tenant, queue, name) DO NOTHING;
            GET DIAGNOSTICS v_new = ROW_COUNT;
            IF v_new > 0 THEN
                UPDATE queen_queues qq SET partition_count = (
                    SELECT count(*) FROM queen_partitions qp WHERE qp.tenant = p_tenant AND qp.queue = v_q)
                WHERE qq.tenant = p_tenant AND qq.name = v_q;
            END IF;
            SELECT qp.id, qp.next_seq INTO v_pid, v_next FROM queen_partitions qp
            WHERE qp.tenant = p_tenant AND qp.queue = v_q AND qp.name = v_p
            FOR UPDATE;
        END IF;

        RETURN QUERY
        WITH items AS (
            SELECT u.ord::integer AS i, u.id, u.t, u.tr, u.pl, u.c, u.k, u.s, u.d
            FROM unnest(p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids, p_subs, p_deadline_ms)
                 WITH ORDINALITY AS u(id, t, tr, pl, c, k, s, d, ord)
        ), located AS (
            SELECT it.*, ex.id AS existing_id,
                   first_value(it.i) OVER w AS first_i, first_value(it.id) OVER w AS first_id
            FROM items it
            LEFT JOIN queen_messages ex ON ex.tenant = p_tenant AND ex.partition_id = v_pid AND ex.txn = it.t
            WINDOW w AS (PARTITION BY it.t ORDER BY it.i)
        ), numbered AS (
            SELECT l.*, (l.existing_id IS NULL AND l.first_i = l.i) AS fresh,
                   v_next - 1 + row_number() OVER (
                       PARTITION BY (l.existing_id IS NULL AND l.first_i = l.i) ORDER BY l.i) AS rn_seq
            FROM located l
        ), ins AS (
            INSERT INTO queen_messages (tenant, partition_id, seq, id, txn, trace_id, payload, codec, key_id,
                                        producer_sub, deadline_at)
            SELECT p_tenant, v_pid, n.rn_seq, n.id, n.t, n.tr, n.pl, coalesce(n.c, 0), n.k, n.s,
                   CASE WHEN n.d IS NULL THEN NULL ELSE now() + n.d * interval '1 millisecond' END
            FROM numbered n WHERE n.fresh
            ORDER BY n.rn_seq
        ), bump AS (
            UPDATE queen_partitions qp SET next_seq = v_next + c.n, last_push_at = now()
            FROM (SELECT count(*) AS n FROM numbered n WHERE n.fresh) c
            WHERE qp.tenant = p_tenant AND qp.id = v_pid AND c.n > 0
        )
        SELECT n.i, CASE WHEN n.fresh THEN 'queued' ELSE 'duplicate' END,
               coalesce(n.existing_id, n.first_id), v_pid, CASE WHEN n.fresh THEN n.rn_seq END
        FROM numbered n ORDER BY n.i;

        PERFORM queen_wake(p_tenant, ARRAY[v_q]);
        RETURN;
    END IF;

    -- General path: items over several partitions (a transaction bundle, a timer sweep).
    IF NOT EXISTS (SELECT 1 FROM queen_tenants t WHERE t.tenant = p_tenant) THEN
        INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    END IF;

    INSERT INTO queen_queues (tenant, name)
    SELECT p_tenant, d.q
    FROM (SELECT DISTINCT x.q FROM unnest(p_queues) AS x(q)) d
    WHERE NOT EXISTS (SELECT 1 FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = d.q)
    ORDER BY d.q
    ON CONFLICT DO NOTHING;

    INSERT INTO queen_partitions (tenant, id, queue, name)
    SELECT p_tenant, gen_random_uuid(), d.q, d.p
    FROM (SELECT DISTINCT x.q, x.p FROM unnest(p_queues, p_partitions) AS x(q, p)) d
    WHERE NOT EXISTS (SELECT 1 FROM queen_partitions qp
                      WHERE qp.tenant = p_tenant AND qp.queue = d.q AND qp.name = d.p)
    ORDER BY d.q, d.p
    ON CONFLICT (tenant, queue, name) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    IF v_new > 0 THEN
        UPDATE queen_queues qq SET partition_count = (
            SELECT count(*) FROM queen_partitions qp WHERE qp.tenant = p_tenant AND qp.queue = qq.name)
        WHERE qq.tenant = p_tenant AND qq.name IN (SELECT DISTINCT x.q FROM unnest(p_queues) AS x(q));
    END IF;

    PERFORM 1 FROM queen_partitions qp
    WHERE qp.tenant = p_tenant
      AND (qp.queue, qp.name) IN (SELECT x.q, x.p FROM unnest(p_queues, p_partitions) AS x(q, p))
    ORDER BY qp.queue, qp.name
    FOR UPDATE;

    RETURN QUERY
    WITH items AS (
        SELECT u.ord::integer AS i, u.q, u.p, u.id, u.t, u.tr, u.pl, u.c, u.k, u.s, u.d
        FROM unnest(p_queues, p_partitions, p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids,
                    p_subs, p_deadline_ms) WITH ORDINALITY AS u(q, p, id, t, tr, pl, c, k, s, d, ord)
    ), located AS (
        SELECT it.*, qp.id AS pid, qp.next_seq,
               (SELECT m.id FROM queen_messages m
                WHERE m.tenant = p_tenant AND m.partition_id = qp.id AND m.txn = it.t) AS existing_id,
               first_value(it.i) OVER w AS first_i, first_value(it.id) OVER w AS first_id
        FROM items it
        JOIN queen_partitions qp ON qp.tenant = p_tenant AND qp.queue = it.q AND qp.name = it.p
        WINDOW w AS (PARTITION BY qp.id, it.t ORDER BY it.i)
    ), numbered AS (
        SELECT l.*, (l.existing_id IS NULL AND l.first_i = l.i) AS fresh,
               l.next_seq - 1 + row_number() OVER (
                   PARTITION BY l.pid, (l.existing_id IS NULL AND l.first_i = l.i) ORDER BY l.i) AS rn_seq
        FROM located l
    ), ins AS (
        INSERT INTO queen_messages (tenant, partition_id, seq, id, txn, trace_id, payload, codec, key_id,
                                    producer_sub, deadline_at)
        SELECT p_tenant, n.pid, n.rn_seq, n.id, n.t, n.tr, n.pl, coalesce(n.c, 0), n.k, n.s,
               CASE WHEN n.d IS NULL THEN NULL ELSE now() + n.d * interval '1 millisecond' END
        FROM numbered n WHERE n.fresh
        ORDER BY n.pid, n.rn_seq
    ), bump AS (
        UPDATE queen_partitions qp SET next_seq = qp.next_seq + c.n, last_push_at = now()
        FROM (SELECT n.pid, count(*) AS n FROM numbered n WHERE n.fresh GROUP BY n.pid) c
        WHERE qp.tenant = p_tenant AND qp.id = c.pid
    )
    SELECT n.i, CASE WHEN n.fresh THEN 'queued' ELSE 'duplicate' END,
           coalesce(n.existing_id, n.first_id), n.pid, CASE WHEN n.fresh THEN n.rn_seq END
    FROM numbered n ORDER BY n.i;

    PERFORM queen_wake(p_tenant, p_queues);
END
$$;
