-- queen_timers_claim, same signature and results: lock only the partitions a claim needs. 0025/0026 took
-- the transaction lock of EVERY candidate partition in the window (typically all of a burst's
-- partitions) though a claim keeps only the first few, so a second sweeper claiming at the same moment
-- found everything locked, claimed nothing and slept. Now the candidates are locked one by one, in
-- order, per tenant, until the locked ones that no live claim holds (checked right after each lock, in
-- a fresh snapshot) have at least the tenant's slice of window rows; partitions past that stay free for
-- the others.

CREATE OR REPLACE FUNCTION queen_timers_claim(
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
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_active integer;
    v_slice  integer;
    v_rows   integer := 0;
    v_te     text[];
    v_q      text[];
    v_p      text[];
    v_tr     bigint[];
    v_prs    bigint[];
    v_pr     bigint;
    v_have   bigint;
    v_cur    text;
    r        record;
BEGIN
    IF coalesce((SELECT s.sweeper_paused FROM queen_timer_switches s WHERE s.tenant = '*'), false) THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::timestamptz, NULL::text, NULL::integer, NULL::bigint, true;
        RETURN;
    END IF;

    SELECT count(*) INTO v_active FROM queen_tenants qt
    WHERE EXISTS (SELECT 1 FROM queen_timers t WHERE t.tenant = qt.tenant AND t.due_at <= now());

    IF v_active > 0 THEN
        v_slice := greatest(ceil(p_batch::numeric / v_active)::integer, 1);
        IF v_active > 1 THEN
            v_slice := least(v_slice, greatest(p_slice_cap, 1));
        END IF;

        -- 1. Candidate partitions: per tenant (rotating from after p_cursor), the partitions of its
        --    earliest due rows (a window of a few slices, so a partition held by another sweeper does
        --    not leave this one idle). Lock them in order, skipping any another claimer is taking right
        --    now, until the locked ones hold the tenant's slice of window rows.
        FOR r IN
            WITH ten AS (
                SELECT qt.tenant,
                       row_number() OVER (ORDER BY (qt.tenant COLLATE "C" > coalesce(p_cursor, '')) DESC,
                                                   qt.tenant COLLATE "C") AS tr
                FROM queen_tenants qt
            ),
            win AS (
                SELECT ten.tenant, ten.tr, w.queue, w.partition, w.due_at
                FROM ten CROSS JOIN LATERAL (
                    SELECT t.queue, t.partition, t.due_at FROM queen_timers t
                    WHERE t.tenant = ten.tenant AND t.due_at <= now()
                    ORDER BY t.due_at
                    LIMIT v_slice * 2
                ) w
            )
            SELECT win.tenant, win.tr, win.queue::text AS queue, win.partition::text AS partition, count(*) AS n
            FROM win GROUP BY win.tenant, win.tr, win.queue, win.partition
            ORDER BY win.tr, min(win.due_at), win.queue, win.partition
        LOOP
            IF r.tenant IS DISTINCT FROM v_cur THEN
                v_cur := r.tenant;
                v_have := 0;
                v_pr := 0;
            END IF;
            CONTINUE WHEN v_have >= v_slice;
            -- Locked, then (a later statement, so a fresh snapshot) not held by a live claim: a claimer
            -- that had the lock before us has committed, and its claim is visible here.
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(1364478285,
                                hashtext(r.tenant || E'\x1f' || r.queue || E'\x1f' || r.partition));
            CONTINUE WHEN EXISTS (SELECT 1 FROM queen_timers c
                                  WHERE c.tenant = r.tenant AND c.queue = r.queue AND c.partition = r.partition
                                    AND c.claim_token IS NOT NULL AND c.claimed_until > now());
            v_pr := v_pr + 1;
            v_have := v_have + r.n;
            v_te := v_te || r.tenant;
            v_q := v_q || r.queue;
            v_p := v_p || r.partition;
            v_tr := v_tr || r.tr;
            v_prs := v_prs || v_pr;
        END LOOP;

        -- 2. A new statement, so a new snapshot taken after the locks: skip the partitions a live claim
        --    holds (committed by a claimer that held the lock before us), and claim the earliest due
        --    rows of the others, whole partitions first, at most the tenant's slice and the batch.
        IF v_te IS NOT NULL THEN
            RETURN QUERY
            WITH lk AS (
                SELECT * FROM unnest(v_te, v_q, v_p, v_tr, v_prs) AS u(te, q, p, tr, pr)
            ),
            free AS MATERIALIZED (
                SELECT lk.* FROM lk
                WHERE NOT EXISTS (
                    SELECT 1 FROM queen_timers c
                    WHERE c.tenant = lk.te AND c.queue = lk.q AND c.partition = lk.p
                      AND c.claim_token IS NOT NULL AND c.claimed_until > now()
                )
            ),
            ften AS (
                SELECT DISTINCT free.te, free.tr FROM free
            ),
            -- Nested loops read lazily: partition after partition (in candidate order), each one's
            -- earliest due rows, until the tenant's slice, then the batch, is full; nothing more is read.
            pick AS (
                SELECT y.te, y.queue, y.timer_key
                FROM (SELECT ften.te, ften.tr FROM ften ORDER BY ften.tr) ft
                CROSS JOIN LATERAL (
                    SELECT f.te, x.queue, x.timer_key
                    FROM (SELECT f2.te, f2.q, f2.p, f2.pr FROM free f2 WHERE f2.te = ft.te ORDER BY f2.pr) f
                    CROSS JOIN LATERAL (
                        SELECT t.queue, t.timer_key FROM queen_timers t
                        WHERE t.tenant = f.te AND t.queue = f.q AND t.partition = f.p AND t.due_at <= now()
                        ORDER BY t.due_at
                        LIMIT v_slice
                    ) x
                    LIMIT v_slice
                ) y
                LIMIT p_batch
            ),
            due AS (
                SELECT t.tenant AS te, t.queue, t.timer_key
                FROM queen_timers t JOIN pick ON t.tenant = pick.te AND t.queue = pick.queue AND t.timer_key = pick.timer_key
                WHERE t.due_at <= now()
                FOR UPDATE OF t SKIP LOCKED
            ),
            claimed AS (
                UPDATE queen_timers t
                   SET claim_token = p_token, claimed_until = now() + p_lease_ms * interval '1 millisecond',
                       due_at = now() + p_lease_ms * interval '1 millisecond', claimed_by = p_claimed_by
                FROM due
                WHERE t.tenant = due.te AND t.queue = due.queue AND t.timer_key = due.timer_key
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
