-- queen_timers_claim gains p_slice_cap: while several tenants have due timers, each gets at most that
-- many rows per cycle (QUEEN_SWEEPER_TENANT_SLICE). A burst of one tenant then makes short cycles, so
-- another tenant's due timers wait one short cycle instead of one long one. A tenant alone still
-- takes the whole batch.
DROP FUNCTION queen_timers_claim(uuid, bigint, integer, text, text, boolean);

CREATE FUNCTION queen_timers_claim(
    p_token      uuid,
    p_lease_ms   bigint,
    p_batch      integer,
    p_cursor     text,
    p_claimed_by text,
    p_faults     boolean,
    p_slice_cap  integer
) RETURNS TABLE (tenant text, queue text, timer_key text, partition text, payload bytea,
                 payload_zstd boolean, key_id text, deliver_at timestamptz, fault text, stall_ms integer,
                 next_due_ms bigint, paused boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_active integer;
    v_slice  integer;
    v_rows   integer := 0;
BEGIN
    IF coalesce((SELECT s.sweeper_paused FROM queen_timer_switches s WHERE s.tenant = '*'), false) THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::timestamptz, NULL::text, NULL::integer, NULL::bigint, true;
        RETURN;
    END IF;

    SELECT count(*) INTO v_active FROM queen_tenants qt
    WHERE EXISTS (SELECT 1 FROM queen_timers t WHERE t.tenant = qt.tenant AND t.due_at <= now());

    IF v_active > 0 THEN
        -- Alone, a tenant may take the whole batch; beside others, at most p_slice_cap rows per cycle, so
        -- a cycle stays short and the others' timers wait at most one short cycle.
        v_slice := greatest(ceil(p_batch::numeric / v_active)::integer, 1);
        IF v_active > 1 THEN
            v_slice := least(v_slice, greatest(p_slice_cap, 1));
        END IF;
        RETURN QUERY
        WITH due AS (
            SELECT x.tenant, x.queue, x.timer_key
            FROM (SELECT qt.tenant FROM queen_tenants qt
                  ORDER BY (qt.tenant COLLATE "C" > coalesce(p_cursor, '')) DESC, qt.tenant COLLATE "C") a
            CROSS JOIN LATERAL (
                SELECT t.tenant, t.queue, t.timer_key FROM queen_timers t
                WHERE t.tenant = a.tenant AND t.due_at <= now()
                ORDER BY t.due_at
                LIMIT v_slice
                FOR UPDATE SKIP LOCKED
            ) x
            LIMIT p_batch
        ),
        claimed AS (
            UPDATE queen_timers t
               SET claim_token = p_token, claimed_until = now() + p_lease_ms * interval '1 millisecond',
                   due_at = now() + p_lease_ms * interval '1 millisecond', claimed_by = p_claimed_by
            FROM due
            WHERE t.tenant = due.tenant AND t.queue = due.queue AND t.timer_key = due.timer_key
            RETURNING t.tenant, t.queue, t.timer_key, t.partition, t.payload, t.payload_zstd, t.key_id,
                      t.deliver_at
        ),
        numbered AS (
            SELECT c.*, row_number() OVER (PARTITION BY c.tenant, c.queue ORDER BY c.deliver_at, c.timer_key) AS rn
            FROM claimed c
        ),
        counts AS (
            SELECT c.tenant, c.queue, count(*)::integer AS n FROM claimed c WHERE p_faults GROUP BY 1, 2
        ),
        taken AS (
            UPDATE queen_timer_faults f
               SET remaining = greatest(old.remaining - counts.n, 0)
            FROM counts, queen_timer_faults old
            WHERE p_faults AND f.tenant = counts.tenant AND f.queue = counts.queue AND f.remaining > 0
              AND old.tenant = f.tenant AND old.queue = f.queue
            RETURNING f.tenant, f.queue, f.failure_class, f.stall_ms, least(old.remaining, counts.n) AS took
        )
        SELECT n.tenant, n.queue, n.timer_key, n.partition, n.payload, n.payload_zstd, n.key_id,
               n.deliver_at,
               CASE WHEN tk.took IS NOT NULL AND n.rn <= tk.took THEN tk.failure_class END,
               CASE WHEN tk.took IS NOT NULL AND n.rn <= tk.took THEN tk.stall_ms END,
               NULL::bigint, false
        FROM numbered n
        LEFT JOIN taken tk ON tk.tenant = n.tenant AND tk.queue = n.queue
        ORDER BY n.tenant, n.queue, n.partition, n.deliver_at, n.timer_key;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
    END IF;

    IF v_rows < p_batch THEN
        RETURN QUERY
        SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::boolean, NULL::text,
               NULL::timestamptz, NULL::text, NULL::integer,
               ceil(extract(epoch FROM min(x.d) - now()) * 1000)::bigint, false
        FROM queen_tenants qt
        CROSS JOIN LATERAL (SELECT t.due_at AS d FROM queen_timers t WHERE t.tenant = qt.tenant
                            ORDER BY t.due_at LIMIT 1) x;
    END IF;
END
$$;
