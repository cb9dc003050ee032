-- Timers: schedule/reschedule/cancel, and the sweeper's claim and fire.
-- Tables: broker/sql/migrations/0003_timers.sql. The pending-timer gauge triggers are in limits.sql; the tenant
-- check (what was a foreign key) is below.
-- Re-applied at boot when any function file changes (docs/guides/deploying.md, "Schema and upgrades"): CREATE OR
-- REPLACE statements only; tables, indexes and data belong in forward-only migrations.

-- The cluster-wide scheduling switch (true when no row says otherwise). PL/pgSQL: a SQL body with a
-- sub-select is never inlined, so it was planned again at every schedule (0.1 ms of planning).
CREATE OR REPLACE FUNCTION queen_timers_scheduling_enabled() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT s.scheduling_enabled FROM queen_timer_switches s WHERE s.tenant = '*'), true);
END
$$;

-- Every timer's tenant is a row of queen_tenants (broker/sql/migrations/0021_timer_tenant_check.sql: what the
-- foreign key held, checked once per statement and per distinct tenant instead of once per row). Two
-- triggers, one function: after an INSERT into queen_timers, each distinct tenant inserted must exist,
-- and is key-share locked so it cannot be deleted until the inserting transaction ends (a delete that
-- comes first leaves the lock no row to find: the insert fails); after a DELETE from queen_tenants, no
-- deleted tenant may still have timers. Either way: foreign_key_violation, as the foreign key raised.
-- (Each branch names its own trigger's transition table; PL/pgSQL plans a statement when it first runs.)
CREATE OR REPLACE FUNCTION queen_timers_tenant_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_bad text;
BEGIN
    IF TG_TABLE_NAME = 'queen_timers' THEN
        SELECT n.tenant INTO v_bad
        FROM (SELECT DISTINCT x.tenant FROM queen_new_timers x) n
        WHERE NOT EXISTS (SELECT 1 FROM queen_tenants t WHERE t.tenant = n.tenant FOR KEY SHARE OF t)
        LIMIT 1;
    ELSE
        SELECT o.tenant INTO v_bad
        FROM queen_old_tenants o
        WHERE EXISTS (SELECT 1 FROM queen_timers t WHERE t.tenant = o.tenant)
        LIMIT 1;
    END IF;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'tenant % %', v_bad,
            CASE WHEN TG_TABLE_NAME = 'queen_timers' THEN 'of new timers is not in queen_tenants' ELSE 'still has timers' END
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER queen_timers_tenant_ins AFTER INSERT ON queen_timers
    REFERENCING NEW TABLE AS queen_new_timers FOR EACH STATEMENT EXECUTE FUNCTION queen_timers_tenant_check();

CREATE OR REPLACE TRIGGER queen_tenants_timers_del AFTER DELETE ON queen_tenants
    REFERENCING OLD TABLE AS queen_old_tenants FOR EACH STATEMENT EXECUTE FUNCTION queen_timers_tenant_check();

-- queen_timers_apply: schedule / reschedule / cancel a batch of timers in one statement.
--
-- Items are parallel arrays, index i = op i; every (queue, key) appears at most once (the caller
-- refuses duplicates). Returns one row per op, in op order:
--   schedule/reschedule -> 'scheduled' (no row existed) | 'rescheduled' (row replaced, attempts reset,
--                          last error cleared, new message id and txn) | 'too_late' (row claimed)
--   cancel              -> 'cancelled' (row deleted; txn = the stored txn) | 'too_late' | 'absent'
-- p_ready, per schedule op: the broker judged the payload ready for the log as stored
-- (queen_timers.payload_ready, broker/sql/migrations/0018_timer_payload_ready.sql); NULL counts as false.
-- p_partitions, p_zstd, p_key_ids may each be one NULL instead of an array of NULLs (unnest pads a NULL
-- array with NULLs): the default partition, not zstd, not sealed, for every op.
-- p_check_switch: refuse the whole call with SQLSTATE QT001 when scheduling is switched off (the
-- DELETE cancel route passes false: nothing but the boot flag refuses it).
-- Notifies queen_timers with the smallest new delay in ms when some timer is due within p_near_ms,
-- so sleeping sweepers wake at commit (p_near_ms < 0: no NOTIFY, and the delays are not even read).
-- Two ways in, one outcome:
--   * a batch of 'schedule' ops only (no cancel, no reschedule) is first tried as new keys: one plain
--     INSERT, in key order, and every op answers 'scheduled'. That is what an ingest of fresh timers is,
--     and it costs about what a bare unnest INSERT costs: no per-key probe and lock, no ON CONFLICT (its
--     speculative insertion probes the primary key again and writes one more WAL record per row), no joins
--     to build the answer. A key that exists (or that another transaction is inserting: the INSERT waits
--     for its commit) makes the INSERT fail with unique_violation at the first such key in key order; the
--     block's subtransaction undoes the rows written so far and the batch takes the general statement.
--     Only that one batch pays twice, and the waste is bounded by the rows before the first existing key.
--     (A probe by primary key first, to avoid that waste, would cost every batch more than the rare
--     wasted attempt does.)
--   * anything else: the general statement, which locks the existing rows in key order and decides per
--     op (scheduled, rescheduled, too_late, cancelled, absent).
-- The plain INSERT path costs less database time and less WAL per timer (docs/performance.md, "schedule").
-- Plans: unlike take and fire (below), apply runs on ONE generic plan per connection, built once:
-- re-planned at every call, planning was a large share of a single schedule. A generic plan is built from the table as it was
-- then, so its shape must not depend on the table's size: every probe of queen_timers is by its
-- primary key (the other indexes are partial, see 0003_timers.sql, so they cannot serve a probe by
-- key) and enable_seqscan = off removes the one alternative a plan built on an empty table would
-- pick, a sequential scan. The ctid delete is a TID scan either way.
CREATE OR REPLACE FUNCTION queen_timers_apply(
    p_tenant         text,
    p_sub            text,
    p_check_switch   boolean,
    p_near_ms        bigint,
    p_ops            text[],
    p_queues         text[],
    p_keys           text[],
    p_partitions     text[],
    p_txns           text[],
    p_ids            uuid[],
    p_payloads       bytea[],
    p_zstd           boolean[],
    p_key_ids        text[],
    p_delays         bigint[],
    p_ready          boolean[]
) RETURNS TABLE (idx integer, status text, txn text, message_id uuid, deliver_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_near    bigint;
    v_bad     text;
    v_new     boolean := false;  -- the batch went in as plain inserts of new keys
    v_tid     tid;
    v_claimed boolean;
    v_txn     text;
BEGIN
    IF p_check_switch AND NOT queen_timers_scheduling_enabled() THEN
        RAISE EXCEPTION 'timer scheduling is switched off by an operator' USING ERRCODE = 'QT001';
    END IF;

    -- One cancel (the DELETE route, or a batch of one): what the general statement decides for it, in
    -- two statements that touch only its row: lock it by key, then delete it by ctid unless a live lease
    -- holds it. The general statement is also an INSERT, so even a cancel fired queen_timers' insert
    -- triggers (gauge, tenant check, freeze guard) and paid its CTEs and joins: about four times a bare
    -- DELETE's database CPU (docs/performance.md, "Timers: schedule").
    IF cardinality(p_ops) = 1 AND p_ops[1] = 'cancel' THEN
        SELECT t.ctid, (t.claim_token IS NOT NULL AND t.claimed_until > now()) INTO v_tid, v_claimed
        FROM queen_timers t
        WHERE t.tenant = p_tenant AND t.queue = p_queues[1] AND t.timer_key = p_keys[1]
        FOR UPDATE OF t;
        IF NOT FOUND OR v_claimed THEN
            RETURN QUERY SELECT 1, CASE WHEN v_claimed THEN 'too_late' ELSE 'absent' END, p_txns[1],
                                NULL::uuid, NULL::timestamptz;
            RETURN;
        END IF;
        DELETE FROM queen_timers t WHERE t.ctid = v_tid RETURNING t.txn INTO v_txn;
        RETURN QUERY SELECT 1, 'cancelled'::text, v_txn, NULL::uuid, NULL::timestamptz;
        RETURN;
    END IF;

    -- A queue that encrypts at rest must get encrypted payloads (key id set): the caller read the
    -- queues' flags to seal; a schedule that reaches an encrypting queue in clear is refused (QT002),
    -- so a flag switched on between that read and this statement cannot leave cleartext at rest.
    SELECT i.q INTO v_bad
    FROM (SELECT DISTINCT u.q FROM unnest(p_ops, p_queues, p_key_ids) AS u(op, q, k)
          WHERE u.op <> 'cancel' AND u.k IS NULL) i
    CROSS JOIN LATERAL (SELECT 1 FROM queen_queues qq  -- a probe by (tenant, name) per queue, not per op
                        WHERE qq.tenant = p_tenant AND qq.name = i.q AND qq.encryption_enabled LIMIT 1) e
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'queue % encrypts at rest', v_bad USING ERRCODE = 'QT002', DETAIL = v_bad;
    END IF;

    -- The tenant row every schedule and reschedule needs (queen_timers_tenant_check). A probe first: the
    -- tenant almost always exists, and an INSERT ... ON CONFLICT that inserts nothing still runs its
    -- speculative insertion and queen_tenants' statement triggers.
    IF NOT (p_ops <@ ARRAY['cancel']) AND NOT EXISTS (SELECT 1 FROM queen_tenants t WHERE t.tenant = p_tenant) THEN
        INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    END IF;

    -- Schedules only (no cancel, no reschedule: a client that says reschedule expects the row to exist):
    -- first try them as new keys.
    IF cardinality(p_ops) > 0 AND NOT ('cancel' = ANY (p_ops)) AND NOT ('reschedule' = ANY (p_ops)) THEN
        BEGIN
            INSERT INTO queen_timers (tenant, queue, timer_key, partition, txn, message_id, payload,
                                      payload_zstd, key_id, producer_sub, deliver_at, due_at, payload_ready)
            SELECT p_tenant, u.q, u.k, coalesce(u.p, 'Default'), u.t, u.id, u.pl, coalesce(u.z, false), u.kid,
                   p_sub, now() + u.d * interval '1 millisecond', now() + u.d * interval '1 millisecond',
                   coalesce(u.r, false)
            FROM unnest(p_queues, p_keys, p_partitions, p_txns, p_ids, p_payloads, p_zstd, p_key_ids, p_delays,
                        p_ready) AS u(q, k, p, t, id, pl, z, kid, d, r)
            ORDER BY u.q, u.k;  -- key order, as the general statement locks: two batches wait, never deadlock
            v_new := true;
        EXCEPTION WHEN unique_violation THEN
            v_new := false;  -- a key exists (or a concurrent schedule of it committed first)
        END;
    END IF;

    IF v_new THEN
        RETURN QUERY
        SELECT u.ord::integer, 'scheduled'::text, u.t, u.id, now() + u.d * interval '1 millisecond'
        FROM unnest(p_txns, p_ids, p_delays) WITH ORDINALITY AS u(t, id, d, ord)
        ORDER BY u.ord;
    ELSE
        RETURN QUERY
        WITH inp AS (
            SELECT u.ord::integer AS i, u.op, u.q, u.k, coalesce(u.p, 'Default') AS p, u.t, u.id, u.pl,
                   coalesce(u.z, false) AS z, u.kid, u.d, coalesce(u.r, false) AS r
            FROM unnest(p_ops, p_queues, p_keys, p_partitions, p_txns, p_ids, p_payloads, p_zstd, p_key_ids, p_delays,
                        p_ready)
                 WITH ORDINALITY AS u(op, q, k, p, t, id, pl, z, kid, d, r, ord)
        ),
        -- Existing rows, locked in key order. One primary-key probe per op (a LATERAL subquery: the
        -- planner cannot turn it into a scan of the tenant's or the queue's rows, whatever it believes
        -- their number to be); the ctid lets the cancels delete exactly the rows locked here.
        cur AS (
            SELECT x.queue, x.timer_key, x.old_txn, x.claimed, x.tid
            FROM (SELECT DISTINCT inp.q, inp.k FROM inp ORDER BY inp.q, inp.k) o
            CROSS JOIN LATERAL (
                SELECT t.queue, t.timer_key, t.txn AS old_txn,
                       (t.claim_token IS NOT NULL AND t.claimed_until > now()) AS claimed, t.ctid AS tid
                FROM queen_timers t
                WHERE t.tenant = p_tenant AND t.queue = o.q AND t.timer_key = o.k
                LIMIT 1  -- the key is the primary key; a LIMIT keeps the probe a probe (not flattened into a join)
                FOR UPDATE OF t
            ) x
        ),
        ups AS (
            INSERT INTO queen_timers AS t (tenant, queue, timer_key, partition, txn, message_id, payload,
                                           payload_zstd, key_id, producer_sub, deliver_at, due_at, payload_ready)
            SELECT p_tenant, inp.q, inp.k, inp.p, inp.t, inp.id, inp.pl, inp.z, inp.kid, p_sub,
                   now() + inp.d * interval '1 millisecond', now() + inp.d * interval '1 millisecond', inp.r
            FROM inp LEFT JOIN cur ON cur.queue = inp.q AND cur.timer_key = inp.k
            WHERE inp.op <> 'cancel' AND NOT coalesce(cur.claimed, false)
            ORDER BY inp.q, inp.k
            ON CONFLICT (tenant, queue, timer_key) DO UPDATE
               SET partition = excluded.partition, txn = excluded.txn, message_id = excluded.message_id,
                   payload = excluded.payload, payload_zstd = excluded.payload_zstd, key_id = excluded.key_id,
                   payload_ready = excluded.payload_ready, producer_sub = excluded.producer_sub,
                   deliver_at = excluded.deliver_at,
                   due_at = excluded.due_at, attempts = 0, failures = 0, last_error = NULL,
                   claim_token = NULL, claimed_until = NULL, claimed_by = NULL, updated_at = now(),
                   recur = NULL, occurrences = 0, last_fired_at = NULL  -- a one-shot over a recurring key replaces it
               WHERE NOT (t.claim_token IS NOT NULL AND t.claimed_until > now())
            RETURNING t.queue, t.timer_key, t.deliver_at
        ),
        -- By ctid alone (a TID scan): the ctids are rows of this tenant that `cur` locked in this statement,
        -- so they cannot have moved; a further qual on an indexed column would let the generic plan read
        -- the tenant's rows through the primary key and filter them by ctid instead.
        del AS (
            DELETE FROM queen_timers t
            WHERE t.ctid = ANY (ARRAY(
                SELECT cur.tid FROM cur JOIN inp ON cur.queue = inp.q AND cur.timer_key = inp.k
                WHERE inp.op = 'cancel' AND NOT cur.claimed))
            RETURNING t.queue, t.timer_key, t.txn
        )
        SELECT inp.i,
               CASE
                 WHEN inp.op = 'cancel' THEN
                   CASE WHEN del.queue IS NOT NULL THEN 'cancelled'
                        WHEN cur.claimed THEN 'too_late'
                        ELSE 'absent' END
                 WHEN ups.queue IS NULL THEN 'too_late'
                 WHEN cur.queue IS NULL THEN 'scheduled'
                 ELSE 'rescheduled'
               END,
               CASE WHEN inp.op = 'cancel' THEN coalesce(del.txn, inp.t) ELSE inp.t END,
               CASE WHEN ups.queue IS NOT NULL THEN inp.id END,
               ups.deliver_at
        FROM inp
        LEFT JOIN cur ON cur.queue = inp.q AND cur.timer_key = inp.k
        LEFT JOIN ups ON ups.queue = inp.q AND ups.timer_key = inp.k
        LEFT JOIN del ON del.queue = inp.q AND del.timer_key = inp.k
        ORDER BY inp.i;
    END IF;

    IF p_near_ms >= 0 THEN
        SELECT min(d) INTO v_near FROM unnest(p_ops, p_delays) AS x(op, d) WHERE op <> 'cancel';
        IF v_near IS NOT NULL AND v_near <= p_near_ms THEN
            PERFORM pg_notify('queen_timers', greatest(v_near, 0)::text);
        END IF;
    END IF;
END
$$;

-- queen_timers_fire: the commit half of a sweep cycle.
--
-- Which rows: with p_token NULL (a take in this transaction), a row identified by (tenant, queue,
-- key) is acted upon only if it still has the message id the take read (g_ids / f_ids: a reschedule
-- gives a new one, a cancel deletes the row) and no live lease; with p_token set (a lease), only if
-- it still holds p_token (in autocommit: the call is the transaction; an error is raised).
-- Good rows (parallel arrays g_*) are deleted if and only if they are still the ones taken, and exactly
-- the deleted ones are pushed into the log through queen_push, per tenant, in (queue, partition,
-- deliver_at) order; a NULL sealed payload means "the stored bytes are already the log's bytes".
-- queen_push is idempotent by (partition, txn), so a re-fire after a lost commit is a duplicate, never
-- a second frame. Failed rows (f_*) still the ones taken get their claim cleared, the failure
-- counted (f_cost 1 = permanent, 0 = transient) and a backoff; a row whose attempts reach
-- p_max_attempts moves to its queue's DLQ as a synthetic row (consumer group __timers__).
-- f_wrap, per failed row: its payload is itself the failure (not JSON, not a zstd frame). Such a row
-- reaches the DLQ with its bytes inside a JSON envelope {"undeliverable": true, "error", "payloadZstd",
-- "payloadBase64"}: the DLQ, like the log, stores JSON, so GET /api/v1/dlq stays a JSON answer, and the
-- operator still sees the original bytes.
-- Returns one row per row acted upon: kind 'fired' (lag = commit-time clock minus deliver_at),
-- 'duplicate', 'backoff' or 'dlq'.
--
-- The queue, partition and txn arrays handed to queen_push carry the default collation: aggregated
-- straight from queen_timers' COLLATE "C" columns they made queen_push's call collation "C", which
-- queen_push's indexes (default collation) cannot serve, and its plan for that call was many times slower.
-- Recurring rows (r_*, broker/sql/migrations/0025_timers_recur.sql) taken with the others are not deleted:
-- the row still the one taken (same message id, no live lease, not paused since; by p_token when
-- leased) is locked and MOVED to the next occurrence the caller computed from its schedule (r_next, with
-- that occurrence's message id r_next_ids and frame txn r_next_txns: broker/timers/recur.py), and, when
-- r_fire, the occurrence it held is pushed through queen_push exactly as a one-shot timer's frame (its
-- txn names the occurrence, so a second fire of it could only be a duplicate). Pushing and moving are
-- this statement, so an occurrence is fired and the row advanced together or not at all. Such frames of
-- a cycle are pushed after its one-shot frames (a second push per tenant, only when a cycle has them).
-- Occurrences after a schedule's first are metered here, p_period_s being the metering period: the
-- first was billed at schedule like any timer's promise, the later ones were never promised by a call.
-- The signature changed (the r_* arrays): drop any earlier one.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = 'queen_timers_fire'
               AND NOT ('r_next' = ANY (coalesce(p.proargnames, ARRAY[]::text[]))) LOOP
        EXECUTE format('DROP FUNCTION %s', r.sig);
    END LOOP;
END
$$;
CREATE OR REPLACE FUNCTION queen_timers_fire(
    p_token        uuid,
    g_tenants      text[],
    g_queues       text[],
    g_keys         text[],
    g_ids          uuid[],
    g_tids         tid[],
    g_payloads     bytea[],
    g_codecs       smallint[],
    f_tenants      text[],
    f_queues       text[],
    f_keys         text[],
    f_ids          uuid[],
    f_errors       text[],
    f_costs        integer[],
    f_wrap         boolean[],
    p_max_attempts integer,
    p_backoff_base_ms bigint,
    p_backoff_cap_ms  bigint,
    r_tenants      text[] DEFAULT NULL,
    r_queues       text[] DEFAULT NULL,
    r_keys         text[] DEFAULT NULL,
    r_ids          uuid[] DEFAULT NULL,
    r_payloads     bytea[] DEFAULT NULL,
    r_codecs       smallint[] DEFAULT NULL,
    r_fire         boolean[] DEFAULT NULL,
    r_next         timestamptz[] DEFAULT NULL,
    r_next_ids     uuid[] DEFAULT NULL,
    r_next_txns    text[] DEFAULT NULL,
    p_period_s     integer DEFAULT 3600
) RETURNS TABLE (kind text, tenant text, queue text, timer_key text, lag_s double precision)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
-- Never JIT-compiled (where the server has JIT; the embedded one has none): a never-analysed table's row
-- estimates push the plans' cost past jit_above_cost, and compiling costs more than the statements it
-- compiles take to run.
SET jit = off
-- The delete by ctid must be a TID scan: priced by random page reads (1,000 ctids ~ 4,000) it loses to
-- a sequential scan of a 100,000-row table (~2,500), which then reads the whole table and its dead rows
-- per fire, a cost growing with the table.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    r        record;
    v_tids   tid[] := g_tids;
    v_pushes integer := 0;
BEGIN
    BEGIN
        -- The rows still the ones taken. Taken in this transaction (g_tids): by ctid, only a version
        -- that still has the message id read (the id, not the ctid, is what the delete re-checks on a
        -- row changed under it). Leased (p_token): one primary-key probe per key (LATERAL, so never a
        -- scan whatever the statistics say; the token is checked on the row found, not in the probe,
        -- where it would let the planner use the partial index of live claims and read a whole
        -- queue's claims per key), locked here, then deleted by ctid below.
        -- The delete's ctid list is a plain array parameter in both cases, so it is a TID scan: with the
        -- lease path's probe inside the delete (a CASE holding a subquery) the planner could not use the
        -- ctids as a scan key and read the whole table per fire (a sequential scan, growing with the
        -- table and its dead rows).
        IF p_token IS NOT NULL THEN
            SELECT array_agg(x.tid) INTO v_tids
            FROM unnest(g_tenants, g_queues, g_keys) AS inp(te, q, k)
            CROSS JOIN LATERAL (
                SELECT t2.ctid AS tid FROM queen_timers t2
                WHERE t2.tenant = inp.te AND t2.queue = inp.q AND t2.timer_key = inp.k
                FOR UPDATE OF t2) x;
        END IF;
        FOR r IN
            WITH inp AS (
                SELECT * FROM unnest(g_tenants, g_queues, g_keys, g_ids, g_payloads, g_codecs) AS u(te, q, k, id, pl, c)
            ),
            gone AS (
                DELETE FROM queen_timers t
                WHERE t.ctid = ANY (v_tids)
                  AND CASE WHEN p_token IS NULL
                           THEN t.message_id = ANY (g_ids) AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > now())
                           ELSE t.claim_token = p_token END
                RETURNING t.tenant, t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.payload,
                          t.payload_zstd, t.key_id, t.producer_sub, t.deliver_at
            ),
            j AS (
                SELECT g.*, coalesce(inp.pl, g.payload) AS sealed,
                       CASE WHEN inp.pl IS NOT NULL THEN inp.c
                            WHEN g.payload_zstd THEN 1::smallint ELSE 0::smallint END AS codec
                -- by message id when the rows were taken (one uuid compare), by key when leased
                FROM gone g JOIN inp ON CASE WHEN p_token IS NULL THEN inp.id = g.message_id
                                             ELSE inp.te = g.tenant AND inp.q = g.queue AND inp.k = g.timer_key END
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
            v_pushes := v_pushes + 1;
            IF v_pushes = 32 THEN  -- see queen_timers_fire_ready
                PERFORM set_config('queen.push_careful', 'on', true);
            END IF;
            -- Each pushed item meets its queue, key and deliverAt by a join on its index, never by a
            -- subscript: r.qs[i] of a text array walks the array from its start, so subscripting every
            -- item would make the answer quadratic in the batch.
            RETURN QUERY
            SELECT CASE WHEN qp.st = 'queued' THEN 'fired' ELSE 'duplicate' END,
                   r.tenant, u.q, u.k, extract(epoch FROM clock_timestamp() - u.d)::double precision
            FROM queen_push(r.tenant, r.qs, r.ps, r.ids, r.txns,
                            array_fill(NULL::uuid, ARRAY[cardinality(r.qs)]), r.pls, r.cs, r.kids, r.subs,
                            array_fill(NULL::bigint, ARRAY[cardinality(r.qs)])) AS qp(i, st, mid, pid, seq)
            JOIN unnest(r.qs, r.keys, r.dats) WITH ORDINALITY AS u(q, k, d, n) ON u.n = qp.i
            ORDER BY qp.i;
        END LOOP;

        IF cardinality(r_tenants) > 0 THEN
            FOR r IN
                WITH inp AS (
                    SELECT * FROM unnest(r_tenants, r_queues, r_keys, r_ids, r_payloads, r_codecs, r_fire, r_next,
                                         r_next_ids, r_next_txns) AS u(te, q, k, id, pl, c, fire, nx, nid, ntxn)
                ),
                -- One primary-key probe per row, locked (as apply's probes: LATERAL, so never a scan).
                cur AS MATERIALIZED (
                    SELECT x.*, inp.pl, inp.c, inp.fire, inp.nx, inp.nid, inp.ntxn
                    FROM inp CROSS JOIN LATERAL (
                        SELECT t.ctid AS tid, t.tenant, t.queue, t.timer_key, t.partition, t.txn, t.message_id,
                               t.payload, t.payload_zstd, t.key_id, t.producer_sub, t.deliver_at, t.occurrences
                        FROM queen_timers t
                        WHERE t.tenant = inp.te AND t.queue = inp.q AND t.timer_key = inp.k
                          AND t.recur IS NOT NULL AND t.due_at IS NOT NULL
                          AND CASE WHEN p_token IS NULL
                                   THEN t.message_id = inp.id AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > now())
                                   ELSE t.claim_token = p_token END
                        FOR UPDATE OF t
                    ) x
                ),
                moved AS (  -- runs whether or not read (a data-modifying WITH always runs to completion)
                    UPDATE queen_timers t
                       SET deliver_at = cur.nx, due_at = cur.nx, message_id = cur.nid, txn = cur.ntxn,
                           occurrences = t.occurrences + CASE WHEN cur.fire THEN 1 ELSE 0 END,
                           last_fired_at = CASE WHEN cur.fire THEN now() ELSE t.last_fired_at END,
                           attempts = 0, failures = 0, last_error = NULL,
                           claim_token = NULL, claimed_until = NULL, claimed_by = NULL, updated_at = now()
                    FROM cur WHERE t.ctid = cur.tid
                    RETURNING t.tenant
                ),
                j AS (
                    SELECT cur.*, coalesce(cur.pl, cur.payload) AS sealed,
                           CASE WHEN cur.pl IS NOT NULL THEN cur.c
                                WHEN cur.payload_zstd THEN 1::smallint ELSE 0::smallint END AS codec
                    FROM cur WHERE cur.fire
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
                       array_agg(j.deliver_at ORDER BY j.queue, j.partition, j.deliver_at, j.timer_key) AS dats,
                       count(*) FILTER (WHERE j.occurrences > 0) AS later
                FROM j GROUP BY j.tenant ORDER BY j.tenant
            LOOP
                v_pushes := v_pushes + 1;
                IF v_pushes = 32 THEN
                    PERFORM set_config('queen.push_careful', 'on', true);
                END IF;
                RETURN QUERY
                SELECT CASE WHEN qp.st = 'queued' THEN 'fired' ELSE 'duplicate' END,
                       r.tenant, u.q, u.k, extract(epoch FROM clock_timestamp() - u.d)::double precision
                FROM queen_push(r.tenant, r.qs, r.ps, r.ids, r.txns,
                                array_fill(NULL::uuid, ARRAY[cardinality(r.qs)]), r.pls, r.cs, r.kids, r.subs,
                                array_fill(NULL::bigint, ARRAY[cardinality(r.qs)])) AS qp(i, st, mid, pid, seq)
                JOIN unnest(r.qs, r.keys, r.dats) WITH ORDINALITY AS u(q, k, d, n) ON u.n = qp.i
                ORDER BY qp.i;
                PERFORM queen_meter(r.tenant, p_period_s, r.later, 0::bigint);
            END LOOP;
        END IF;

        IF cardinality(f_tenants) > 0 THEN
            RETURN QUERY
            WITH inp AS (
                SELECT * FROM unnest(f_tenants, f_queues, f_keys, f_ids, f_errors, f_costs) AS u(te, q, k, id, err, cost)
            ),
            upd AS (
                UPDATE queen_timers t
                   SET attempts = t.attempts + inp.cost, failures = t.failures + 1, last_error = inp.err,
                       claim_token = NULL, claimed_until = NULL, claimed_by = NULL, updated_at = now(),
                       due_at = now() + least(p_backoff_cap_ms,
                                              p_backoff_base_ms * power(2, least(t.failures, 40))::bigint)
                                        * interval '1 millisecond'
                FROM inp
                WHERE t.tenant = inp.te AND t.queue = inp.q AND t.timer_key = inp.k
                  AND CASE WHEN p_token IS NULL
                           THEN t.message_id = inp.id AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > now())
                           ELSE t.claim_token = p_token END
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
    EXCEPTION WHEN OTHERS THEN
        IF p_token IS NOT NULL THEN
            RAISE;
        END IF;
        -- Taken rows: this call's work is undone, the caller's transaction (and its partition locks)
        -- lives on; the answer carries one row of kind 'error' (tenant = SQLSTATE, queue = message),
        -- and any other row in it is void.
        RETURN QUERY SELECT 'error'::text, SQLSTATE::text, SQLERRM::text, NULL::text, NULL::double precision;
    END;
END
$$;

-- queen_timers_take: the first half of a sweep cycle, inside the sweeper's fire transaction.
--
-- Plans: the fire's statements are planned afresh at each call (plan_cache_mode = force_custom_plan),
-- from the call's own arrays (its answer joins on a CASE that only a known p_token folds into an
-- equality). The take's are planned once per connection (force_generic_plan, as apply, above): it
-- runs every few milliseconds at a steady load, and planning it at every call was most of a small
-- take (docs/performance.md, "sweep cycle"). A generic plan is built from
-- the table as it was then, so its shape must not depend on the table's size: with sequential and
-- bitmap scans, hash and merge joins off (below) every statement is an index walk under a LIMIT or
-- a probe by key, on the partial due indexes (broker/sql/migrations/0003_timers.sql), whatever the
-- statistics say (tests/test_timers_volume.py caches the plan on an empty table, then takes from a
-- 30,000-row burst never analyzed). A plan cached while the table was nearly empty, with those
-- joins allowed, kept a hash join over a full scan for the life of the connection.
--
-- Takes at most p_batch due rows (due_at <= now(): fresh, backoff elapsed, or lease expired) and
-- WRITES NOTHING to them: the caller runs it in a transaction, packs the rows, fires them with
-- queen_timers_fire (no token) in the same transaction and commits. The transaction is the claim: its
-- partition locks (below) keep other sweepers off the partitions until the commit, a crash rolls it
-- back (the rows were never touched, so they are due again at once), and a cancel or reschedule that
-- comes while the rows are being packed simply wins (the fire matches each row's message id and skips
-- a row that changed or went). Only the fire's delete locks the rows, for the few milliseconds until
-- the commit: a cancel meeting it waits for that commit and then finds the row gone (absent), or, if
-- the fire rolled back, cancels it. A take rewrites no row, so a burst costs one delete per timer, not
-- an update then a delete (a claim stamp writes four index entries per row). A cycle that must hold
-- rows outside a transaction (an injected stall: see broker/timers/sweeper.py) follows the take with queen_timers_lease in the same transaction. Nothing is
-- taken while an operator has paused the sweeper. With p_faults (test hooks) each row may carry an
-- injected fault taken from queen_timer_faults. When fewer than p_batch rows were taken, a last row with tenant NULL carries
-- next_due_ms: how long until the earliest row becomes due (NULL when there is none), by the database
-- clock.
--
-- Fairness: the walk over tenants starts after p_cursor, and while several tenants have due timers
-- each gets at most a slice of the batch (ceil(p_batch / active tenants), capped by p_slice_cap =
-- QUEEN_SWEEPER_TENANT_SLICE). A burst of one tenant then makes short cycles, so another tenant's due
-- timers wait one short cycle instead of one long one. A tenant alone still takes the whole batch.
--
-- Takes are partition-exclusive, so sweepers need no leader (every worker process runs one; they
-- share the work through the database):
--   * a take reads due rows only from (tenant, queue, partition) groups that no live lease holds
--     (claim_token set and claimed_until > now()), and always a partition's earliest due rows;
--   * two sweepers cannot both hold one partition: each first takes pg_try_advisory_xact_lock on it
--     (a partition another sweeper holds is skipped for this cycle), held until its fire commits, and
--     only then, in a later statement with a fresh snapshot, checks that no live lease holds it and
--     reads its rows. A sweeper that gets the lock after another's fire committed therefore does not
--     see the rows that fire deleted.
-- A batch thus holds whole partitions' due prefixes, which its sweeper fires in deliverAt order
-- (the fire orders by queue, partition, deliver_at); the partition's later rows can be taken only once
-- that fire has committed (or rolled back, or a lease has expired or been handed back), so they enter
-- the log after it. Different sweepers fire different partitions in parallel. A row that becomes due
-- while its partition is held waits for the next cycle after the fire; a lease (test hook, or a
-- stalled sweeper) blocks its partition until it ends, never other partitions.
--
-- A take reads only what it takes: the candidate window is two slices per tenant; the candidate
-- partitions are locked one by one, in order, per tenant, until the locked ones that no live lease
-- holds (checked right after each lock, in a fresh snapshot) have at least the tenant's slice of
-- window rows, and partitions past that stay free for the other sweepers. Their earliest due rows are
-- read one partition after the other (lazy nested loops under LIMITs) until the slice (then the batch)
-- is full. A take thus holds few partitions, deep, and leaves the others to the other sweepers.
--
-- ready, per row: its stored bytes are the log's bytes as they are (sealed at schedule, or
-- payload_ready: judged JSON at schedule, see broker/sql/migrations/0018_timer_payload_ready.sql), so the pack
-- has nothing to do for it (queen_timers_sweep fires such batches without Python). A recurring row
-- (recur set, broker/sql/migrations/0025_timers_recur.sql) is never ready: its next occurrence is computed in
-- Python between this take and the fire (broker/timers/recur.py), so it always takes the pack path.
-- CREATE OR REPLACE cannot change a function's result columns, so any earlier queen_timers_take is
-- dropped first (as queen_pop is in log.sql).
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = 'queen_timers_take' LOOP
        EXECUTE format('DROP FUNCTION %s', r.sig);
    END LOOP;
END
$$;
CREATE OR REPLACE FUNCTION queen_timers_take(
    p_batch      integer,
    p_cursor     text,
    p_faults     boolean,
    p_slice_cap  integer
) RETURNS TABLE (tenant text, queue text, timer_key text, partition text, message_id uuid, tid tid,
                 payload bytea, payload_zstd boolean, key_id text, deliver_at timestamptz, fault text,
                 stall_ms integer, next_due_ms bigint, paused boolean, ready boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET jit = off  -- as queen_timers_fire: its candidate query's estimated cost (never analysed) crossed jit_above_cost
-- Every statement here is an index walk under a LIMIT or a probe by key, by design; with these off the
-- planner cannot trade one for a hash join or a scan on a wrong row estimate (never-analyzed table).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
-- And no sort where an index gives the order: once VACUUM had set the row count and the visibility map
-- (still no ANALYZE), the generic plan served "a tenant's earliest due rows" by an index-only scan of
-- (tenant, queue, partition, due_at) plus a sort, reading every entry of a tenant with a million
-- far-future timers each cycle (874 index blocks instead of ~20; tests/test_timers_volume.py).
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    v_active integer;
    v_slice  integer;
    v_lock   integer;
    v_peers  integer;
    v_rows   integer := 0;
    v_te     text[];
    v_q      text[];
    v_p      text[];
    v_tr     bigint[];
    v_prs    bigint[];
    v_pr     bigint;
    v_have   bigint;
    v_cur    text;
    v_tens   text[];
    v_front  bigint;
    v_first  timestamptz;
    r        record;
BEGIN
    IF coalesce((SELECT s.sweeper_paused FROM queen_timer_switches s WHERE s.tenant = '*'), false) THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::tid, NULL::bytea,
                            NULL::boolean, NULL::text, NULL::timestamptz, NULL::text, NULL::integer, NULL::bigint,
                            true, NULL::boolean;
        RETURN;
    END IF;

    -- Which tenants have due timers, and when the next timer is due, without visiting every tenant:
    -- (due_at, tenant) (broker/sql/migrations/0023_timers_due_at.sql) holds all due instants in one order, so
    -- the due rows are its front and the next due instant its first entry. A front of at most a
    -- batch (the steady case: a few rows) names the due tenants exactly. A longer one (a burst) is
    -- not read to its end: the tenants are then found by a skip scan of (tenant, due_at), one descent
    -- per tenant that has timers (its first entry is its earliest), so a tenant's burst cannot hide
    -- another's due rows behind it. Walking queen_tenants and probing each tenant would cost a descent
    -- per tenant of the broker, three times a cycle, and a skip scan one per tenant holding any timer:
    -- both grow with tenants that have nothing due (bench/bench_timers.py, breadth).
    SELECT t.due_at INTO v_first FROM queen_timers t WHERE t.due_at IS NOT NULL ORDER BY t.due_at LIMIT 1;
    IF v_first <= now() THEN  -- anything due at all (an idle cycle reads no front)
        SELECT array_agg(DISTINCT f.tenant), count(*) INTO v_tens, v_front
        FROM (SELECT t.tenant FROM queen_timers t WHERE t.due_at <= now() ORDER BY t.due_at
              LIMIT greatest(p_batch, 1) + 1) f;
        IF v_front > greatest(p_batch, 1) THEN
            WITH RECURSIVE sk AS (
                (SELECT t.tenant, t.due_at FROM queen_timers t WHERE t.due_at IS NOT NULL
                 ORDER BY t.tenant, t.due_at LIMIT 1)
                UNION ALL
                SELECT n.tenant, n.due_at FROM sk CROSS JOIN LATERAL (
                    SELECT t.tenant, t.due_at FROM queen_timers t
                    WHERE t.due_at IS NOT NULL AND t.tenant > sk.tenant
                    ORDER BY t.tenant, t.due_at LIMIT 1) n
            )
            SELECT array_agg(sk.tenant) FILTER (WHERE sk.due_at <= now()) INTO v_tens FROM sk;
        END IF;
    END IF;
    -- Tenants frozen while they move to another cell (broker/sql/functions/cells.sql) are left out:
    -- their fire would be refused and would roll back the other tenants' fires of the cycle.
    IF v_tens IS NOT NULL AND EXISTS (SELECT 1 FROM queen_tenant_freeze) THEN
        v_tens := ARRAY(SELECT u.te FROM unnest(v_tens) AS u(te)
                        WHERE NOT EXISTS (SELECT 1 FROM queen_tenant_freeze f WHERE f.tenant = u.te));
    END IF;
    v_active := coalesce(cardinality(v_tens), 0);

    IF v_active > 0 THEN
        v_slice := greatest(ceil(p_batch::numeric / v_active)::integer, 1);
        IF v_active > 1 THEN
            v_slice := least(v_slice, greatest(p_slice_cap, 1));
        END IF;
        -- A due set that fits one cycle, large enough for its fire to outweigh a cycle's fixed cost
        -- (200 rows), and that has just become due is split between the sweepers (queen.sweeper_peers,
        -- set on their sessions: this broker's workers): each locks partitions for its share only, and
        -- the sweepers that wake at its instant fire it side by side. Without the split the first
        -- sweeper locked every partition of a 1,000-timer burst and fired it alone on one core while the
        -- other found nothing. A
        -- share is whole partitions (the claim below drains every partition locked, up to the batch),
        -- so no partition is left half fired. "Just due": its first instant passed less than
        -- queen.sweeper_split_window_ms ago (25): a sweeper that is alone comes back for the rest at once
        -- (its next_due_ms has passed), finds it older than that, and takes it all, so it pays one cycle
        -- more, not one per halving.
        v_lock := v_slice;
        IF v_front BETWEEN 200 AND p_batch THEN  -- (the settings are read only for such a front)
            v_peers := coalesce(nullif(current_setting('queen.sweeper_peers', true), '')::integer, 1);
            IF v_peers > 1 AND v_first > now() - coalesce(nullif(current_setting('queen.sweeper_split_window_ms', true),
                                                                 '')::integer, 25) * interval '1 millisecond' THEN
                v_lock := least(v_slice, greatest(ceil(ceil(v_front::numeric / v_peers) / v_active)::integer, 1));
            END IF;
        END IF;

        -- 1. Candidate partitions: per tenant (rotating from after p_cursor), the partitions of its
        --    earliest due rows (a window of a few slices, so a partition held by another sweeper does
        --    not leave this one idle). Lock them in order, skipping any another claimer is taking right
        --    now, until the locked ones hold the tenant's slice of window rows.
        FOR r IN
            WITH ten AS (
                SELECT u.te AS tenant,
                       row_number() OVER (ORDER BY (u.te COLLATE "C" > coalesce(p_cursor, '')) DESC,
                                                   u.te COLLATE "C") AS tr
                FROM unnest(v_tens) AS u(te)
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
            CONTINUE WHEN v_have >= v_lock;
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
            -- Each row is read once, from the partition walk, with what the fire needs; nothing is
            -- locked or written: the partitions are ours until this transaction ends (the advisory
            -- locks above), and the fire deletes by ctid only a row that still has the message id read
            -- here, so a row cancelled or rescheduled meanwhile is not fired.
            claimed AS MATERIALIZED (
                SELECT y.*
                FROM (SELECT ften.te, ften.tr FROM ften ORDER BY ften.tr) ft
                CROSS JOIN LATERAL (
                    SELECT x.*
                    FROM (SELECT f2.te, f2.q, f2.p, f2.pr FROM free f2 WHERE f2.te = ft.te ORDER BY f2.pr) f
                    CROSS JOIN LATERAL (
                        SELECT t.tenant, t.queue, t.timer_key, t.partition, t.message_id, t.payload,
                               t.payload_zstd, t.key_id, t.deliver_at, t.ctid AS tid, t.payload_ready,
                               t.recur IS NULL AS once
                        FROM queen_timers t
                        WHERE t.tenant = f.te AND t.queue = f.q AND t.partition = f.p AND t.due_at <= now()
                        ORDER BY t.due_at
                        LIMIT v_slice
                    ) x
                    LIMIT v_slice
                ) y
                LIMIT p_batch
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
            -- Without the test hooks (p_faults false: every sweeper's usual take) the rows go out as
            -- claimed: the branch that numbers them for the injected faults sits under a one-time filter
            -- and is never run (its window would sort every row taken).
            SELECT c.tenant, c.queue, c.timer_key, c.partition, c.message_id, c.tid, c.payload,
                   c.payload_zstd, c.key_id, c.deliver_at, NULL::text, NULL::integer,
                   NULL::bigint, false, (c.key_id IS NOT NULL OR c.payload_ready) AND c.once
            FROM claimed c
            WHERE NOT p_faults
            UNION ALL
            SELECT n.tenant, n.queue, n.timer_key, n.partition, n.message_id, n.tid, n.payload,
                   n.payload_zstd, n.key_id, n.deliver_at,
                   CASE WHEN tk.took IS NOT NULL AND n.rn <= tk.took THEN tk.failure_class END,
                   CASE WHEN tk.took IS NOT NULL AND n.rn <= tk.took THEN tk.stall_ms END,
                   NULL::bigint, false, (n.key_id IS NOT NULL OR n.payload_ready) AND n.once
            FROM numbered n
            LEFT JOIN taken tk ON tk.tenant = n.tenant AND tk.queue = n.queue
            WHERE p_faults
            ORDER BY 1, 2, 4, 10, 3;
            GET DIAGNOSTICS v_rows = ROW_COUNT;
        END IF;
    END IF;

    IF v_rows = 0 AND v_first <= now() THEN
        -- Due rows were seen, none was taken: read the first due instant again, in a fresh snapshot.
        -- The rows seen may be gone by now: another sweeper fired them and committed between the read
        -- at the top and the partition lock taken here (the take then finds its partition empty). Answered
        -- with the old instant, this sweeper took itself for blocked and slept BLOCKED_SLEEP_MS, while the
        -- other one, back at once after its commit, found that lock held and slept as well: both asleep
        -- for 50 ms, and every timer due meanwhile fired up to 50 ms late (a steady 1,000/s into one
        -- partition: 3 such pairs in 10 s, fire-start p99 17 ms, max 50 ms).
        SELECT t.due_at INTO v_first FROM queen_timers t WHERE t.due_at IS NOT NULL ORDER BY t.due_at LIMIT 1;
    END IF;
    IF v_rows < p_batch THEN
        RETURN QUERY
        SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::tid, NULL::bytea,
               NULL::boolean, NULL::text, NULL::timestamptz, NULL::text, NULL::integer,
               ceil(extract(epoch FROM v_first - now()) * 1000)::bigint, false, NULL::boolean;
        -- (v_first: the earliest due instant read at the top, the rows taken included)
    END IF;
END
$$;

-- queen_timers_fire_ready: the fire of a sweep cycle whose every row taken is ready (queen_timers_sweep),
-- what queen_timers_fire does for such rows with no token, no packed payload and no failure: delete the
-- rows taken in this transaction (p_tids, with the message ids read, p_ids) that are unchanged (same ctid
-- and message id, no live lease; the row deleted says what to push) and push
-- them through queen_push in (queue, partition, deliverAt, key) order; one row per timer fired, kind
-- 'fired' or 'duplicate', lag_s from the clock after the push. A push the database refuses is undone
-- here and answered by one row of kind 'error' (tenant = SQLSTATE, queue = message), as
-- queen_timers_fire answers it, so the caller can fall back to packing the rows.
-- Planned once per connection: it runs every few milliseconds at a steady load, and queen_timers_fire's
-- per-call planning (it must fold p_token's CASEs) is a fifth of a small cycle. Its statements stay one shape whatever the table size or the statistics: the delete
-- is a nested loop over the (ctid, message id) pairs probing by ctid (a TID scan per pair; with the
-- joins and scans below off nothing else is possible), so it neither scans the table nor compares every
-- row with every id; the push's answer is zipped with the pushed keys by position, not joined.
CREATE OR REPLACE FUNCTION queen_timers_fire_ready(
    p_ids  uuid[],
    p_tids tid[]
) RETURNS TABLE (kind text, tenant text, queue text, timer_key text, lag_s double precision)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    r        record;
    v_st     text[];
    v_pushes integer := 0;
BEGIN
    BEGIN
        FOR r IN
            WITH gone AS (
                DELETE FROM queen_timers t
                USING unnest(p_tids, p_ids) AS u(tid, id)
                WHERE t.ctid = u.tid AND t.message_id = u.id
                  AND NOT (t.claim_token IS NOT NULL AND t.claimed_until > now())
                RETURNING t.tenant, t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.payload,
                          t.payload_zstd, t.key_id, t.producer_sub, t.deliver_at
            )
            SELECT g.tenant,
                   array_agg(g.queue COLLATE "default" ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS qs,
                   array_agg(g.partition COLLATE "default" ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS ps,
                   array_agg(g.message_id ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS ids,
                   array_agg(g.txn COLLATE "default" ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS txns,
                   array_agg(g.payload ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS pls,
                   array_agg(CASE WHEN g.payload_zstd THEN 1::smallint ELSE 0::smallint END
                             ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS cs,
                   array_agg(g.key_id ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS kids,
                   array_agg(g.producer_sub ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS subs,
                   array_agg(g.timer_key ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS keys,
                   array_agg(g.deliver_at ORDER BY g.queue, g.partition, g.deliver_at, g.timer_key) AS dats
            FROM gone g GROUP BY g.tenant ORDER BY g.tenant
        LOOP
            -- One push per tenant, and each push that writes as if all were new opens a subtransaction
            -- (broker/sql/functions/log.sql); past 64 in one transaction PostgreSQL's per-backend cache of them
            -- overflows and every other session's snapshots pay for it while the fire runs. From the
            -- 32nd tenant of a cycle the pushes take the careful statement (no subtransaction); the
            -- setting ends with this function (its SET clauses scope it).
            v_pushes := v_pushes + 1;
            IF v_pushes = 32 THEN
                PERFORM set_config('queen.push_careful', 'on', true);
            END IF;
            v_st := ARRAY(
                SELECT qp.st
                FROM queen_push(r.tenant, r.qs, r.ps, r.ids, r.txns,
                                array_fill(NULL::uuid, ARRAY[cardinality(r.qs)]), r.pls, r.cs, r.kids, r.subs,
                                array_fill(NULL::bigint, ARRAY[cardinality(r.qs)])) AS qp(i, st, mid, pid, seq)
                ORDER BY qp.i);
            RETURN QUERY
            SELECT CASE WHEN u.st = 'queued' THEN 'fired' ELSE 'duplicate' END, r.tenant, u.q, u.k,
                   extract(epoch FROM clock_timestamp() - u.d)::double precision
            FROM unnest(v_st, r.qs, r.keys, r.dats) AS u(st, q, k, d);
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        RETURN QUERY SELECT 'error'::text, SQLSTATE::text, SQLERRM::text, NULL::text, NULL::double precision;
    END;
END
$$;

-- queen_timers_sweep: one sweep cycle's take and, when nothing in it needs Python, its fire, in ONE
-- statement (one round trip, no payload leaving the database). It takes exactly what queen_timers_take
-- takes (same partition locks, fairness and order); then:
--   * every row taken is ready (no injected fault, and its stored bytes are the log's bytes: sealed at
--     schedule, or payload_ready) -> it fires them with queen_timers_fire_ready, as queen_timers_fire
--     (no token) would fire them with no sealed payload, and returns the fire's rows (kind 'fired' /
--     'duplicate');
--   * otherwise, or when that fire failed (its work undone inside queen_timers_fire_ready, the
--     transaction and its partition locks still held) -> with p_in_tx (the caller runs it inside a
--     transaction it will fire in) it returns the taken rows (kind 'taken', as queen_timers_take returns
--     them, in its order), and the sweeper packs and fires them as before, failures included; without
--     p_in_tx (the statement is its own transaction: the sweeper's usual cycle, so the whole cycle is
--     one round trip with no BEGIN and COMMIT) it returns one row of kind 'unready' and takes nothing,
--     and the sweeper takes again inside a transaction.
-- The last row is always kind 'summary': tenant = the first taken row's tenant (the next cursor), taken =
-- how many rows were taken (0 with 'unready'), next_due_ms and paused as queen_timers_take gives them.
-- Why in the database: packing in Python costs the worker decoding the take's rows, checking JSON it
-- had already checked at schedule and sending seven arrays back, for rows whose stored bytes are final.
-- Taken rows also carry recur (the row's schedule, NULL for a one-shot timer: read by ctid, only on this
-- path) and db_now (this transaction's now()): the sweeper computes a recurring row's next occurrence
-- from them (broker/timers/recur.py) by the database's clock. Result columns changed: drop any earlier one.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = 'queen_timers_sweep'
               AND NOT ('recur' = ANY (coalesce(p.proargnames, ARRAY[]::text[]))) LOOP
        EXECUTE format('DROP FUNCTION %s', r.sig);
    END LOOP;
END
$$;
CREATE OR REPLACE FUNCTION queen_timers_sweep(
    p_batch           integer,
    p_cursor          text,
    p_faults          boolean,
    p_slice_cap       integer,
    p_max_attempts    integer,
    p_backoff_base_ms bigint,
    p_backoff_cap_ms  bigint,
    p_in_tx           boolean
) RETURNS TABLE (kind text, tenant text, queue text, timer_key text, partition text, message_id uuid, tid tid,
                 payload bytea, payload_zstd boolean, key_id text, deliver_at timestamptz, fault text,
                 stall_ms integer, next_due_ms bigint, paused boolean, taken integer, lag_s double precision,
                 recur text, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
SET jit = off  -- as queen_timers_take and queen_timers_fire
AS $$
#variable_conflict use_column
DECLARE
    v_te   text[];
    v_q    text[];
    v_k    text[];
    v_p    text[];
    v_id   uuid[];
    v_tid  tid[];
    v_pl   bytea[];
    v_z    boolean[];
    v_kid  text[];
    v_dat  timestamptz[];
    v_f    text[];
    v_st   integer[];
    v_n    integer;
    v_go   boolean;
    v_next bigint;
    v_paus boolean;
    f_kind text[];
    f_te   text[];
    f_q    text[];
    f_k    text[];
    f_lag  double precision[];
BEGIN
    SELECT array_agg(t.tenant ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.queue ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.timer_key ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.partition ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.message_id ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.tid ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.payload ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.payload_zstd ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.key_id ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.deliver_at ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.fault ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           array_agg(t.stall_ms ORDER BY t.o) FILTER (WHERE t.tenant IS NOT NULL),
           count(*) FILTER (WHERE t.tenant IS NOT NULL),
           coalesce(bool_and(t.ready AND t.fault IS NULL) FILTER (WHERE t.tenant IS NOT NULL), false),
           max(t.next_due_ms) FILTER (WHERE t.tenant IS NULL),
           coalesce(bool_or(t.paused) FILTER (WHERE t.tenant IS NULL), false)
      INTO v_te, v_q, v_k, v_p, v_id, v_tid, v_pl, v_z, v_kid, v_dat, v_f, v_st, v_n, v_go, v_next, v_paus
    FROM queen_timers_take(p_batch, p_cursor, p_faults, p_slice_cap) WITH ORDINALITY AS t(
             tenant, queue, timer_key, partition, message_id, tid, payload, payload_zstd, key_id, deliver_at,
             fault, stall_ms, next_due_ms, paused, ready, o);

    IF v_go THEN
        SELECT array_agg(f.kind), array_agg(f.tenant), array_agg(f.queue), array_agg(f.timer_key), array_agg(f.lag_s)
          INTO f_kind, f_te, f_q, f_k, f_lag
        FROM queen_timers_fire_ready(v_id, v_tid) f;
        v_go := NOT coalesce('error' = ANY (f_kind), false);
    END IF;

    IF NOT v_go AND v_n > 0 AND NOT p_in_tx THEN
        -- Rows to pack (or a fire refused), and no transaction of the caller's to hold them in while it
        -- packs: the statement ends here, taking nothing (the take wrote nothing, and the partition
        -- locks end with this statement); the caller takes again inside a transaction.
        RETURN QUERY SELECT 'unready'::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::tid,
                            NULL::bytea, NULL::boolean, NULL::text, NULL::timestamptz, NULL::text, NULL::integer,
                            NULL::bigint, NULL::boolean, v_n, NULL::double precision, NULL::text, NULL::timestamptz;
        v_n := 0;
        v_te := NULL;
    END IF;

    IF v_go THEN
        RETURN QUERY SELECT u.kind, u.te, u.q, u.k, NULL::text, NULL::uuid, NULL::tid, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::timestamptz, NULL::text, NULL::integer, NULL::bigint, NULL::boolean,
                            NULL::integer, u.lag, NULL::text, NULL::timestamptz
                     FROM unnest(f_kind, f_te, f_q, f_k, f_lag) AS u(kind, te, q, k, lag);
    ELSIF v_n > 0 THEN
        RETURN QUERY SELECT 'taken'::text, u.te, u.q, u.k, u.p, u.id, u.tid, u.pl, u.z, u.kid, u.dat, u.f, u.st,
                            NULL::bigint, NULL::boolean, NULL::integer, NULL::double precision,
                            (SELECT t.recur FROM queen_timers t WHERE t.ctid = u.tid), now()
                     FROM unnest(v_te, v_q, v_k, v_p, v_id, v_tid, v_pl, v_z, v_kid, v_dat, v_f, v_st)
                          WITH ORDINALITY AS u(te, q, k, p, id, tid, pl, z, kid, dat, f, st, o)
                     ORDER BY u.o;
    END IF;
    RETURN QUERY SELECT 'summary'::text, v_te[1], NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::tid,
                        NULL::bytea, NULL::boolean, NULL::text, NULL::timestamptz, NULL::text, NULL::integer,
                        v_next, v_paus, v_n, NULL::double precision, NULL::text, NULL::timestamptz;
END
$$;

-- queen_timers_lease: stamp rows just taken (matched by key and message id, so only the version the
-- taker read) with p_token and a lease: claimed_until = due_at = clock_timestamp() + p_lease_ms,
-- measured when the stamp is written, so a slow take does not eat its own lease (a lease counted from
-- the transaction's start would be shortened by the take's own duration). A leased row answers too_late to a cancel or reschedule and reads
-- claimed: true until queen_timers_fire (by token) deletes it, its lease expires, or it is handed back.
CREATE OR REPLACE FUNCTION queen_timers_lease(
    p_token      uuid,
    p_lease_ms   bigint,
    p_claimed_by text,
    p_tenants    text[],
    p_queues     text[],
    p_keys       text[],
    p_ids        uuid[]
) RETURNS TABLE (tenant text, queue text, timer_key text, claimed_until timestamptz)
LANGUAGE sql VOLATILE
SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    UPDATE queen_timers t
       SET claim_token = p_token, claimed_until = st.until, due_at = st.until, claimed_by = p_claimed_by
    FROM unnest(p_tenants, p_queues, p_keys, p_ids) AS u(te, q, k, id),
         (SELECT clock_timestamp() + p_lease_ms * interval '1 millisecond' AS until) st
    WHERE t.tenant = u.te AND t.queue = u.q AND t.timer_key = u.k AND t.message_id = u.id
    RETURNING t.tenant, t.queue, t.timer_key, t.claimed_until
$$;

-- queen_timers_recur_apply: create/replace, pause and resume recurring timers (broker/timers/recur.py), a
-- batch in one call. Index i = op i; every (queue, key) at most once (the caller refuses duplicates).
-- Cancel is queen_timers_apply's (it deletes a recurring row like any other), and a one-shot schedule
-- on a recurring key replaces it with a one-shot timer (queen_timers_apply clears recur).
--   'schedule' -> 'scheduled' | 'rescheduled' (an existing row, one-shot or recurring, replaced: attempts
--                 reset, the occurrences counted from zero) | 'too_late' (the row is claimed). The first
--                 occurrence: now() + p_delays[i] ms for an interval schedule; for a cron schedule the
--                 earliest of its candidates (p_cands where p_cand_idx = i, computed by the broker around
--                 its own clock) that is after the DATABASE's now(): the one clock decides. None after
--                 now() (the database's clock is more than the broker's margin ahead of the broker's):
--                 SQLSTATE QT003, the whole call refused. The row's txn is the occurrence's frame txn,
--                 p_txns[i] || '@' || the instant (UTC, microseconds), as the sweeper builds the next ones.
--   'pause'    -> 'paused' (due_at NULL: no take reads it; already paused is no change) | 'not_recurring'
--                 (a one-shot timer) | 'absent' | 'too_late' (claimed: the occurrence is being fired).
--   'resume'   -> 'resumed' (due_at = deliver_at: the occurrence it was paused at is due at once when it
--                 passed, and the schedule's missed policy decides what fires) | 'not_recurring' | 'absent'
--                 | 'too_late'.
-- Set-based, a handful of statements whatever the batch (a statement per op cost each op the
-- statement-level triggers of queen_timers: 256 cron schedules took 23 ms in this function, see
-- docs/performance.md): (1) the batch's existing rows are locked in key order, the lock order of
-- queen_timers_apply, and what the answers need of them is kept; (2) the schedules are written by one
-- INSERT in key order; (3) pauses and resumes by one UPDATE each, on rows already locked; (4) the answers.
-- Two batches wait for each other in key order. One interleaving can still deadlock (a key another
-- transaction creates between this call's lock step and its INSERT, while a third batch holds it): the
-- database breaks it and the call answers 503 database_conflict, nothing of it written.
-- Encryption and the scheduling switch as queen_timers_apply (QT002, QT001). NOTIFY as apply: a first
-- occurrence or a resumed one due within p_near_ms wakes the sweepers.
CREATE OR REPLACE FUNCTION queen_timers_recur_apply(
    p_tenant       text,
    p_sub          text,
    p_check_switch boolean,
    p_near_ms      bigint,
    p_ops          text[],
    p_queues       text[],
    p_keys         text[],
    p_partitions   text[],
    p_txns         text[],
    p_ids          uuid[],
    p_payloads     bytea[],
    p_zstd         boolean[],
    p_key_ids      text[],
    p_recur        text[],
    p_delays       bigint[],
    p_cand_idx     integer[],
    p_cands        timestamptz[]
) RETURNS TABLE (idx integer, status text, txn text, message_id uuid, deliver_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_bad     text;
    v_near    timestamptz;
    v_resumed timestamptz;
    -- by op index: the key's row existed, was recurring, was claimed (its occurrence being fired)
    c_found   boolean[];
    c_rec     boolean[];
    c_claimed boolean[];
    v_first   timestamptz[];  -- by op index: a schedule's first occurrence
BEGIN
    IF p_check_switch AND NOT queen_timers_scheduling_enabled() THEN
        RAISE EXCEPTION 'timer scheduling is switched off by an operator' USING ERRCODE = 'QT001';
    END IF;
    SELECT i.q INTO v_bad
    FROM (SELECT DISTINCT u.q FROM unnest(p_ops, p_queues, p_key_ids) AS u(op, q, k)
          WHERE u.op = 'schedule' AND u.k IS NULL) i
    WHERE EXISTS (SELECT 1 FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = i.q AND qq.encryption_enabled)
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'queue % encrypts at rest', v_bad USING ERRCODE = 'QT002', DETAIL = v_bad;
    END IF;
    IF 'schedule' = ANY (p_ops) THEN
        INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    END IF;

    -- (1) lock, in key order
    SELECT array_agg(l.timer_key IS NOT NULL ORDER BY u.i),
           array_agg(coalesce(l.recurring, false) ORDER BY u.i),
           array_agg(coalesce(l.claimed, false) ORDER BY u.i)
      INTO c_found, c_rec, c_claimed
    FROM generate_subscripts(p_ops, 1) AS u(i)
    LEFT JOIN (SELECT t.queue, t.timer_key, t.recur IS NOT NULL AS recurring,
                      (t.claim_token IS NOT NULL AND t.claimed_until > now()) AS claimed
               FROM unnest(p_queues, p_keys) AS k(q, k)
               JOIN queen_timers t ON t.tenant = p_tenant AND t.queue = k.q AND t.timer_key = k.k
               ORDER BY t.queue, t.timer_key
               FOR UPDATE OF t) l ON l.queue = p_queues[u.i] AND l.timer_key = p_keys[u.i];

    -- (2) the schedules. The first occurrence: now() + the delay of an interval schedule; a cron
    -- schedule's earliest candidate after now().
    IF 'schedule' = ANY (p_ops) THEN
        SELECT array_agg(CASE WHEN u.d IS NOT NULL THEN now() + u.d * interval '1 millisecond' ELSE f.t END
                         ORDER BY u.i)
          INTO v_first
        FROM unnest(p_delays) WITH ORDINALITY AS u(d, i)
        LEFT JOIN (SELECT c.i, min(c.t) AS t FROM unnest(p_cand_idx, p_cands) AS c(i, t)
                   WHERE c.t > now() GROUP BY c.i) f ON f.i = u.i;
        IF EXISTS (SELECT 1 FROM generate_subscripts(p_ops, 1) AS u(i)
                   WHERE p_ops[u.i] = 'schedule' AND NOT c_claimed[u.i] AND v_first[u.i] IS NULL) THEN
            RAISE EXCEPTION 'no first occurrence after the database clock among the broker''s candidates'
                USING ERRCODE = 'QT003';
        END IF;
        WITH s AS (
            SELECT u.q, u.k, coalesce(u.p, 'Default') AS p, u.t, u.id, u.pl, coalesce(u.z, false) AS z, u.kid, u.rc,
                   v_first[u.i] AS first
            FROM unnest(p_ops, p_queues, p_keys, p_partitions, p_txns, p_ids, p_payloads, p_zstd, p_key_ids, p_recur)
                 WITH ORDINALITY AS u(op, q, k, p, t, id, pl, z, kid, rc, i)
            WHERE u.op = 'schedule' AND NOT c_claimed[u.i]
        ), ins AS (
            INSERT INTO queen_timers AS t (tenant, queue, timer_key, partition, txn, message_id, payload,
                                           payload_zstd, key_id, producer_sub, deliver_at, due_at, payload_ready,
                                           recur, occurrences, last_fired_at)
            SELECT p_tenant, s.q, s.k, s.p,
                   s.t || '@' || to_char(s.first AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                   s.id, s.pl, s.z, s.kid, p_sub, s.first, s.first, false, s.rc, 0, NULL
            FROM s
            ORDER BY s.q, s.k
            ON CONFLICT (tenant, queue, timer_key) DO UPDATE
               SET partition = excluded.partition, txn = excluded.txn, message_id = excluded.message_id,
                   payload = excluded.payload, payload_zstd = excluded.payload_zstd, key_id = excluded.key_id,
                   payload_ready = false, producer_sub = excluded.producer_sub, deliver_at = excluded.deliver_at,
                   due_at = excluded.due_at, attempts = 0, failures = 0, last_error = NULL,
                   claim_token = NULL, claimed_until = NULL, claimed_by = NULL, updated_at = now(),
                   recur = excluded.recur, occurrences = 0, last_fired_at = NULL
            RETURNING t.deliver_at
        )
        SELECT min(ins.deliver_at) INTO v_near FROM ins;
    END IF;

    -- (3) pauses (due_at NULL: no take reads it) and resumes (due_at = deliver_at: the occurrence it was
    -- paused at is due at once when it passed, and the missed policy decides what fires)
    IF 'pause' = ANY (p_ops) THEN
        UPDATE queen_timers t SET due_at = NULL, updated_at = now()
        FROM unnest(p_ops, p_queues, p_keys) WITH ORDINALITY AS u(op, q, k, i)
        WHERE u.op = 'pause' AND c_rec[u.i] AND NOT c_claimed[u.i]
          AND t.tenant = p_tenant AND t.queue = u.q AND t.timer_key = u.k AND t.due_at IS NOT NULL;
    END IF;
    IF 'resume' = ANY (p_ops) THEN
        WITH r AS (
            UPDATE queen_timers t SET due_at = t.deliver_at, updated_at = now()
            FROM unnest(p_ops, p_queues, p_keys) WITH ORDINALITY AS u(op, q, k, i)
            WHERE u.op = 'resume' AND c_rec[u.i] AND NOT c_claimed[u.i]
              AND t.tenant = p_tenant AND t.queue = u.q AND t.timer_key = u.k AND t.due_at IS NULL
            RETURNING t.deliver_at
        )
        SELECT min(r.deliver_at) INTO v_resumed FROM r;
        v_near := least(v_near, v_resumed);
    END IF;

    IF p_near_ms >= 0 AND v_near IS NOT NULL AND v_near <= now() + p_near_ms * interval '1 millisecond' THEN
        PERFORM pg_notify('queen_timers', greatest(ceil(extract(epoch FROM v_near - now()) * 1000), 0)::bigint::text);
    END IF;

    -- (4) the answers, in op order: what a row holds now (this call wrote it or holds its lock)
    RETURN QUERY
    SELECT u.i::integer, a.st,
           CASE WHEN a.st = 'too_late' THEN NULL WHEN a.st = 'absent' THEN u.t ELSE t.txn END,
           CASE WHEN a.st IN ('scheduled', 'rescheduled', 'paused', 'resumed') THEN t.message_id END,
           CASE WHEN a.st IN ('scheduled', 'rescheduled', 'paused', 'resumed') THEN t.deliver_at END
    FROM unnest(p_ops, p_queues, p_keys, p_txns) WITH ORDINALITY AS u(op, q, k, t, i)
    CROSS JOIN LATERAL (
        SELECT CASE WHEN c_claimed[u.i] THEN 'too_late'
                    WHEN u.op = 'schedule' THEN CASE WHEN c_found[u.i] THEN 'rescheduled' ELSE 'scheduled' END
                    WHEN NOT c_found[u.i] THEN 'absent'
                    WHEN NOT c_rec[u.i] THEN 'not_recurring'
                    WHEN u.op = 'pause' THEN 'paused'
                    ELSE 'resumed' END AS st
    ) a
    LEFT JOIN queen_timers t ON t.tenant = p_tenant AND t.queue = u.q AND t.timer_key = u.k
    ORDER BY u.i;
END
$$;
