-- The message log, second step: pops skip the per-pop search for partitions a group has no cursor
-- for yet (a count on the queue row against a count on the group row says when there is nothing to
-- create), and hand rows out with RETURN NEXT instead of one query per message. queen_push keeps
-- queen_queues.partition_count; queen_pop keeps queen_groups.cursor_count. These definitions
-- supersede those of 0010 (same signatures and semantics).

ALTER TABLE queen_queues ADD COLUMN partition_count integer NOT NULL DEFAULT 0;
UPDATE queen_queues q SET partition_count = (
    SELECT count(*) FROM queen_partitions p WHERE p.tenant = q.tenant AND p.queue = q.name);
ALTER TABLE queen_groups ADD COLUMN cursor_count integer NOT NULL DEFAULT 0;
UPDATE queen_groups g SET cursor_count = (
    SELECT count(*) FROM queen_cursors c
    WHERE c.tenant = g.tenant AND c.queue = g.queue AND c.consumer_group = g.consumer_group);

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
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_new integer;
BEGIN
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
        SELECT it.*, qp.id AS pid, qp.next_seq, ex.id AS existing_id,
               first_value(it.i) OVER w AS first_i, first_value(it.id) OVER w AS first_id
        FROM items it
        JOIN queen_partitions qp ON qp.tenant = p_tenant AND qp.queue = it.q AND qp.name = it.p
        LEFT JOIN queen_messages ex ON ex.tenant = p_tenant AND ex.partition_id = qp.id AND ex.txn = it.t
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

CREATE OR REPLACE FUNCTION queen_pop(
    p_tenant text, p_queue text, p_partition text, p_group text, p_batch integer, p_max_partitions integer,
    p_auto_ack boolean, p_sub_mode text, p_sub_from timestamptz
) RETURNS TABLE (kind text, partition_id uuid, partition text, seq bigint, id uuid, txn text, trace_id uuid,
                 payload bytea, codec smallint, key_id text, producer_sub text, created_at timestamptz,
                 attempt integer, lease_id uuid, lease_until timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q         record;
    c         record;
    m         record;
    v_sub     timestamptz;
    v_lease   uuid := CASE WHEN p_auto_ack THEN NULL ELSE gen_random_uuid() END;
    v_until   timestamptz;
    v_left    integer := p_batch;
    v_given   integer;
    v_picked  integer;
    v_last    bigint;
    v_from    bigint;
    v_any     boolean := false;
    v_cursors integer;
    v_new     integer;
BEGIN
    SELECT qq.lease_time_s, qq.retry_limit, qq.dlq_enabled, qq.partition_count INTO q
    FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = p_queue;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'idle'::text, NULL::uuid, NULL::text, NULL::bigint, NULL::uuid, NULL::text,
            NULL::uuid, NULL::bytea, NULL::smallint, NULL::text, NULL::text, NULL::timestamptz, NULL::integer,
            NULL::uuid, NULL::timestamptz;
        RETURN;
    END IF;
    v_until := CASE WHEN p_auto_ack THEN NULL ELSE now() + q.lease_time_s * interval '1 second' END;

    SELECT g.subscribed_at, g.cursor_count INTO v_sub, v_cursors FROM queen_groups g
    WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.consumer_group = p_group;
    IF NOT FOUND THEN
        v_sub := CASE WHEN p_sub_from IS NOT NULL THEN p_sub_from
                      WHEN p_sub_mode = 'new' THEN now() END;
        INSERT INTO queen_groups (tenant, queue, consumer_group, subscribed_at)
        VALUES (p_tenant, p_queue, p_group, v_sub) ON CONFLICT DO NOTHING;
        SELECT g.subscribed_at, g.cursor_count INTO v_sub, v_cursors FROM queen_groups g
        WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.consumer_group = p_group;
    END IF;

    -- A cursor for every partition this group has not seen yet, starting where its subscription does.
    -- Skipped (the common case) when the group already has as many cursors as the queue has partitions.
    IF v_cursors < q.partition_count OR p_partition IS NOT NULL THEN
    INSERT INTO queen_cursors (tenant, partition_id, consumer_group, queue, acked_seq)
    SELECT p_tenant, p.id, p_group, p_queue,
           CASE WHEN v_sub IS NULL THEN 0 ELSE coalesce(
               (SELECT mm.seq FROM queen_messages mm
                WHERE mm.tenant = p_tenant AND mm.partition_id = p.id AND mm.created_at < v_sub
                ORDER BY mm.seq DESC LIMIT 1), 0) END
    FROM queen_partitions p
    WHERE p.tenant = p_tenant AND p.queue = p_queue AND (p_partition IS NULL OR p.name = p_partition)
      AND NOT EXISTS (SELECT 1 FROM queen_cursors cc WHERE cc.tenant = p_tenant AND cc.partition_id = p.id
                                                     AND cc.consumer_group = p_group)
    ORDER BY p.id
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    IF v_new > 0 THEN
        UPDATE queen_groups g SET cursor_count = (
            SELECT count(*) FROM queen_cursors cc
            WHERE cc.tenant = p_tenant AND cc.queue = p_queue AND cc.consumer_group = p_group)
        WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.consumer_group = p_group;
    END IF;
    END IF;

    FOR c IN
        SELECT cu.partition_id AS pid, cu.acked_seq, cu.lease_id AS old_lease, cu.lease_end_seq, p.name
        FROM queen_cursors cu
        JOIN queen_partitions p ON p.tenant = cu.tenant AND p.id = cu.partition_id
        WHERE cu.tenant = p_tenant AND cu.queue = p_queue AND cu.consumer_group = p_group
          AND (p_partition IS NULL OR p.name = p_partition)
          AND p.next_seq - 1 > cu.acked_seq
          AND (cu.lease_until IS NULL OR cu.lease_until <= now())
        ORDER BY cu.claimed_at NULLS FIRST
        LIMIT greatest(p_max_partitions, 1)
        FOR UPDATE OF cu SKIP LOCKED
    LOOP
        EXIT WHEN v_left <= 0;
        -- A lease that ran out is a failed delivery of everything it covered that is not done.
        IF c.old_lease IS NOT NULL AND c.lease_end_seq IS NOT NULL AND c.lease_end_seq > c.acked_seq THEN
            INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, failures, last_error)
            SELECT p_tenant, c.pid, p_group, g, 1, 'lease_expired'
            FROM generate_series(c.acked_seq + 1, c.lease_end_seq) AS g
            ON CONFLICT (tenant, partition_id, consumer_group, seq)
            DO UPDATE SET failures = s.failures + 1, last_error = 'lease_expired' WHERE NOT s.acked;
        END IF;

        v_given := 0;
        v_last := NULL;
        v_from := c.acked_seq;
        LOOP
            v_picked := 0;
            FOR m IN
                SELECT mm.seq, mm.id, mm.txn, mm.trace_id, mm.payload, mm.codec, mm.key_id, mm.producer_sub,
                       mm.created_at, (mm.deadline_at IS NOT NULL AND mm.deadline_at <= now()) AS expired,
                       coalesce(st.failures, 0) AS failures
                FROM queen_messages mm
                LEFT JOIN queen_msg_state st ON st.tenant = p_tenant AND st.partition_id = mm.partition_id
                                            AND st.consumer_group = p_group AND st.seq = mm.seq
                WHERE mm.tenant = p_tenant AND mm.partition_id = c.pid AND mm.seq > v_from
                  AND st.acked IS NOT TRUE
                ORDER BY mm.seq
                LIMIT v_left
            LOOP
                v_picked := v_picked + 1;
                v_last := m.seq;
                IF m.expired OR m.failures > q.retry_limit THEN
                    IF m.expired OR q.dlq_enabled THEN
                        PERFORM queen_dlq_file(p_tenant, c.pid, p_group, m.seq,
                            CASE WHEN m.expired THEN 'deadline_exceeded' ELSE 'retries_exhausted' END, m.failures);
                    END IF;
                    INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, acked)
                    VALUES (p_tenant, c.pid, p_group, m.seq, true)
                    ON CONFLICT (tenant, partition_id, consumer_group, seq) DO UPDATE SET acked = true;
                    kind := CASE WHEN m.expired THEN 'expired' ELSE 'exhausted' END;
                    partition_id := c.pid; partition := c.name; seq := m.seq; id := m.id; txn := m.txn;
                    trace_id := NULL; payload := NULL; codec := NULL; key_id := NULL; producer_sub := NULL;
                    created_at := m.created_at; attempt := m.failures + 1; lease_id := NULL; lease_until := NULL;
                    RETURN NEXT;
                ELSE
                    v_given := v_given + 1;
                    v_left := v_left - 1;
                    kind := 'msg'; partition_id := c.pid; partition := c.name; seq := m.seq; id := m.id;
                    txn := m.txn; trace_id := m.trace_id; payload := m.payload; codec := m.codec;
                    key_id := m.key_id; producer_sub := m.producer_sub; created_at := m.created_at;
                    attempt := m.failures + 1; lease_id := v_lease; lease_until := v_until;
                    RETURN NEXT;
                END IF;
            END LOOP;
            -- Stop when something was handed out, or the partition has nothing more.
            EXIT WHEN v_given > 0 OR v_picked = 0 OR v_left <= 0;
            v_from := v_last;
        END LOOP;

        IF v_given > 0 AND NOT p_auto_ack THEN
            v_any := true;
            UPDATE queen_cursors cu
            SET lease_id = v_lease, lease_until = v_until, lease_end_seq = v_last, claimed_at = now()
            WHERE cu.tenant = p_tenant AND cu.partition_id = c.pid AND cu.consumer_group = p_group;
            IF v_last IS NOT NULL AND v_given < v_picked THEN
                PERFORM queen_cursor_advance(p_tenant, c.pid, p_group);
            END IF;
        ELSE
            IF v_given > 0 THEN
                v_any := true;
            END IF;
            -- Auto-ack (everything handed out is done), or only dead letters were found: move the
            -- cursor, drop any stale lease.
            -- Every offset in (acked_seq, v_last] was handed out, filed, or acked before: all done.
            UPDATE queen_cursors cu
            SET acked_seq = greatest(cu.acked_seq, coalesce(v_last, cu.acked_seq)),
                lease_id = NULL, lease_until = NULL, lease_end_seq = NULL, claimed_at = now()
            WHERE cu.tenant = p_tenant AND cu.partition_id = c.pid AND cu.consumer_group = p_group;
            PERFORM queen_cursor_advance(p_tenant, c.pid, p_group);
        END IF;
    END LOOP;

    IF NOT v_any THEN
        -- seq carries the milliseconds until that instant (by the database clock).
        SELECT min(cu.lease_until) INTO v_until FROM queen_cursors cu
        JOIN queen_partitions p ON p.tenant = cu.tenant AND p.id = cu.partition_id
        WHERE cu.tenant = p_tenant AND cu.queue = p_queue AND cu.consumer_group = p_group
          AND (p_partition IS NULL OR p.name = p_partition)
          AND p.next_seq - 1 > cu.acked_seq AND cu.lease_until > now();
        RETURN QUERY SELECT 'idle'::text, NULL::uuid, NULL::text,
            ceil(extract(epoch FROM v_until - now()) * 1000)::bigint, NULL::uuid, NULL::text,
            NULL::uuid, NULL::bytea, NULL::smallint, NULL::text, NULL::text, NULL::timestamptz, NULL::integer,
            NULL::uuid, v_until;
    END IF;
END
$$;
