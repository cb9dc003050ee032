-- The message log's functions: push, pop, ack, dead letters, wake-ups of long polls and retention.
-- Tables: broker/sql/migrations/0001_foundation.sql and 0002_log.sql.
-- Re-applied at boot when any function file changes (docs/guides/deploying.md, "Schema and upgrades"): CREATE OR
-- REPLACE statements only; tables, indexes and data belong in forward-only migrations.

-- A new partition's id: the next queen_partition_numbers value n inside a version-8 UUID,
-- 00000000-0000-8000-(n with its top two bits set to the variant 10), so the number travels as the
-- u64 of a framed pop answer and comes back as a decimal string (broker/ids.py partition_uuid).
-- (plpgsql: its body names the sequence of migration 0014, and these files are applied after earlier
-- migrations too, where a LANGUAGE sql body would be checked against a schema without it.)
CREATE OR REPLACE FUNCTION queen_partition_id() RETURNS uuid LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    h text := lpad(to_hex(nextval('queen_partition_numbers') | x'8000000000000000'::bigint), 16, '0');
BEGIN
    RETURN ('00000000-0000-8000-' || substr(h, 1, 4) || '-' || substr(h, 5, 12))::uuid;
END
$$;

-- queen_push: write a batch of messages in one statement. Every writer of the log (push, transaction,
-- timer fire) goes through it.
--
-- Items are given as parallel arrays (index i of each array is item i). Queues and partitions are
-- created on first use (queen_queues.partition_count follows). Returns one row per item, in item order:
--   status 'queued'    -> the message was written with message_id/partition_id/seq
--   status 'duplicate' -> (partition, txn) already exists (or repeats an earlier item of this batch);
--                         message_id is the existing message's id
-- Wakes the long polls waiting on the queues touched (queen_wake, delivered at commit).
--
-- How it stays fast:
--   * Almost every batch goes to ONE partition (the client's queue(q).partition(p).push([...]) sends
--     one request per partition), so that case takes a fast path: one key lookup that locks the
--     partition row and reads next_seq, then one statement that dedupes, numbers, inserts and moves
--     next_seq. (Profiled before: the array-driven statements that create missing partitions and lock
--     the batch's partitions cost ~0.19 ms each even when nothing was missing.)
--   * Batches over several partitions take the general path: short statements create what is
--     missing only when it is missing, one takes the partition row locks in a fixed order (two
--     batches over the same partitions cannot deadlock), and ONE set-based statement, run after the
--     locks are held (so its snapshot sees every committed message of those partitions), finds
--     duplicates, numbers the new items per partition, inserts them and moves next_seq.
--   * Both paths first write the batch as if every item were new (no retry, no txn repeated in the
--     batch: the common case), in a subtransaction: numbered by position, no duplicate lookup at all.
--     A duplicate breaks the unique (tenant, partition_id, txn) index, which undoes that attempt, and
--     the statement that finds duplicates runs instead (and runs first where the transaction-local
--     setting queen.push_careful is on: a timer fire past its 31st tenant's push, which keeps a fire's
--     subtransactions under the 64 a backend caches). Batches of 10 items and more are faster so, a
--     one-item push no slower (docs/performance.md, "push").
--   * The duplicate lookup (both paths, once a batch has a duplicate) is a correlated scalar probe per
--     item: never flattened into a join, it binds all three key columns of the unique (tenant,
--     partition_id, txn) index. A LEFT JOIN was planned (generic plan) with partition_id as a mere
--     join filter, a scan of the tenant's whole index per item, growing with the tenant's messages; the
--     fast path's join, even with partition_id bound, became a hash of the WHOLE partition under the
--     generic plan (estimated one row), growing with the partition. As a probe it reads only its
--     items' rows (tests/test_log_push_paths.py counts them). KNOWN: on a table never
--     analyzed the general path's probe may still be planned on the primary key (tenant, partition_id)
--     with txn as a filter, i.e. the partition read once per item.
--   * plan_cache_mode = force_generic_plan: its statements are planned once per connection instead of
--     at every call: planning at every call was over half the cost of a one-item push, the common
--     case; a batch of 1,000, where execution dominates, pays a little for the generic plan.
--   * There is no (tenant, txn) index: the lookup by (queue, txn) probes the unique
--     (tenant, partition_id, txn) index per partition of the queue, and no write pays for a second index.
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
    v_dq   text[];
    v_dp   text[];
    v_tids tid[];
    v_pids uuid[];
    v_refill uuid[];
    v_have integer;
    v_mtids text[];
    v_ord  integer;
    v_mq   text[];
    v_mn   integer[];
    v_ok   boolean := false;
    v_oi   integer[];
    v_oid  uuid[];
    v_opid uuid[];
    v_oseq bigint[];
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
            VALUES (p_tenant, queen_partition_id(), v_q, v_p)
            ON CONFLICT (tenant, queue, name) DO NOTHING;
            GET DIAGNOSTICS v_new = ROW_COUNT;
            IF v_new > 0 THEN  -- an increment, never a recount: see the general path below
                UPDATE queen_queues qq SET partition_count = qq.partition_count + v_new
                WHERE qq.tenant = p_tenant AND qq.name = v_q
                RETURNING qq.partition_count INTO v_ord;
                UPDATE queen_partitions qp SET ordinal = v_ord
                WHERE qp.tenant = p_tenant AND qp.queue = v_q AND qp.name = v_p;
            END IF;
            SELECT qp.id, qp.next_seq INTO v_pid, v_next FROM queen_partitions qp
            WHERE qp.tenant = p_tenant AND qp.queue = v_q AND qp.name = v_p
            FOR UPDATE;
        END IF;

        -- First as if every item were new (the common case: no retry, no repeat in the batch): no
        -- duplicate probe per item, no window over txns; numbered by position. A duplicate, stored or
        -- within the batch, breaks the unique (tenant, partition_id, txn) index: that attempt is undone
        -- (its own subtransaction) and the batch goes through the statement below, which finds them.
        IF current_setting('queen.push_careful', true) IS DISTINCT FROM 'on' THEN
            BEGIN
                WITH ins AS (
                    INSERT INTO queen_messages (tenant, partition_id, seq, id, txn, trace_id, payload, codec, key_id,
                                                producer_sub, deadline_at)
                    SELECT p_tenant, v_pid, v_next - 1 + u.ord, u.id, u.t, u.tr, u.pl, coalesce(u.c, 0), u.k, u.s,
                           CASE WHEN u.d IS NULL THEN NULL ELSE now() + u.d * interval '1 millisecond' END
                    FROM unnest(p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids, p_subs, p_deadline_ms)
                         WITH ORDINALITY AS u(id, t, tr, pl, c, k, s, d, ord)
                    ORDER BY u.ord
                    RETURNING 1
                )
                UPDATE queen_partitions qp SET next_seq = v_next + c.n, last_push_at = now()
                FROM (SELECT count(*) AS n FROM ins) c
                WHERE qp.tenant = p_tenant AND qp.id = v_pid AND c.n > 0;
                v_ok := true;
            EXCEPTION WHEN unique_violation THEN
                v_ok := false;
            END;
        END IF;
        -- Every group has something to hand out here again (migration 0027): under the row lock taken above
        -- (the general path's statement, for the one partition).
        UPDATE queen_cursors cu SET ready = true
        WHERE cu.tenant = p_tenant AND cu.partition_id = v_pid AND NOT cu.ready;
        IF v_ok THEN
            RETURN QUERY
            SELECT u.ord::integer, 'queued'::text, u.id, v_pid, v_next - 1 + u.ord
            FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
            ORDER BY u.ord;
            PERFORM queen_wake(p_tenant, ARRAY[v_q]);
            RETURN;
        END IF;

        RETURN QUERY
        WITH items AS (
            SELECT u.ord::integer AS i, u.id, u.t, u.tr, u.pl, u.c, u.k, u.s, u.d
            FROM unnest(p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids, p_subs, p_deadline_ms)
                 WITH ORDINALITY AS u(id, t, tr, pl, c, k, s, d, ord)
        ), located AS (
            SELECT it.*,
                   (SELECT ex.id FROM queen_messages ex
                    WHERE ex.tenant = p_tenant AND ex.partition_id = v_pid AND ex.txn = it.t) AS existing_id,
                   first_value(it.i) OVER w AS first_i, first_value(it.id) OVER w AS first_id
            FROM items it
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
    -- Every read of queen_queues and queen_partitions below is a probe by key of one of the batch's
    -- queues or partitions, never a read of the tenant's rows: joined on (queue, name), the planner read
    -- all of them (a bitmap scan by tenant, hashed), and under a caller's planner settings with hash joins
    -- and bitmap scans off (the timer fire) it compared every item with every partition of the tenant,
    -- a cost growing with the tenant's partitions (tests/test_log_push_paths.py counts the rows read).
    IF NOT EXISTS (SELECT 1 FROM queen_tenants t WHERE t.tenant = p_tenant) THEN
        INSERT INTO queen_tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    END IF;

    -- The batch's distinct partitions, in the order their rows are locked below (queue, then name, in
    -- the columns' "C" collation).
    SELECT array_agg(d.q ORDER BY d.q COLLATE "C", d.p COLLATE "C"),
           array_agg(d.p ORDER BY d.q COLLATE "C", d.p COLLATE "C")
      INTO v_dq, v_dp
    FROM (SELECT DISTINCT x.q, x.p FROM unnest(p_queues, p_partitions) AS x(q, p)
          WHERE x.q IS NOT NULL AND x.p IS NOT NULL) d;

    -- Queues and partitions are created only when one of the batch's is missing, as the probes of this
    -- statement (one by key per partition, LATERAL under a LIMIT) find: the two INSERT statements below
    -- cost 0.15 ms a push even when they wrote nothing (docs/performance.md, "Push"). A partition another
    -- transaction is creating is not seen yet, so the INSERTs run, and wait for it as before.
    SELECT count(*) INTO v_have
    FROM unnest(v_dq, v_dp) AS d(q, p)
    CROSS JOIN LATERAL (SELECT 1 FROM queen_partitions qp
                        WHERE qp.tenant = p_tenant AND qp.queue = d.q AND qp.name = d.p
                        LIMIT 1) x;
    IF v_have < coalesce(cardinality(v_dq), 0) THEN
        INSERT INTO queen_queues (tenant, name)
        SELECT p_tenant, d.q
        FROM (SELECT DISTINCT x.q FROM unnest(v_dq) AS x(q)) d
        WHERE (SELECT 1 FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = d.q) IS NULL
        ORDER BY d.q
        ON CONFLICT DO NOTHING;

        -- partition_count grows by the partitions THIS statement created. A recount (count(*) of the
        -- queue's partitions) reads the statement's snapshot: two pushes creating two new partitions of one
        -- queue concurrently each counted only their own, the second wrote its count after waiting for the
        -- first's row lock, and the queue kept one partition fewer than it had. queen_pop creates a group's
        -- cursors only while cursor_count < partition_count, so the newest partition never got a cursor
        -- and its messages were never delivered (seen as a 100,000-timer burst over 16 partitions whose
        -- consumer received exactly 15/16 of it). An increment applies to the row version it locked.
        WITH made AS (
            INSERT INTO queen_partitions (tenant, id, queue, name)
            SELECT p_tenant, queen_partition_id(), d.q, d.p
            FROM unnest(v_dq, v_dp) AS d(q, p)
            WHERE (SELECT 1 FROM queen_partitions qp
                   WHERE qp.tenant = p_tenant AND qp.queue = d.q AND qp.name = d.p) IS NULL
            ON CONFLICT (tenant, queue, name) DO NOTHING
            RETURNING queue, id, ctid
        )
        SELECT array_agg(m.queue), array_agg(m.n), array_agg(m.tids) INTO v_mq, v_mn, v_mtids
        FROM (SELECT made.queue, count(*)::integer AS n, array_agg(made.ctid ORDER BY made.id)::text AS tids
              FROM made GROUP BY made.queue) m;
        FOR i IN 1 .. coalesce(cardinality(v_mq), 0) LOOP  -- (rare: the batch created partitions) by key
            UPDATE queen_queues qq SET partition_count = qq.partition_count + v_mn[i]
            WHERE qq.tenant = p_tenant AND qq.name = v_mq[i]
            RETURNING qq.partition_count INTO v_ord;
            -- their ordinals: the queue's last v_mn[i] (numbered under the queue row's lock, see queen_pop);
            -- the rows this statement inserted, by ctid (a TID scan, never a read of the tenant's partitions)
            UPDATE queen_partitions qp SET ordinal = v_ord - v_mn[i] + x.n
            FROM unnest(v_mtids[i]::tid[]) WITH ORDINALITY AS x(tid, n)
            WHERE qp.ctid = ANY (v_mtids[i]::tid[]) AND qp.ctid = x.tid;
        END LOOP;
    END IF;

    -- Lock the partitions in the arrays' order: a LATERAL subquery that names the outer row and locks
    -- (so it is never flattened into a join) is a nested loop, one probe and lock per element, in the
    -- order of the elements. Their ctids serve the next_seq update below: the rows are locked by this
    -- transaction, so they stay where they are until it updates them.
    SELECT array_agg(l.tid), array_agg(l.pid) INTO v_tids, v_pids
    FROM unnest(v_dq, v_dp) AS d(q, p)
    CROSS JOIN LATERAL (SELECT qp.ctid AS tid, qp.id AS pid FROM queen_partitions qp
                        WHERE qp.tenant = p_tenant AND qp.queue = d.q AND qp.name = d.p
                        FOR UPDATE) l;
    -- Every group has something to hand out in these partitions again (queen_cursors.ready, migration
    -- 0027), under the locks just taken, as the fast path does for its one partition: first which of
    -- them have a cursor marked drained, in one statement of probes by primary key (LATERAL under a
    -- LIMIT, so never flattened into a read of the tenant's every cursor: tests/test_log_cursor_ready.py
    -- counts the rows), then an update by key for those alone. Below queen_ready_min() partitions no
    -- cursor is ever marked drained, and a hot partition's cursors are ready anyway: the update is rare.
    -- (A statement per partition cost 0.19 ms a push over five partitions: docs/performance.md.)
    SELECT array_agg(x.pid) INTO v_refill
    FROM unnest(v_pids) AS x(pid)
    CROSS JOIN LATERAL (SELECT 1 FROM queen_cursors cu
                        WHERE cu.tenant = p_tenant AND cu.partition_id = x.pid AND NOT cu.ready
                        LIMIT 1) d;
    FOREACH v_pid IN ARRAY coalesce(v_refill, '{}') LOOP
        UPDATE queen_cursors cu SET ready = true
        WHERE cu.tenant = p_tenant AND cu.partition_id = v_pid AND NOT cu.ready;
    END LOOP;

    -- As the fast path: first as if every item were new, numbered per partition by position; a
    -- duplicate (stored or within the batch) undoes the attempt and the statement after it finds them.
    IF current_setting('queen.push_careful', true) IS DISTINCT FROM 'on' THEN
        BEGIN
            WITH items AS (
                SELECT u.ord::integer AS i, u.q, u.p, u.id, u.t, u.tr, u.pl, u.c, u.k, u.s, u.d
                FROM unnest(p_queues, p_partitions, p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids,
                            p_subs, p_deadline_ms) WITH ORDINALITY AS u(q, p, id, t, tr, pl, c, k, s, d, ord)
            ), numbered AS (
                SELECT it.*, pp.pid, pp.next_seq - 1 + row_number() OVER (PARTITION BY pp.pid ORDER BY it.i) AS rn_seq
                FROM items it
                CROSS JOIN LATERAL (SELECT qp.id AS pid, qp.next_seq FROM queen_partitions qp
                                    WHERE qp.tenant = p_tenant AND qp.queue = it.q AND qp.name = it.p
                                    LIMIT 1) pp  -- (a probe, as below)
            ), ins AS (
                INSERT INTO queen_messages (tenant, partition_id, seq, id, txn, trace_id, payload, codec, key_id,
                                            producer_sub, deadline_at)
                SELECT p_tenant, n.pid, n.rn_seq, n.id, n.t, n.tr, n.pl, coalesce(n.c, 0), n.k, n.s,
                       CASE WHEN n.d IS NULL THEN NULL ELSE now() + n.d * interval '1 millisecond' END
                FROM numbered n
                ORDER BY n.pid, n.rn_seq
            ), bump AS (
                UPDATE queen_partitions qp SET next_seq = qp.next_seq + c.n, last_push_at = now()
                FROM (SELECT n.pid, count(*) AS n FROM numbered n GROUP BY n.pid) c
                WHERE qp.ctid = ANY (v_tids) AND qp.id = c.pid
            )
            SELECT array_agg(n.i ORDER BY n.i), array_agg(n.id ORDER BY n.i), array_agg(n.pid ORDER BY n.i),
                   array_agg(n.rn_seq ORDER BY n.i)
              INTO v_oi, v_oid, v_opid, v_oseq
            FROM numbered n;
            v_ok := true;
        EXCEPTION WHEN unique_violation THEN
            v_ok := false;
        END;
    END IF;
    IF v_ok THEN
        RETURN QUERY
        SELECT u.i, 'queued'::text, u.id, u.pid, u.seq
        FROM unnest(v_oi, v_oid, v_opid, v_oseq) AS u(i, id, pid, seq);
        PERFORM queen_wake(p_tenant, v_dq);
        RETURN;
    END IF;

    RETURN QUERY
    WITH items AS (
        SELECT u.ord::integer AS i, u.q, u.p, u.id, u.t, u.tr, u.pl, u.c, u.k, u.s, u.d
        FROM unnest(p_queues, p_partitions, p_ids, p_txns, p_traces, p_payloads, p_codecs, p_key_ids,
                    p_subs, p_deadline_ms) WITH ORDINALITY AS u(q, p, id, t, tr, pl, c, k, s, d, ord)
    ), located AS (
        -- Each item's partition by its key (the locks above are held: next_seq is the committed one).
        SELECT it.*, pp.pid, pp.next_seq,
               (SELECT m.id FROM queen_messages m
                WHERE m.tenant = p_tenant AND m.partition_id = pp.pid AND m.txn = it.t) AS existing_id,
               first_value(it.i) OVER w AS first_i, first_value(it.id) OVER w AS first_id
        FROM items it
        CROSS JOIN LATERAL (SELECT qp.id AS pid, qp.next_seq FROM queen_partitions qp
                            WHERE qp.tenant = p_tenant AND qp.queue = it.q AND qp.name = it.p
                            LIMIT 1) pp  -- (a LIMIT keeps the probe a probe: flattened, the planner
                                         -- looped over the tenant's partitions with every item)
        WINDOW w AS (PARTITION BY pp.pid, it.t ORDER BY it.i)
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
        -- By the locked rows' ctids alone (a TID scan): with the tenant in the qual as well, the generic
        -- plan read the tenant's partitions by primary key and filtered them.
        UPDATE queen_partitions qp SET next_seq = qp.next_seq + c.n, last_push_at = now()
        FROM (SELECT n.pid, count(*) AS n FROM numbered n WHERE n.fresh GROUP BY n.pid) c
        WHERE qp.ctid = ANY (v_tids) AND qp.id = c.pid
    )
    SELECT n.i, CASE WHEN n.fresh THEN 'queued' ELSE 'duplicate' END,
           coalesce(n.existing_id, n.first_id), n.pid, CASE WHEN n.fresh THEN n.rn_seq END
    FROM numbered n ORDER BY n.i;

    PERFORM queen_wake(p_tenant, v_dq);  -- the batch's queues, one per partition (not one per item)
END
$$;

-- The advisory lock key of (tenant, queue) for the wake-up handshake (see queen_listeners).
CREATE OR REPLACE FUNCTION queen_wake_key(p_tenant text, p_queue text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext(p_tenant || E'\t' || p_queue) $$;

-- Register a waiting worker for (tenant, queue) for p_ms milliseconds. A registration also forgets the
-- expired registrations of the same (tenant, queue) (workers that stopped or restarted under a new id),
-- so queen_listeners stays as small as the set of live waiters.
CREATE OR REPLACE FUNCTION queen_listen(p_tenant text, p_queue text, p_worker text, p_ms bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7301, queen_wake_key(p_tenant, p_queue));
    DELETE FROM queen_listeners l
    WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.until < now() AND l.worker <> p_worker;
    INSERT INTO queen_listeners AS l (tenant, queue, worker, until)
    VALUES (p_tenant, p_queue, p_worker, now() + p_ms * interval '1 millisecond')
    ON CONFLICT (tenant, queue, worker) DO UPDATE SET until = greatest(l.until, excluded.until);
END
$$;

-- Called by writers of a queue: take the shared side of the handshake, then notify if anyone waits.
CREATE OR REPLACE FUNCTION queen_wake(p_tenant text, p_queues text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7301, queen_wake_key(p_tenant, d.q))
    FROM (SELECT DISTINCT x.q FROM unnest(p_queues) AS x(q) ORDER BY 1) d;
    PERFORM pg_notify('queen_push', p_tenant || E'\t' || d.q)
    FROM (SELECT DISTINCT x.q FROM unnest(p_queues) AS x(q)) d
    WHERE EXISTS (SELECT 1 FROM queen_listeners l WHERE l.tenant = p_tenant AND l.queue = d.q AND l.until > now());
END
$$;

-- Past how many partitions of a queue its cursors are marked drained (queen_cursors.ready, migration
-- 0027). Marking costs a cursor write per push to an emptied partition and a row lock per pop that
-- empties one; it pays where the walk it shortens is long. Measured with consumers keeping up, one
-- message a push (queen bench shapes, ours alone, alternated, 2026-12-06): at 101 partitions push
-- 1,051 / 920 msg/s with it against 1,165 / 1,135 without, at 1,001 even (1,091 / 1,067 against
-- 910 / 1,159), at 10,001 pop 98 -> 828+ msg/s. The session setting queen.ready_min overrides it
-- (tests use 0).
CREATE OR REPLACE FUNCTION queen_ready_min() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('queen.ready_min', true), '')::integer, 1000)
$$;

-- A cursor its consumer's acks brought to the end of its partition, lease released, leaves the walk's
-- index, by the rule an autoAck pop follows (queen_pop, migration 0027): the partition row FOR SHARE
-- SKIP LOCKED (with a push in flight it stays ready), then next_seq read by a statement started after
-- that lock. The caller holds the cursor's row lock.
CREATE OR REPLACE FUNCTION queen_cursor_drained(p_tenant text, p_pid uuid, p_group text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM queen_partitions p
    WHERE p.tenant = p_tenant AND p.id = p_pid
      AND (SELECT qq.partition_count FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = p.queue)
          > queen_ready_min()
    FOR SHARE OF p SKIP LOCKED;
    IF FOUND THEN
        UPDATE queen_cursors c SET ready = false
        WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group AND c.ready
          AND c.lease_id IS NULL
          AND (SELECT p.next_seq - 1 FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = p_pid) <= c.acked_seq;
    END IF;
END
$$;

-- Move the cursor of (partition, group) over the contiguous run of done offsets that now follows it
-- (out-of-order acks remembered in queen_msg_state plus p_done, the offsets settled by the caller),
-- forget those side rows, remember the done offsets still beyond the run, and release the lease once
-- everything it covered is done (then wake long polls if the partition has more).
-- The done offsets are de-duplicated (one message acknowledged twice in a batch must not make the
-- side-table upsert touch one row twice). The floor of retention applies: a cursor below the first
-- offset still in the log is done up to the floor (those messages are gone), so acks above a pruned
-- head still make a contiguous run.
CREATE OR REPLACE FUNCTION queen_cursor_advance(p_tenant text, p_pid uuid, p_group text, p_done bigint[] DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_acked    bigint;
    v_start    bigint;
    v_end      bigint;
    v_released boolean;
    v_lease    uuid;
    v_lend     bigint;
BEGIN
    SELECT c.acked_seq, c.lease_id, c.lease_end_seq INTO v_acked, v_lease, v_lend FROM queen_cursors c
    WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_start := v_acked;
    SELECT greatest(v_acked, f.floor_seq) INTO v_acked FROM queen_log_floor f
    WHERE f.tenant = p_tenant AND f.partition_id = p_pid;
    IF NOT FOUND THEN
        v_acked := v_start;
    END IF;
    SELECT max(r.seq) INTO v_end
    FROM (SELECT x.seq, row_number() OVER (ORDER BY x.seq) AS rn
          FROM (SELECT s.seq FROM queen_msg_state s
                WHERE s.tenant = p_tenant AND s.partition_id = p_pid AND s.consumer_group = p_group
                  AND s.acked AND s.seq > v_acked
                UNION
                SELECT d FROM unnest(p_done) AS d WHERE d > v_acked) x) r
    WHERE r.seq - v_acked = r.rn;
    IF v_end IS NOT NULL THEN
        v_acked := v_end;
    END IF;
    IF v_acked > v_start THEN
        DELETE FROM queen_msg_state s
        WHERE s.tenant = p_tenant AND s.partition_id = p_pid AND s.consumer_group = p_group AND s.seq <= v_acked;
    END IF;
    INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, acked)
    SELECT DISTINCT p_tenant, p_pid, p_group, d, true FROM unnest(p_done) AS d WHERE d > v_acked
    ON CONFLICT (tenant, partition_id, consumer_group, seq) DO UPDATE SET acked = true;
    -- Written only when it changes (the caller holds the row's lock): an auto-ack pop has already moved
    -- the cursor and dropped the lease, and a second row version per pop was pure bloat.
    IF v_acked > v_start OR (v_lend IS NOT NULL AND v_acked >= v_lend) THEN
        UPDATE queen_cursors c
        SET acked_seq = v_acked,
            lease_id = CASE WHEN c.lease_end_seq IS NOT NULL AND v_acked >= c.lease_end_seq THEN NULL ELSE c.lease_id END,
            lease_until = CASE WHEN c.lease_end_seq IS NOT NULL AND v_acked >= c.lease_end_seq THEN NULL ELSE c.lease_until END,
            lease_end_seq = CASE WHEN c.lease_end_seq IS NOT NULL AND v_acked >= c.lease_end_seq THEN NULL ELSE c.lease_end_seq END
        WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group
        RETURNING c.lease_id IS NULL INTO v_released;
    ELSE
        v_released := v_lease IS NULL;
    END IF;
    IF v_released THEN
        PERFORM queen_wake(p_tenant, ARRAY[p.queue::text])
        FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = p_pid AND p.next_seq - 1 > v_acked;
        IF NOT FOUND THEN  -- nothing more there: the cursor may leave the walk's index
            PERFORM queen_cursor_drained(p_tenant, p_pid, p_group);
        END IF;
    END IF;
    RETURN v_acked;
END
$$;

-- File one message of the log as a dead letter of a group (copying its stored bytes as they are).
CREATE OR REPLACE FUNCTION queen_dlq_file(p_tenant text, p_pid uuid, p_group text, p_seq bigint, p_error text,
                               p_retries integer) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO queen_dlq (tenant, id, queue, partition_id, partition, consumer_group, synthetic, message_id,
                           txn, trace_id, payload, codec, key_id, producer_sub, error, retry_count,
                           original_created_at)
    SELECT p_tenant, gen_random_uuid(), p.queue, p.id, p.name, p_group, false, m.id, m.txn, m.trace_id,
           m.payload, m.codec, m.key_id, m.producer_sub, p_error, p_retries, m.created_at
    FROM queen_messages m JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id
    WHERE m.tenant = p_tenant AND m.partition_id = p_pid AND m.seq = p_seq;
$$;

-- Conflation, a consumer group's last-value delivery (docs/protocol.md §2.4): retire everything of
-- the partition behind its newest message for the group (the cursor moves to the offset before it,
-- and the side-table rows it passes go). Called by queen_pop on a claimed partition of a conflating
-- group; returns the group's cursor.
CREATE OR REPLACE FUNCTION queen_conflate(p_tenant text, p_pid uuid, p_group text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_to    bigint;
    v_acked bigint;
BEGIN
    SELECT p.next_seq - 2 INTO v_to FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = p_pid;
    UPDATE queen_cursors c SET acked_seq = v_to
    WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group AND c.acked_seq < v_to;
    IF FOUND THEN
        DELETE FROM queen_msg_state s
        WHERE s.tenant = p_tenant AND s.partition_id = p_pid AND s.consumer_group = p_group AND s.seq <= v_to;
    END IF;
    SELECT c.acked_seq INTO v_acked FROM queen_cursors c
    WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group;
    RETURN v_acked;
END
$$;

-- Pop: claim up to p_max_partitions partitions of a queue for a group (SKIP LOCKED, least recently
-- claimed first), hand out up to p_batch messages in offset order under ONE lease, and never hand
-- out a message whose deadline has passed or whose retry budget is spent: those are filed in the DLQ
-- (kind 'expired' / 'exhausted' rows tell the caller, for metrics) and count as done. With
-- p_auto_ack the cursor moves at delivery and no lease is taken. An empty answer carries one row of
-- kind 'idle' whose lease_until is the earliest instant a live lease over pending messages ends (NULL
-- if none) and whose seq is the milliseconds until then: a long poll also wakes then.
-- Cursors for partitions the group has not seen yet are created only when the queue's partition_count
-- exceeds the group's cursor_count (no per-pop search otherwise). A partition's batch is read through
-- queen_pop_window: its clean prefix (the common case) goes out as one RETURN QUERY; from the first
-- message that needs its own treatment (dead letter, held back) a per-message loop with RETURN NEXT goes
-- on. A window under 32 messages (the batch left, or what the partition holds; the session setting
-- queen.pop_set_min overrides the bound, tests use it to compare the two paths) takes the loop alone:
-- two statements fewer, cheaper there (bench/bench_pop_sql.py).
-- Queue options (queue_options.sql): windowBuffer skips a partition pushed to in the last window_s;
-- delayedProcessing and retryDelay hold a message (and, offsets being in order, those after it) until
-- it is due, and an empty answer's hint then includes that instant; maxWaitTimeSeconds files a message
-- that waited longer as a dead letter ('max_wait_exceeded', kind 'expired') instead of delivering it.
-- deadline_at is the message's absolute deadline (NULL without one), handed to the consumer so it can
-- check it again right before its side effect (docs/queued-call-deadlines.md §4).
-- CREATE OR REPLACE cannot change a function's result columns, so any earlier queen_pop is dropped first.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname IN ('queen_pop', 'queen_pop_window') LOOP
        EXECUTE format('DROP FUNCTION %s', r.sig);
    END LOOP;
END
$$;
-- Where a new cursor of a group starts: at 0, or for a group subscribed from an instant, after the
-- partition's last message older than that instant.
CREATE OR REPLACE FUNCTION queen_cursor_start(p_tenant text, p_pid uuid, p_sub timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_sub IS NULL THEN 0 ELSE coalesce(
        (SELECT mm.seq FROM queen_messages mm
         WHERE mm.tenant = p_tenant AND mm.partition_id = p_pid AND mm.created_at < p_sub
         ORDER BY mm.seq DESC LIMIT 1), 0) END
$$;

-- The messages a pop looks at next in one partition for a group: the first p_limit offsets after p_from
-- the group has not acked, in offset order, each with what decides its fate in queen_pop: its deadline
-- passed (expired), it waited longer than maxWaitTimeSeconds (waited_out), delayedProcessing or
-- retryDelay holds it back (not_yet), its failures so far, whether it was deleted (a tombstone,
-- queen_message_delete), and special = any of those or its retries spent (a message queen_pop must
-- treat on its own). p_states false says the group keeps no per-message
-- state in the partition past p_from (queen_msg_state): the probe of it per message is skipped (a
-- pseudo-constant join qual). One SELECT, STABLE: the planner inlines it into the calling statement.
-- Its body reads queen_msg_state.retry_at (migration 0010), and an upgrade release by release runs
-- these files after older migrations too: a LANGUAGE sql body is analysed at CREATE unless
-- check_function_bodies is off, so it is off for this one statement (the body is analysed at its
-- first call, as a plpgsql one is).
SET LOCAL check_function_bodies = off;
CREATE OR REPLACE FUNCTION queen_pop_window(
    p_tenant text, p_pid uuid, p_group text, p_from bigint, p_limit integer, p_states boolean,
    p_retry_limit integer, p_max_wait_s integer, p_gated boolean, p_delay_s integer, p_retry_delay_ms integer
) RETURNS TABLE (seq bigint, id uuid, txn text, trace_id uuid, payload bytea, codec smallint, key_id text,
                 producer_sub text, created_at timestamptz, deadline_at timestamptz, expired boolean,
                 failures integer, waited_out boolean, not_yet boolean, deleted boolean, special boolean)
LANGUAGE sql STABLE AS $$
    SELECT w.*, (w.expired OR w.waited_out OR w.not_yet OR w.deleted OR w.failures > p_retry_limit)
    FROM (SELECT mm.seq, mm.id, mm.txn, mm.trace_id, mm.payload, mm.codec, mm.key_id, mm.producer_sub,
                 mm.created_at, mm.deadline_at, (mm.deadline_at IS NOT NULL AND mm.deadline_at <= now()),
                 coalesce(st.failures, 0),
                 (p_max_wait_s > 0 AND mm.created_at <= now() - p_max_wait_s * interval '1 second'),
                 (p_gated AND coalesce(
                     (p_delay_s > 0 AND mm.created_at > now() - p_delay_s * interval '1 second')
                     OR (p_retry_delay_ms > 0 AND st.retry_at > now()), false)),
                 mm.deleted_at IS NOT NULL
          FROM queen_messages mm
          LEFT JOIN LATERAL (SELECT s.acked, s.failures, s.retry_at FROM queen_msg_state s
                             WHERE p_states AND s.tenant = p_tenant AND s.partition_id = mm.partition_id
                               AND s.consumer_group = p_group AND s.seq = mm.seq LIMIT 1) st ON true
          WHERE mm.tenant = p_tenant AND mm.partition_id = p_pid AND mm.seq > p_from AND st.acked IS NOT TRUE
          ORDER BY mm.seq
          LIMIT p_limit) w (seq, id, txn, trace_id, payload, codec, key_id, producer_sub, created_at, deadline_at,
                            expired, failures, waited_out, not_yet, deleted)
$$;
RESET check_function_bodies;

CREATE OR REPLACE FUNCTION queen_pop(
    p_tenant text, p_queue text, p_partition text, p_group text, p_batch integer, p_max_partitions integer,
    p_auto_ack boolean, p_sub_mode text, p_sub_from timestamptz, p_conflation boolean DEFAULT false,
    p_shared boolean DEFAULT false, p_share uuid DEFAULT NULL
) RETURNS TABLE (kind text, partition_id uuid, partition text, seq bigint, id uuid, txn text, trace_id uuid,
                 payload bytea, codec smallint, key_id text, producer_sub text, created_at timestamptz,
                 attempt integer, lease_id uuid, lease_until timestamptz, deadline_at timestamptz)
LANGUAGE plpgsql
-- Planned once per connection, as queen_push and queen_ack are: left to choose, PostgreSQL planned its
-- statements afresh at every one of a connection's first calls (custom plans, each inlining
-- queen_pop_window); bench/bench_pop_sql.py measures a pop against a bare read (docs/performance.md).
SET plan_cache_mode = force_generic_plan
AS $$
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
    v_clean   integer;
    v_set_min integer := coalesce(nullif(current_setting('queen.pop_set_min', true), '')::integer, 32);
    v_clean_last bigint;
    v_mixed   boolean;
    v_states  boolean;
    v_looped  boolean;
    v_last    bigint;
    v_from    bigint;
    v_any     boolean := false;
    v_cursors integer;
    v_new     integer;
    v_gated   boolean;
    v_held    boolean;
    v_conf    boolean;
    v_pid     uuid;
    v_cur     refcursor;
    v_drained boolean;
    v_upto    integer;
    v_seen    integer;
    v_set     boolean;
    v_shared  boolean := false;
BEGIN
    SELECT qq.lease_time_s, qq.retry_limit, qq.dlq_enabled, qq.partition_count, qq.delay_s, qq.window_s,
           qq.retry_delay_ms, qq.max_wait_s INTO q
    FROM queen_queues qq WHERE qq.tenant = p_tenant AND qq.name = p_queue;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'idle'::text, NULL::uuid, NULL::text, NULL::bigint, NULL::uuid, NULL::text,
            NULL::uuid, NULL::bytea, NULL::smallint, NULL::text, NULL::text, NULL::timestamptz, NULL::integer,
            NULL::uuid, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    v_until := CASE WHEN p_auto_ack THEN NULL ELSE now() + q.lease_time_s * interval '1 second' END;
    -- delayedProcessing / retryDelay: a partition's head may not be servable yet (queen_head_ready_at).
    v_gated := q.delay_s > 0 OR q.retry_delay_ms > 0;

    SELECT g.subscribed_at, g.cursor_count, g.conflation, g.cursor_upto INTO v_sub, v_cursors, v_conf, v_upto
    FROM queen_groups g
    WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.consumer_group = p_group;
    IF NOT FOUND THEN
        v_sub := CASE WHEN p_sub_from IS NOT NULL THEN p_sub_from
                      WHEN p_sub_mode = 'new' THEN now() END;
        INSERT INTO queen_groups (tenant, queue, consumer_group, subscribed_at, conflation)
        VALUES (p_tenant, p_queue, p_group, v_sub, coalesce(p_conflation, false)) ON CONFLICT DO NOTHING;
        SELECT g.subscribed_at, g.cursor_count, g.conflation, g.cursor_upto INTO v_sub, v_cursors, v_conf, v_upto
        FROM queen_groups g
        WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.consumer_group = p_group;
    END IF;
    IF v_conf OR p_conflation THEN  -- the group's stored policy, echoed in the answer (seq 1 = conflating)
        kind := 'conflation'; seq := v_conf::integer; RETURN NEXT; kind := NULL; seq := NULL;
    END IF;

    -- A pop of one named partition works on that partition's rows alone: under the generic plan a
    -- filter "p_partition IS NULL OR p.name = p_partition" read every partition and cursor of the queue
    -- (0.8 ms at 1,001 partitions, growing with them).
    IF p_partition IS NOT NULL THEN
        SELECT p.id INTO v_pid FROM queen_partitions p
        WHERE p.tenant = p_tenant AND p.queue = p_queue AND p.name = p_partition;
        IF v_pid IS NULL THEN  -- no such partition (yet): nothing to deliver, nothing to wait for
            RETURN QUERY SELECT 'idle'::text, NULL::uuid, NULL::text, NULL::bigint, NULL::uuid, NULL::text,
                NULL::uuid, NULL::bytea, NULL::smallint, NULL::text, NULL::text, NULL::timestamptz, NULL::integer,
                NULL::uuid, NULL::timestamptz, NULL::timestamptz;
            RETURN;
        END IF;
    END IF;

    -- A cursor for every partition this group has not seen yet, starting where its subscription does.
    -- Skipped (the common case) when the group has cursors up to the queue's last partition. Partitions
    -- are numbered 1, 2, ... (ordinal, migration 0027) by queen_push under the queue row's lock, in the
    -- transaction that creates them, so every snapshot sees a gapless prefix of the numbers: the new
    -- ones are those past the group's cursor_upto, read by an index, not a search of all the queue's
    -- partitions for ones without a cursor (6 ms at 10,001 partitions, at nearly every pop while a
    -- queue's partitions were still being created). The search stays for a group whose cursor_count
    -- says a cursor is missing below cursor_upto (a partition without a number, never expected).
    -- One pop at a time makes them (a try-lock of the group on the queue, held to commit): the others
    -- walk the cursors that exist rather than wait on the same new rows and on the group row (consumers
    -- of a queue whose partitions were being created queued up behind each other, 98 msg/s delivered
    -- at 10,001 partitions); the new partitions' messages go out once the maker commits.
    v_new := 0;
    IF v_pid IS NOT NULL THEN
        INSERT INTO queen_cursors (tenant, partition_id, consumer_group, queue, acked_seq)
        SELECT p_tenant, v_pid, p_group, p_queue, queen_cursor_start(p_tenant, v_pid, v_sub)
        WHERE NOT EXISTS (SELECT 1 FROM queen_cursors cc WHERE cc.tenant = p_tenant AND cc.partition_id = v_pid
                                                         AND cc.consumer_group = p_group)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_new = ROW_COUNT;
    ELSIF v_upto < q.partition_count
          AND pg_try_advisory_xact_lock(7304, hashtext(p_tenant || E'\t' || p_queue || E'\t' || p_group)) THEN
        WITH src AS (
            SELECT p.id, p.ordinal FROM queen_partitions p
            WHERE p.tenant = p_tenant AND p.queue = p_queue AND p.ordinal > v_upto
        ), ins AS (
            -- Only partitions without this group's cursor. v_upto was read before the try-lock, so it
            -- may predate the previous maker's commit and name cursors that exist now; inserted again,
            -- each meets its row in the unique index, and if a push is refilling that row (ready, under
            -- the partition's lock, until its commit) the insert waits for the push, while the push may
            -- wait for a cursor this transaction holds (the walk of an earlier pop gathered with it):
            -- a deadlock (the one cycle found behind one that tests/test_log_cursor_ready.py's race hit
            -- once, not reproduced since). The probe reads the committed row and never waits.
            INSERT INTO queen_cursors (tenant, partition_id, consumer_group, queue, acked_seq)
            SELECT p_tenant, src.id, p_group, p_queue, queen_cursor_start(p_tenant, src.id, v_sub)
            FROM src
            WHERE NOT EXISTS (SELECT 1 FROM queen_cursors cc WHERE cc.tenant = p_tenant AND cc.partition_id = src.id
                                                             AND cc.consumer_group = p_group)
            ORDER BY src.id
            ON CONFLICT DO NOTHING
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM ins), (SELECT max(src.ordinal) FROM src) INTO v_new, v_seen;
    ELSIF v_upto >= q.partition_count AND v_cursors < q.partition_count THEN
        INSERT INTO queen_cursors (tenant, partition_id, consumer_group, queue, acked_seq)
        SELECT p_tenant, p.id, p_group, p_queue, queen_cursor_start(p_tenant, p.id, v_sub)
        FROM queen_partitions p
        WHERE p.tenant = p_tenant AND p.queue = p_queue
          AND NOT EXISTS (SELECT 1 FROM queen_cursors cc WHERE cc.tenant = p_tenant AND cc.partition_id = p.id
                                                         AND cc.consumer_group = p_group)
        ORDER BY p.id
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_new = ROW_COUNT;
    END IF;
    IF v_new > 0 OR v_seen > v_upto THEN  -- the cursors this statement created (a recount would read a
                                          -- stale snapshot), and how far the numbered partitions are covered
        UPDATE queen_groups g SET cursor_count = g.cursor_count + v_new,
                                  cursor_upto = greatest(g.cursor_upto, coalesce(v_seen, 0))
        WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.consumer_group = p_group;
    END IF;

    -- The partitions to serve: the named one (its row alone), or the least recently claimed free ones
    -- of the group (a walk of queen_cursors_ready, the cursors with something to hand out, that stops at
    -- the first that can serve: one with a live lease or held back by a queue option is passed over).
    -- p_shared: queen_pop_many walked the group's cursors for the pops it gathered and locked p_share for
    -- this call (NULL: none was left for it); the call reads that one alone, as a named partition. Not
    -- when this call just created cursors (they were not there to be walked to).
    IF v_pid IS NULL AND p_shared AND v_new = 0 THEN
        v_shared := true;
        v_pid := p_share;
    END IF;
    IF v_pid IS NULL AND NOT v_shared THEN
        -- Each cursor walked reads its partition's row by primary key (a LATERAL subquery under a LIMIT,
        -- so it stays a probe). As a join, the generic plan built on statistics of a small table (up to
        -- some thousands of partitions) read every partition row of the table, held the tenant's in memory
        -- and compared each cursor walked with each: 11,619 comparisons, 2.5 ms, for a pop of a
        -- 101-partition queue beside the tenant's other 428 partitions, a cost growing with the table
        -- (tests/test_log_volume.py counts the rows; docs/performance.md, "Pop and ack").
        OPEN v_cur FOR
            SELECT cu.partition_id AS pid, cu.acked_seq, cu.lease_id AS old_lease, cu.lease_end_seq, p.name, p.next_seq
            FROM queen_cursors cu
            CROSS JOIN LATERAL (SELECT pp.name, pp.next_seq, pp.last_push_at FROM queen_partitions pp
                                WHERE pp.tenant = p_tenant AND pp.id = cu.partition_id
                                LIMIT 1) p
            WHERE cu.tenant = p_tenant AND cu.queue = p_queue AND cu.consumer_group = p_group AND cu.ready
              AND queen_cursor_servable(p_tenant, p_group, cu.partition_id, cu.acked_seq, p.next_seq, cu.lease_until,
                                        p.last_push_at, q.window_s, v_gated, q.delay_s, q.retry_delay_ms)
            ORDER BY cu.claimed_at NULLS FIRST
            LIMIT greatest(p_max_partitions, 1)
            FOR UPDATE OF cu SKIP LOCKED;
    ELSE
        OPEN v_cur FOR
            SELECT cu.partition_id AS pid, cu.acked_seq, cu.lease_id AS old_lease, cu.lease_end_seq, p.name, p.next_seq
            FROM queen_cursors cu, queen_partitions p
            WHERE cu.tenant = p_tenant AND cu.partition_id = v_pid AND cu.consumer_group = p_group
              AND p.tenant = p_tenant AND p.id = v_pid
              AND queen_cursor_servable(p_tenant, p_group, cu.partition_id, cu.acked_seq, p.next_seq, cu.lease_until,
                                        p.last_push_at, q.window_s, v_gated, q.delay_s, q.retry_delay_ms)
            FOR UPDATE OF cu SKIP LOCKED;
    END IF;
    LOOP
        FETCH v_cur INTO c;
        EXIT WHEN NOT FOUND;
        EXIT WHEN v_left <= 0;
        -- A lease that ran out is a failed delivery of everything it covered that is not done.
        IF c.old_lease IS NOT NULL AND c.lease_end_seq IS NOT NULL AND c.lease_end_seq > c.acked_seq THEN
            INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, failures, last_error, retry_at)
            SELECT p_tenant, c.pid, p_group, g, 1, 'lease_expired', queen_retry_at(q.retry_delay_ms)
            FROM generate_series(c.acked_seq + 1, c.lease_end_seq) AS g
            ON CONFLICT (tenant, partition_id, consumer_group, seq)
            DO UPDATE SET failures = s.failures + 1, last_error = 'lease_expired', retry_at = excluded.retry_at
            WHERE NOT s.acked;
        END IF;

        IF v_conf THEN
            c.acked_seq := queen_conflate(p_tenant, c.pid, p_group);
        END IF;
        v_given := 0;
        v_last := NULL;
        v_from := c.acked_seq;
        v_held := false;
        v_looped := false;
        LOOP
            -- The clean prefix of the window (the common case: nothing expired, waited out, spent or
            -- held back) goes out as one set; the per-message loop starts at the first special message.
            -- For a leased pop of a window under v_set_min messages (the batch left, or at most what the
            -- partition held when claimed) the loop alone is cheaper: two statements fewer. Not so with
            -- autoAck: a set handed out past a group with no per-message state moves the cursor by itself,
            -- where the loop's pop ends in queen_cursor_advance (its six statements): faster for every
            -- window size (docs/performance.md, "pop").
            IF p_auto_ack OR least(v_left, c.next_seq - 1 - v_from) >= v_set_min THEN
                -- (and whether the group keeps per-message state past v_from: the probe per message then)
                SELECT e.has, count(w.seq), max(w.seq), coalesce(bool_or(w.special), false)
                INTO v_states, v_clean, v_clean_last, v_mixed
                FROM (SELECT EXISTS (SELECT 1 FROM queen_msg_state s
                                     WHERE s.tenant = p_tenant AND s.partition_id = c.pid
                                       AND s.consumer_group = p_group AND s.seq > v_from) AS has) e
                LEFT JOIN LATERAL queen_pop_window(p_tenant, c.pid, p_group, v_from, v_left, e.has, q.retry_limit,
                                                   q.max_wait_s, v_gated, q.delay_s, q.retry_delay_ms) w ON true
                GROUP BY e.has;
                IF v_mixed AND v_clean > 0 THEN  -- the prefix before the first special message
                    SELECT count(*) FILTER (WHERE NOT x.tainted), max(x.seq) FILTER (WHERE NOT x.tainted)
                    INTO v_clean, v_clean_last
                    FROM (SELECT w.seq, bool_or(w.special) OVER (ORDER BY w.seq) AS tainted
                          FROM queen_pop_window(p_tenant, c.pid, p_group, v_from, v_left, v_states, q.retry_limit,
                                                q.max_wait_s, v_gated, q.delay_s, q.retry_delay_ms) w) x;
                END IF;
                IF v_clean > 0 THEN
                    RETURN QUERY
                        SELECT 'msg'::text, c.pid, c.name::text, w.seq, w.id, w.txn, w.trace_id, w.payload, w.codec,
                               w.key_id, w.producer_sub, w.created_at, w.failures + 1, v_lease, v_until, w.deadline_at
                        FROM queen_pop_window(p_tenant, c.pid, p_group, v_from, v_clean, v_states, q.retry_limit,
                                              q.max_wait_s, v_gated, q.delay_s, q.retry_delay_ms) w
                        WHERE w.seq <= v_clean_last
                        ORDER BY w.seq;
                    GET DIAGNOSTICS v_clean = ROW_COUNT;  -- a message a retention prune took meanwhile is gone
                    v_given := v_given + v_clean;
                    v_left := v_left - v_clean;
                    v_last := v_clean_last;
                    v_from := v_clean_last;
                END IF;
                v_picked := v_clean;
            ELSE
                v_states := true;
                v_mixed := true;
                v_picked := 0;
            END IF;
            IF v_mixed THEN
                v_looped := true;
                FOR m IN
                    SELECT * FROM queen_pop_window(p_tenant, c.pid, p_group, v_from, v_left, v_states, q.retry_limit,
                                                   q.max_wait_s, v_gated, q.delay_s, q.retry_delay_ms)
                LOOP
                    -- A tombstone (a deleted message) is done for every group: passed over, never handed
                    -- out nor filed, and remembered as done so the cursor's run goes over its offset.
                    IF m.deleted THEN
                        v_picked := v_picked + 1;
                        v_last := m.seq;
                        INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, acked)
                        VALUES (p_tenant, c.pid, p_group, m.seq, true)
                        ON CONFLICT (tenant, partition_id, consumer_group, seq) DO UPDATE SET acked = true;
                        CONTINUE;
                    END IF;
                    -- Delivery is in offset order: a message not servable yet holds back the rest.
                    IF m.not_yet THEN
                        v_held := true;
                        EXIT;
                    END IF;
                    v_picked := v_picked + 1;
                    v_last := m.seq;
                    IF m.expired OR m.waited_out OR m.failures > q.retry_limit THEN
                        IF m.expired OR m.waited_out OR q.dlq_enabled THEN
                            PERFORM queen_dlq_file(p_tenant, c.pid, p_group, m.seq,
                                CASE WHEN m.expired THEN 'deadline_exceeded' WHEN m.waited_out THEN 'max_wait_exceeded'
                                     ELSE 'retries_exhausted' END, m.failures);
                        END IF;
                        INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, acked)
                        VALUES (p_tenant, c.pid, p_group, m.seq, true)
                        ON CONFLICT (tenant, partition_id, consumer_group, seq) DO UPDATE SET acked = true;
                        kind := CASE WHEN m.expired OR m.waited_out THEN 'expired' ELSE 'exhausted' END;
                        partition_id := c.pid; partition := c.name; seq := m.seq; id := m.id; txn := m.txn;
                        trace_id := NULL; payload := NULL; codec := NULL; key_id := NULL; producer_sub := NULL;
                        created_at := m.created_at; attempt := m.failures + 1; lease_id := NULL; lease_until := NULL;
                        deadline_at := m.deadline_at;
                        RETURN NEXT;
                    ELSE
                        v_given := v_given + 1;
                        v_left := v_left - 1;
                        kind := 'msg'; partition_id := c.pid; partition := c.name; seq := m.seq; id := m.id;
                        txn := m.txn; trace_id := m.trace_id; payload := m.payload; codec := m.codec;
                        key_id := m.key_id; producer_sub := m.producer_sub; created_at := m.created_at;
                        attempt := m.failures + 1; lease_id := v_lease; lease_until := v_until;
                        deadline_at := m.deadline_at;
                        RETURN NEXT;
                    END IF;
                END LOOP;
            END IF;
            -- Stop when something was handed out, or the partition has nothing more.
            EXIT WHEN v_given > 0 OR v_picked = 0 OR v_left <= 0 OR v_held;
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
            -- Handed out as one set, and the group keeps no state past the old cursor (v_set): drained
            -- by what the walk saw, the cursor leaves the walk's index (ready, migration 0027) unless a
            -- push got in meanwhile, in this UPDATE (otherwise queen_cursor_advance below moves the cursor
            -- further and queen_cursor_drained decides, once). The partition row FOR SHARE first (a later push waits for
            -- this commit, then finds ready false and sets it back), and next_seq read by the UPDATE, a
            -- statement that starts after that lock. SKIP LOCKED: a push in flight holds the row, and
            -- the cursor simply stays ready (it is about to have a message). A pop never waits for a
            -- push so: waiting, a pop gathered with others (log_pop_many, one transaction already
            -- holding other partitions FOR SHARE) and a push over several partitions deadlocked. Only
            -- past queen_ready_min() partitions: below it a walk is short anyway, and a hot partition's
            -- pushes never wait for its pops.
            v_set := v_given > 0 AND NOT v_states AND NOT v_looped;
            v_drained := v_set AND q.partition_count > queen_ready_min() AND v_last >= c.next_seq - 1;
            IF v_drained THEN
                PERFORM 1 FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = c.pid FOR SHARE SKIP LOCKED;
                v_drained := FOUND;
            END IF;
            UPDATE queen_cursors cu
            SET acked_seq = greatest(cu.acked_seq, coalesce(v_last, cu.acked_seq)),
                lease_id = NULL, lease_until = NULL, lease_end_seq = NULL, claimed_at = now(),
                ready = CASE WHEN v_drained
                             THEN (SELECT p.next_seq - 1 > greatest(cu.acked_seq, coalesce(v_last, cu.acked_seq))
                                   FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = c.pid)
                             ELSE cu.ready END
            WHERE cu.tenant = p_tenant AND cu.partition_id = c.pid AND cu.consumer_group = p_group;
            IF v_set THEN
                -- Handed out as one set, and the group keeps no state past the old cursor: nothing lies
                -- beyond to join the run, so all queen_cursor_advance would do is wake long polls if the
                -- partition holds more (the lease is gone).
                PERFORM queen_wake(p_tenant, ARRAY[p_queue])
                FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = c.pid AND p.next_seq - 1 > v_last;
            ELSE
                PERFORM queen_cursor_advance(p_tenant, c.pid, p_group);
            END IF;
        END IF;
    END LOOP;
    CLOSE v_cur;

    IF NOT v_any THEN
        -- seq carries the milliseconds until that instant (by the database clock).
        IF v_pid IS NULL OR v_shared THEN
            SELECT min(cu.lease_until) INTO v_until FROM queen_cursors cu
            CROSS JOIN LATERAL (SELECT pp.next_seq FROM queen_partitions pp
                                WHERE pp.tenant = p_tenant AND pp.id = cu.partition_id
                                LIMIT 1) p  -- a probe per cursor, as the walk's
            WHERE cu.tenant = p_tenant AND cu.queue = p_queue AND cu.consumer_group = p_group AND cu.ready
              AND cu.lease_until > now() AND p.next_seq - 1 > cu.acked_seq;
        ELSE
            SELECT cu.lease_until INTO v_until FROM queen_cursors cu, queen_partitions p
            WHERE cu.tenant = p_tenant AND cu.partition_id = v_pid AND cu.consumer_group = p_group
              AND p.tenant = p_tenant AND p.id = v_pid
              AND p.next_seq - 1 > cu.acked_seq AND cu.lease_until > now();
        END IF;
        IF v_gated OR q.window_s > 0 THEN
            v_until := least(v_until, queen_pop_ready_at(p_tenant, p_queue, p_partition, p_group, q.delay_s,
                                                         q.window_s, q.retry_delay_ms));
        END IF;
        RETURN QUERY SELECT 'idle'::text, NULL::uuid, NULL::text,
            ceil(extract(epoch FROM v_until - now()) * 1000)::bigint, NULL::uuid, NULL::text,
            NULL::uuid, NULL::bytea, NULL::smallint, NULL::text, NULL::text, NULL::timestamptz, NULL::integer,
            NULL::uuid, v_until, NULL::timestamptz;
    END IF;
END
$$;

-- Several pops in one call (the pop coalescer, broker/log/service.py _pop_group): queen_pop once per
-- job, each call seeing what the earlier ones claimed (its statements take fresh snapshots); rows carry
-- the job's 1-based position. Jobs of one queue and group that claim one partition each (no named
-- partition, max_partitions 1: the reference clients' pop; such a pop alone comes here too, as one job)
-- go one after the other, in job order, and the group's cursors are walked here ONCE for all of them: the
-- least recently claimed servable ones, one a job, locked as each job's own walk would, and handed out in
-- that order, each job reading only its own. Each job walking alone passed over the same empty cursors and
-- the cursors other transactions hold as the one before it (with consumers keeping up, about 40 of 101
-- at a time, 0.25-0.4 ms a walk, 11-18 walks a call under the batch_1 shape). A job left without one
-- finds nothing to serve, as its own walk would have at this instant: a message pushed since is not
-- seen, but its push notifies the queue when it commits, which wakes a long poll to pop again. A job
-- that may claim several partitions walks alone: it stops claiming when its batch is full, which a
-- share handed out in advance cannot know.
-- Two workers' gathered pops of one queue and group (its consumers' connections on both) run one after
-- the other, not side by side: side by side each walk passed over the cursors the other held and
-- handed fewer of them to its jobs, and PostgreSQL spent 402-424 us a message
-- against 243-276 with the consumers on one worker (batch_1 shape, 30 s rows, ours alone, embedded
-- PostgreSQL 16: 2,201-2,265 msg/s split, 2,892-2,973 split and serialised, 2,819-3,110 on one
-- worker). A pop of a named partition reads its one cursor and takes no such lock; a pop of several
-- partitions with nothing gathered beside it goes alone (log_pop) and neither.
CREATE OR REPLACE FUNCTION queen_pop_many(
    p_tenant text, p_queues text[], p_parts text[], p_groups text[], p_batches integer[], p_max_parts integer[],
    p_auto_acks boolean[], p_sub_modes text[], p_sub_froms timestamptz[], p_conflations boolean[]
) RETURNS TABLE (job integer, kind text, partition_id uuid, partition text, seq bigint, id uuid, txn text,
                 trace_id uuid, payload bytea, codec smallint, key_id text, producer_sub text,
                 created_at timestamptz, attempt integer, lease_id uuid, lease_until timestamptz,
                 deadline_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    k      record;
    q      record;
    i      integer;
    v_at   integer;
    v_pids uuid[];
    v_fjobs  integer[];  -- the jobs served as one set (below), their cursors' partitions, names, offsets
    v_fpids  uuid[];
    v_fnames text[];
    v_ffroms bigint[];
    v_flasts bigint[];
    v_hint   timestamptz;  -- the group's lease hint for its jobs left without a cursor (below)
    v_hinted boolean;
BEGIN
    -- One gathered walk of a queue's group at a time across workers and brokers (lock_keys.POP_WALK),
    -- taken before anything else and in one order, so it waits on nothing that waits on it.
    PERFORM pg_advisory_xact_lock(7305, hashtext(p_tenant || E'\t' || d.queue || E'\t' || d.grp))
    FROM (SELECT DISTINCT j.queue, j.grp FROM unnest(p_queues, p_groups, p_parts) AS j (queue, grp, part)
          WHERE j.part IS NULL ORDER BY 1, 2) d;
    FOR k IN
        SELECT j.queue, j.grp, j.part IS NULL AND j.mp <= 1 AS shares, array_agg(j.i ORDER BY j.i) AS jobs
        FROM unnest(p_queues, p_groups, p_parts, p_max_parts) WITH ORDINALITY AS j (queue, grp, part, mp, i)
        GROUP BY j.queue, j.grp, j.part IS NULL AND j.mp <= 1
        ORDER BY min(j.i)
    LOOP
        v_pids := NULL;
        IF k.shares THEN
            -- (not while the group lacks cursors: the first job makes them, and the others walk to them)
            SELECT qq.window_s, qq.delay_s, qq.retry_delay_ms, (qq.delay_s > 0 OR qq.retry_delay_ms > 0) AS gated,
                   qq.max_wait_s, qq.retry_limit,
                   -- the set below serves this queue's group (see there)
                   (NOT g.conflation AND qq.delay_s = 0 AND qq.retry_delay_ms = 0 AND qq.retry_limit >= 0
                    AND qq.partition_count <= queen_ready_min()) AS sets
            INTO q FROM queen_queues qq
            JOIN queen_groups g ON g.tenant = qq.tenant AND g.queue = qq.name AND g.consumer_group = k.grp
            WHERE qq.tenant = p_tenant AND qq.name = k.queue
              AND g.cursor_upto >= qq.partition_count AND g.cursor_count >= qq.partition_count;
            IF FOUND THEN
                SELECT coalesce(array_agg(w.pid ORDER BY w.claimed_at NULLS FIRST), '{}') INTO v_pids
                FROM (SELECT cu.partition_id AS pid, cu.claimed_at
                      FROM queen_cursors cu
                      CROSS JOIN LATERAL (SELECT pp.next_seq, pp.last_push_at FROM queen_partitions pp
                                          WHERE pp.tenant = p_tenant AND pp.id = cu.partition_id
                                          LIMIT 1) p
                      WHERE cu.tenant = p_tenant AND cu.queue = k.queue AND cu.consumer_group = k.grp AND cu.ready
                        AND queen_cursor_servable(p_tenant, k.grp, cu.partition_id, cu.acked_seq, p.next_seq,
                                                  cu.lease_until, p.last_push_at, q.window_s, q.gated, q.delay_s,
                                                  q.retry_delay_ms)
                      ORDER BY cu.claimed_at NULLS FIRST
                      LIMIT cardinality(k.jobs)
                      FOR UPDATE OF cu SKIP LOCKED) w;
            END IF;
        END IF;
        -- The common case as one set for all of them: an autoAck job (no conflation asked) handed a cursor
        -- with no lease, no per-message state of the group past it, and a window (its batch of offsets
        -- after the cursor) holding at least one message and none that queen_pop must treat on its own
        -- (expired, waited out, deleted). queen_pop would hand that window out as one set, move the cursor
        -- to its end, clear the lease fields, stamp claimed_at and wake long polls if the partition holds
        -- more; so do the three statements below, once for every such job instead of a queen_pop call
        -- each (its ten statements). Only where the queue gates nothing, the group does not conflate and
        -- the queue has at most queen_ready_min() partitions (no drained cursors to mark); every other job
        -- runs queen_pop on the cursor handed to it, as before.
        v_fjobs := NULL;
        IF cardinality(v_pids) > 0 THEN  -- (v_pids is set only where q was read for this group)
          IF q.sets THEN
            SELECT array_agg(e.job ORDER BY e.ord), array_agg(e.pid ORDER BY e.ord), array_agg(e.name ORDER BY e.ord),
                   array_agg(e.acked ORDER BY e.ord), array_agg(e.last ORDER BY e.ord)
            INTO v_fjobs, v_fpids, v_fnames, v_ffroms, v_flasts
            FROM (SELECT t.ord, t.job, t.pid, pp.name, cu.acked_seq AS acked, x.last
                  FROM unnest(k.jobs[1:cardinality(v_pids)], v_pids) WITH ORDINALITY AS t (job, pid, ord)
                  JOIN queen_cursors cu ON cu.tenant = p_tenant AND cu.partition_id = t.pid AND cu.consumer_group = k.grp
                  CROSS JOIN LATERAL (SELECT p2.name FROM queen_partitions p2
                                      WHERE p2.tenant = p_tenant AND p2.id = t.pid LIMIT 1) pp
                  CROSS JOIN LATERAL (  -- the window as queen_pop reads it (no state, nothing gated)
                      SELECT count(*) AS n, max(w.seq) AS last, coalesce(bool_or(w.special), false) AS special
                      FROM queen_pop_window(p_tenant, t.pid, k.grp, cu.acked_seq, p_batches[t.job], false,
                                            q.retry_limit, q.max_wait_s, false, 0, 0) w) x
                  WHERE p_auto_acks[t.job] AND NOT coalesce(p_conflations[t.job], false) AND cu.lease_id IS NULL
                    AND NOT EXISTS (SELECT 1 FROM queen_msg_state s
                                    WHERE s.tenant = p_tenant AND s.partition_id = t.pid AND s.consumer_group = k.grp
                                      AND s.seq > cu.acked_seq)
                    AND x.n > 0 AND NOT x.special) e;
          END IF;
        END IF;
        IF v_fjobs IS NOT NULL THEN
            RETURN QUERY
                SELECT h.job, 'msg'::text, h.pid, h.name::text, w.seq, w.id, w.txn, w.trace_id, w.payload, w.codec,
                       w.key_id, w.producer_sub, w.created_at, w.failures + 1, NULL::uuid, NULL::timestamptz, w.deadline_at
                FROM unnest(v_fjobs, v_fpids, v_fnames, v_ffroms, v_flasts) WITH ORDINALITY AS h (job, pid, name, acked, last, ord)
                CROSS JOIN LATERAL queen_pop_window(p_tenant, h.pid, k.grp, h.acked, p_batches[h.job], false,
                                                    q.retry_limit, q.max_wait_s, false, 0, 0) w
                WHERE w.seq <= h.last
                ORDER BY h.ord, w.seq;
            UPDATE queen_cursors cu
            SET acked_seq = greatest(cu.acked_seq, h.last), lease_id = NULL, lease_until = NULL, lease_end_seq = NULL,
                claimed_at = now()
            FROM unnest(v_fpids, v_flasts) AS h (pid, last)
            WHERE cu.tenant = p_tenant AND cu.partition_id = h.pid AND cu.consumer_group = k.grp;
            PERFORM queen_wake(p_tenant, ARRAY[k.queue])
            WHERE EXISTS (SELECT 1 FROM unnest(v_fpids, v_flasts) AS h (pid, last)
                          CROSS JOIN LATERAL (SELECT p2.next_seq FROM queen_partitions p2
                                              WHERE p2.tenant = p_tenant AND p2.id = h.pid LIMIT 1) pp
                          WHERE pp.next_seq - 1 > h.last);
        END IF;
        v_at := 0;
        v_hinted := false;
        FOREACH i IN ARRAY k.jobs LOOP
            v_at := v_at + 1;  -- (past the last cursor walked to, v_pids[v_at] is NULL: none for this job)
            CONTINUE WHEN v_fjobs IS NOT NULL AND i = ANY (v_fjobs);  -- served by the set above
            -- A job the walk left without a cursor, where the set above may serve: queen_pop would find
            -- nothing and answer idle with the group's lease hint (its walk's own query), the same for
            -- every such job, as they come after the jobs holding cursors. Read once.
            IF v_pids IS NOT NULL AND v_at > cardinality(v_pids) AND NOT coalesce(p_conflations[i], false) THEN
              IF q.sets AND q.window_s = 0 THEN
                IF NOT v_hinted THEN
                    SELECT min(cu.lease_until) INTO v_hint FROM queen_cursors cu
                    CROSS JOIN LATERAL (SELECT pp.next_seq FROM queen_partitions pp
                                        WHERE pp.tenant = p_tenant AND pp.id = cu.partition_id
                                        LIMIT 1) p
                    WHERE cu.tenant = p_tenant AND cu.queue = k.queue AND cu.consumer_group = k.grp AND cu.ready
                      AND cu.lease_until > now() AND p.next_seq - 1 > cu.acked_seq;
                    v_hinted := true;
                END IF;
                RETURN QUERY SELECT i, 'idle'::text, NULL::uuid, NULL::text,
                    ceil(extract(epoch FROM v_hint - now()) * 1000)::bigint, NULL::uuid, NULL::text, NULL::uuid,
                    NULL::bytea, NULL::smallint, NULL::text, NULL::text, NULL::timestamptz, NULL::integer, NULL::uuid,
                    v_hint, NULL::timestamptz;
                CONTINUE;
              END IF;
            END IF;
            RETURN QUERY
                SELECT i, p.kind, p.partition_id, p.partition, p.seq, p.id, p.txn, p.trace_id, p.payload, p.codec,
                       p.key_id, p.producer_sub, p.created_at, p.attempt, p.lease_id, p.lease_until, p.deadline_at
                FROM queen_pop(p_tenant => p_tenant, p_queue => p_queues[i], p_partition => p_parts[i],
                               p_group => p_groups[i], p_batch => p_batches[i], p_max_partitions => p_max_parts[i],
                               p_auto_ack => p_auto_acks[i], p_sub_mode => p_sub_modes[i],
                               p_sub_from => p_sub_froms[i], p_conflation => p_conflations[i],
                               p_shared => v_pids IS NOT NULL, p_share => v_pids[v_at]) p;
        END LOOP;
    END LOOP;
END
$$;

-- Acknowledge a batch: item i is (partition id, transaction id, status, lease id or NULL, group,
-- error text). Every item is judged against the state at the start of the call (a nack in the batch
-- does not invalidate the acks beside it). Answers one row per item, in order:
--   completed|success -> done; dlq -> filed as a dead letter and done;
--   failed|retry      -> one more failure: past the queue's retry limit it is filed (when the queue
--                        keeps a DLQ) and done; either way the lease on its partition is released, so
--                        what is not done from there on is delivered again.
-- With a lease id the cursor is the one holding that lease (an expired lease nobody re-claimed still
-- counts); without one, the item's group, and a message under somebody's live lease is refused.
CREATE OR REPLACE FUNCTION queen_ack(p_tenant text, p_pids uuid[], p_txns text[], p_statuses text[], p_leases uuid[],
                          p_groups text[], p_errors text[])
RETURNS TABLE (idx integer, success boolean, error text, dead_lettered boolean)
LANGUAGE plpgsql
-- Planned once per connection (and again after an ANALYZE of its tables): left to choose, PostgreSQL
-- re-planned the item and lock queries at every call, over a third of a one-item ack
-- (docs/performance.md, "ack").
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    r       record;
    v_fail  integer;
    v_dp    uuid[] := '{}';
    v_dg    text[] := '{}';
    v_ds    bigint[] := '{}';
    v_rp    uuid[] := '{}';
    v_rg    text[] := '{}';
    v_free  boolean;
    v_more  boolean;
    v_queue text;
    v_grp   text;
BEGIN
    -- The cursors the items name, locked in (partition, group) order. One primary-key probe per
    -- partition: a filter on partition_id = ANY (...) was planned (generic plan) as a scan of every
    -- cursor of the tenant, a cost that grew with the partitions (0.14 ms at 1,001 of them).
    PERFORM 1
    FROM (SELECT DISTINCT x.pid FROM unnest(p_pids) AS x(pid) ORDER BY 1) k
    CROSS JOIN LATERAL (
        SELECT 1 FROM queen_cursors cu
        WHERE cu.tenant = p_tenant AND cu.partition_id = k.pid
          AND (cu.consumer_group = ANY (p_groups) OR cu.lease_id = ANY (p_leases))
        ORDER BY cu.consumer_group
        FOR UPDATE) l;

    -- The common case in one statement: one message completed under its lease, the next offset of its
    -- cursor, nothing remembered beside the cursor (no out-of-order ack, no failure) and no retention
    -- floor above it. The cursor moves on by one and the lease goes once it covered nothing more: the
    -- same outcome as the general path below, which cost a one-item ack ~0.6 ms more (a loop, the
    -- side-table run search, a second update). Judged after the lock above, so by a snapshot that sees
    -- every ack committed before it; anything else falls through to the general path unchanged.
    IF cardinality(p_pids) = 1 AND p_leases[1] IS NOT NULL AND p_statuses[1] IN ('completed', 'success') THEN
        UPDATE queen_cursors c
        SET acked_seq = m.seq,
            lease_id = CASE WHEN m.seq >= c.lease_end_seq THEN NULL ELSE c.lease_id END,
            lease_until = CASE WHEN m.seq >= c.lease_end_seq THEN NULL ELSE c.lease_until END,
            lease_end_seq = CASE WHEN m.seq >= c.lease_end_seq THEN NULL ELSE c.lease_end_seq END
        FROM queen_messages m, queen_partitions p
        WHERE c.tenant = p_tenant AND c.partition_id = p_pids[1] AND c.lease_id = p_leases[1]
          AND m.tenant = p_tenant AND m.partition_id = p_pids[1] AND m.txn = p_txns[1]
          AND m.seq = c.acked_seq + 1 AND m.seq <= c.lease_end_seq
          AND p.tenant = p_tenant AND p.id = p_pids[1]
          AND NOT EXISTS (SELECT 1 FROM queen_msg_state s
                          WHERE s.tenant = p_tenant AND s.partition_id = p_pids[1]
                            AND s.consumer_group = c.consumer_group)
          AND NOT EXISTS (SELECT 1 FROM queen_log_floor f
                          WHERE f.tenant = p_tenant AND f.partition_id = p_pids[1] AND f.floor_seq > c.acked_seq)
        RETURNING c.lease_id IS NULL, p.next_seq - 1 > m.seq, p.queue, c.consumer_group INTO v_free, v_more, v_queue, v_grp;
        IF FOUND THEN
            IF v_free AND v_more THEN  -- the partition is free again and holds more: wake long polls
                PERFORM queen_wake(p_tenant, ARRAY[v_queue]);
            ELSIF v_free THEN  -- free, and nothing more there: the cursor may leave the walk's index
                PERFORM queen_cursor_drained(p_tenant, p_pids[1], v_grp);
            END IF;
            RETURN QUERY SELECT 1, true, NULL::text, false;
            RETURN;
        END IF;
    END IF;

    FOR r IN
        SELECT u.i::integer AS i, u.st, u.err, u.lease, m.seq, qq.retry_limit, qq.dlq_enabled, qq.retry_delay_ms,
               cu.partition_id AS pid, cu.consumer_group AS grp, cu.acked_seq, cu.lease_id, cu.lease_until,
               cu.lease_end_seq, coalesce(st.acked, false) AS side_acked, coalesce(st.failures, 0) AS failures
        FROM unnest(p_pids, p_txns, p_statuses, p_leases, p_groups, p_errors)
             WITH ORDINALITY AS u(pid, txn, st, lease, grp, err, i)
        LEFT JOIN queen_messages m ON m.tenant = p_tenant AND m.partition_id = u.pid AND m.txn = u.txn
        -- Each item's partition by a probe (a LATERAL subquery under a LIMIT): as a join, the generic plan
        -- built on statistics of a small table hashed every partition of the table for each call (402
        -- partition rows read by a two-item ack of a 100-partition queue beside 300 others; under 10 so).
        LEFT JOIN LATERAL (SELECT pp.queue FROM queen_partitions pp
                           WHERE pp.tenant = p_tenant AND pp.id = u.pid LIMIT 1) p ON true
        LEFT JOIN queen_queues qq ON qq.tenant = p_tenant AND qq.name = p.queue
        LEFT JOIN LATERAL (
            SELECT c.* FROM queen_cursors c
            WHERE c.tenant = p_tenant AND c.partition_id = u.pid
              AND (c.lease_id = u.lease OR c.consumer_group = u.grp)
            ORDER BY (c.lease_id IS NOT DISTINCT FROM u.lease) DESC
            LIMIT 1) cu ON true
        LEFT JOIN queen_msg_state st ON st.tenant = p_tenant AND st.partition_id = u.pid
                                    AND st.consumer_group = cu.consumer_group AND st.seq = m.seq
        ORDER BY u.i
    LOOP
        IF r.seq IS NULL THEN
            RETURN QUERY SELECT r.i, false, 'Message not found'::text, false;
            CONTINUE;
        END IF;
        IF r.pid IS NULL THEN
            RETURN QUERY SELECT r.i, false, CASE WHEN r.lease IS NOT NULL THEN 'Invalid or expired lease'
                ELSE 'this consumer group has no delivery of this message' END, false;
            CONTINUE;
        END IF;
        IF r.seq <= r.acked_seq OR r.side_acked THEN
            RETURN QUERY SELECT r.i, true, NULL::text, false;  -- already done: acks are idempotent
            CONTINUE;
        END IF;
        IF r.lease IS NOT NULL AND r.lease_id IS DISTINCT FROM r.lease THEN
            RETURN QUERY SELECT r.i, false, 'Invalid or expired lease'::text, false;
            CONTINUE;
        END IF;
        IF r.lease IS NULL AND r.lease_id IS NOT NULL AND r.lease_until > now() AND r.seq <= r.lease_end_seq THEN
            RETURN QUERY SELECT r.i, false, 'the message is leased to a consumer: acknowledge it with its leaseId'::text, false;
            CONTINUE;
        END IF;
        IF r.lease IS NOT NULL AND r.seq > r.lease_end_seq THEN
            RETURN QUERY SELECT r.i, false, 'the message is not covered by this lease'::text, false;
            CONTINUE;
        END IF;
        IF r.st IN ('completed', 'success') THEN
            v_dp := v_dp || r.pid; v_dg := v_dg || r.grp::text; v_ds := v_ds || r.seq;
            RETURN QUERY SELECT r.i, true, NULL::text, false;
        ELSIF r.st = 'dlq' THEN
            PERFORM queen_dlq_file(p_tenant, r.pid, r.grp, r.seq, coalesce(r.err, 'dead-lettered by the consumer'),
                                   r.failures);
            v_dp := v_dp || r.pid; v_dg := v_dg || r.grp::text; v_ds := v_ds || r.seq;
            RETURN QUERY SELECT r.i, true, NULL::text, true;
        ELSE
            INSERT INTO queen_msg_state AS s (tenant, partition_id, consumer_group, seq, failures, last_error, retry_at)
            VALUES (p_tenant, r.pid, r.grp, r.seq, 1, r.err, queen_retry_at(r.retry_delay_ms))
            ON CONFLICT (tenant, partition_id, consumer_group, seq)
            DO UPDATE SET failures = s.failures + 1, last_error = excluded.last_error, retry_at = excluded.retry_at
            RETURNING s.failures INTO v_fail;
            IF v_fail > r.retry_limit THEN
                IF r.dlq_enabled THEN
                    PERFORM queen_dlq_file(p_tenant, r.pid, r.grp, r.seq, coalesce(r.err, 'retries_exhausted'), v_fail);
                END IF;
                v_dp := v_dp || r.pid; v_dg := v_dg || r.grp::text; v_ds := v_ds || r.seq;
                RETURN QUERY SELECT r.i, true, NULL::text, r.dlq_enabled;
            ELSE
                RETURN QUERY SELECT r.i, true, NULL::text, false;
            END IF;
            v_rp := v_rp || r.pid; v_rg := v_rg || r.grp::text;
        END IF;
    END LOOP;

    PERFORM queen_cursor_advance(p_tenant, k.p, k.g,
                                 ARRAY(SELECT x.s FROM unnest(v_dp, v_dg, v_ds) AS x(p, g, s)
                                       WHERE x.p = k.p AND x.g = k.g))
    FROM (SELECT DISTINCT x.p, x.g FROM unnest(v_dp, v_dg) AS x(p, g) ORDER BY 1, 2) k;

    UPDATE queen_cursors cu SET lease_id = NULL, lease_until = NULL, lease_end_seq = NULL
    FROM (SELECT DISTINCT x.p, x.g FROM unnest(v_rp, v_rg) AS x(p, g)) k
    WHERE cu.tenant = p_tenant AND cu.partition_id = k.p AND cu.consumer_group = k.g;

    IF cardinality(v_rp) > 0 THEN
        PERFORM queen_wake(p_tenant, ARRAY(SELECT DISTINCT p.queue::text FROM queen_partitions p
                                           WHERE p.tenant = p_tenant AND p.id = ANY (v_rp)));
    END IF;
END
$$;

-- Delete one message (DELETE /api/v1/messages/{pid}/{txn}, docs/decisions.md §9): its row stays at its
-- offset as a tombstone (payload emptied, codec/key dropped, deleted_at set) so the partition's offsets
-- stay gapless. Every consumer group is done with it from now on: each cursor of the partition below it
-- remembers it as acknowledged and moves over the run it completes (a lease holding it keeps its other
-- messages, and is released once they are acked); a group that reaches it later passes over it in
-- queen_pop. Its dead letters (copies of its payload) go too. The storage gauge drops by the payload's
-- bytes, and a trace event (type 'deleted', by p_sub) records the deletion on the message. Answers one
-- row: status 'deleted' | 'already_deleted' (nothing changes: deleting twice is idempotent) |
-- 'not_found' (no such message for this tenant).
CREATE OR REPLACE FUNCTION queen_message_delete(p_tenant text, p_pid uuid, p_txn text, p_sub text, p_trace_id uuid)
RETURNS TABLE (status text, seq bigint, message_id uuid, queue text, partition text, freed_bytes bigint,
               dead_letters integer, deleted_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_seq   bigint;
    v_id    uuid;
    v_bytes bigint;
    v_at    timestamptz;
    v_queue text;
    v_name  text;
    v_dlq   integer := 0;
    k       record;
BEGIN
    SELECT p.queue, p.name INTO v_queue, v_name FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = p_pid;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::uuid, NULL::text, NULL::text, 0::bigint, 0,
                            NULL::timestamptz;
        RETURN;
    END IF;
    -- The partition's cursors first, in (partition, group) order as queen_ack takes them, then the row.
    PERFORM 1 FROM queen_cursors cu WHERE cu.tenant = p_tenant AND cu.partition_id = p_pid
    ORDER BY cu.consumer_group FOR UPDATE;
    SELECT m.seq, m.id, octet_length(m.payload), m.deleted_at INTO v_seq, v_id, v_bytes, v_at
    FROM queen_messages m WHERE m.tenant = p_tenant AND m.partition_id = p_pid AND m.txn = p_txn
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::uuid, v_queue, v_name, 0::bigint, 0,
                            NULL::timestamptz;
        RETURN;
    END IF;
    IF v_at IS NOT NULL THEN
        RETURN QUERY SELECT 'already_deleted'::text, v_seq, v_id, v_queue, v_name, 0::bigint, 0, v_at;
        RETURN;
    END IF;

    UPDATE queen_messages m SET payload = '\x'::bytea, codec = 0, key_id = NULL, deleted_at = now()
    WHERE m.tenant = p_tenant AND m.partition_id = p_pid AND m.seq = v_seq
    RETURNING m.deleted_at INTO v_at;
    PERFORM queen_gauge_add(p_tenant, -v_bytes, 0);

    FOR k IN SELECT cu.consumer_group AS grp FROM queen_cursors cu
             WHERE cu.tenant = p_tenant AND cu.partition_id = p_pid AND cu.acked_seq < v_seq
             ORDER BY cu.consumer_group LOOP
        PERFORM queen_cursor_advance(p_tenant, p_pid, k.grp, ARRAY[v_seq]);
    END LOOP;

    DELETE FROM queen_dlq d WHERE d.tenant = p_tenant AND d.message_id = v_id AND d.partition_id = p_pid;
    GET DIAGNOSTICS v_dlq = ROW_COUNT;

    INSERT INTO queen_traces (tenant, id, partition_id, txn, consumer_group, event_type, trace_names, data, sub)
    VALUES (p_tenant, p_trace_id, p_pid, p_txn, '', 'deleted', '{}',
            jsonb_build_object('offset', v_seq, 'freedBytes', v_bytes, 'deadLettersRemoved', v_dlq), p_sub);

    RETURN QUERY SELECT 'deleted'::text, v_seq, v_id, v_queue, v_name, v_bytes, v_dlq, v_at;
END
$$;

-- queen_push for the HTTP edge: p_plain names the queues whose payloads the caller did NOT encrypt
-- (it believed they do not encrypt at rest). queen_push_guard (queue_options.sql) refuses first: with
-- SQLSTATE QN001 if one of them encrypts now (configure raced the caller's cached view; the caller
-- re-seals and retries: nothing is ever stored in clear text for a queue that encrypts), with QN002
-- if a destination queue's maxSize would be exceeded.
CREATE OR REPLACE FUNCTION queen_push_checked(
    p_tenant text, p_plain text[], p_queues text[], p_partitions text[], p_ids uuid[], p_txns text[],
    p_traces uuid[], p_payloads bytea[], p_codecs smallint[], p_key_ids text[], p_subs text[],
    p_deadline_ms bigint[]
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id uuid, seq bigint)
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queen_queues q WHERE q.tenant = p_tenant AND (q.encryption_enabled OR q.max_size > 0)
               AND q.name = ANY (CASE WHEN p_queues[1] = ALL (p_queues) THEN p_queues[1:1] ELSE p_queues END)) THEN
        PERFORM queen_push_guard(p_tenant, p_plain, p_queues);  -- queue_options.sql: encryption race, maxSize
    END IF;
    RETURN QUERY SELECT * FROM queen_push(p_tenant, p_queues, p_partitions, p_ids, p_txns, p_traces,
                                          p_payloads, p_codecs, p_key_ids, p_subs, p_deadline_ms);
END
$$;

-- Prune one queue: delete at most p_limit messages from the heads of its partitions, as ONE
-- statement. Returns (partition id, new floor, rows deleted) per partition touched.
-- A message of a partition is a candidate when it is older than the queue's retentionSeconds, or when
-- it is older than completedRetentionSeconds and at/below every group's cursor on that partition (a
-- group of the queue without a cursor there has consumed nothing of it). The candidates deleted are
-- the leading run of the partition (the first non-candidate stops it).
CREATE OR REPLACE FUNCTION queen_log_prune_queue(p_tenant text, p_queue text, p_keep_s bigint, p_done_s bigint,
                                      p_limit integer)
RETURNS TABLE (partition_id uuid, floor_seq bigint, deleted bigint)
LANGUAGE sql AS $$
    WITH g AS (
        SELECT count(*) AS n FROM queen_groups gg WHERE gg.tenant = p_tenant AND gg.queue = p_queue
    ), parts AS (
        SELECT p.id, p.next_seq - 1 AS last_seq,
               coalesce((SELECT f.floor_seq FROM queen_log_floor f
                         WHERE f.tenant = p_tenant AND f.partition_id = p.id), 0) AS floor_seq,
               CASE WHEN p_done_s IS NULL OR (SELECT n FROM g) = 0 THEN 0
                    ELSE (SELECT CASE WHEN count(*) >= (SELECT n FROM g) THEN min(c.acked_seq) ELSE 0 END
                          FROM queen_cursors c WHERE c.tenant = p_tenant AND c.partition_id = p.id)
               END AS done_upto
        FROM queen_partitions p
        WHERE p.tenant = p_tenant AND p.queue = p_queue
    ), heads AS (
        -- The head run ends just before the first message (within the next p_limit offsets) that is not a
        -- candidate: one short index range per partition, never a scan of what stays.
        SELECT pa.id, h.upto, pa.floor_seq, h.upto - pa.floor_seq AS n
        FROM parts pa
        CROSS JOIN LATERAL (
            SELECT coalesce(
                (SELECT m.seq - 1 FROM queen_messages m
                 WHERE m.tenant = p_tenant AND m.partition_id = pa.id
                   AND m.seq > pa.floor_seq AND m.seq <= pa.floor_seq + p_limit
                   AND NOT coalesce(
                       (p_keep_s IS NOT NULL AND m.created_at < now() - p_keep_s * interval '1 second')
                       OR (p_done_s IS NOT NULL AND m.seq <= pa.done_upto
                           AND m.created_at < now() - p_done_s * interval '1 second'), false)
                 ORDER BY m.seq LIMIT 1),
                least(pa.floor_seq + p_limit, pa.last_seq)) AS upto) h
        WHERE pa.last_seq > pa.floor_seq AND h.upto > pa.floor_seq
    ), chosen AS (
        -- Whole heads while the running total fits; the one that crosses p_limit is cut to fit.
        SELECT z.id, z.upto - greatest(z.run - p_limit, 0) AS upto
        FROM (SELECT hh.id, hh.upto, hh.floor_seq, sum(hh.n) OVER (ORDER BY hh.id) AS run FROM heads hh) z
        WHERE z.run - (z.upto - z.floor_seq) < p_limit
    ), del AS (
        DELETE FROM queen_messages m USING chosen ch
        WHERE m.tenant = p_tenant AND m.partition_id = ch.id AND m.seq <= ch.upto
        RETURNING m.partition_id
    ), fl AS (
        INSERT INTO queen_log_floor AS f (tenant, partition_id, floor_seq)
        SELECT p_tenant, ch.id, ch.upto FROM chosen ch
        ON CONFLICT (tenant, partition_id) DO UPDATE SET floor_seq = greatest(f.floor_seq, excluded.floor_seq)
    )
    SELECT ch.id, ch.upto, (SELECT count(*) FROM del d WHERE d.partition_id = ch.id) FROM chosen ch;
$$;

-- One pruning batch over every queue with a retention option: at most p_limit messages in all.
-- A queue is pruned by one worker at a time (a per-queue advisory lock, tried, never waited for: a
-- queue another worker is pruning is skipped). After the delete, the cursors of the pruned partitions
-- that are below the new floor move up to it (only those no pop or ack holds right now: SKIP LOCKED;
-- the others move at their next advance, which applies the floor too), dropping a lease whose whole
-- range is gone and the side rows below the floor. Returns (tenant, queue, deleted) per queue pruned.
CREATE OR REPLACE FUNCTION queen_log_prune(p_limit integer)
RETURNS TABLE (tenant text, queue text, deleted bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q      record;
    v_left integer := p_limit;
    v_pids uuid[];
    v_upto bigint[];
    v_n    bigint;
BEGIN
    FOR q IN
        SELECT qq.tenant, qq.name,
               nullif(qq.options ->> 'retentionSeconds', '')::bigint AS keep_s,
               nullif(qq.options ->> 'completedRetentionSeconds', '')::bigint AS done_s
        FROM queen_queues qq
        WHERE qq.options ?| ARRAY['retentionSeconds', 'completedRetentionSeconds']
        ORDER BY random()
    LOOP
        EXIT WHEN v_left <= 0;
        CONTINUE WHEN coalesce(q.keep_s, 0) <= 0 AND coalesce(q.done_s, 0) <= 0;
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(7302, queen_wake_key(q.tenant, q.name));
        SELECT array_agg(r.partition_id), array_agg(r.floor_seq), coalesce(sum(r.deleted), 0)
        INTO v_pids, v_upto, v_n
        FROM queen_log_prune_queue(q.tenant, q.name, nullif(q.keep_s, 0), nullif(q.done_s, 0), v_left) r;
        CONTINUE WHEN v_n = 0;
        v_left := v_left - v_n::integer;

        WITH fl AS (
            SELECT x.pid, x.upto FROM unnest(v_pids, v_upto) AS x(pid, upto)
        ), locked AS (
            SELECT c.partition_id, c.consumer_group, fl.upto
            FROM queen_cursors c JOIN fl ON c.partition_id = fl.pid
            WHERE c.tenant = q.tenant AND c.acked_seq < fl.upto
            FOR UPDATE OF c SKIP LOCKED
        ), st AS (
            DELETE FROM queen_msg_state s USING locked l
            WHERE s.tenant = q.tenant AND s.partition_id = l.partition_id AND s.consumer_group = l.consumer_group
              AND s.seq <= l.upto
        )
        UPDATE queen_cursors c
        SET acked_seq = l.upto,
            lease_id = CASE WHEN c.lease_end_seq <= l.upto THEN NULL ELSE c.lease_id END,
            lease_until = CASE WHEN c.lease_end_seq <= l.upto THEN NULL ELSE c.lease_until END,
            lease_end_seq = CASE WHEN c.lease_end_seq <= l.upto THEN NULL ELSE c.lease_end_seq END
        FROM locked l
        WHERE c.tenant = q.tenant AND c.partition_id = l.partition_id AND c.consumer_group = l.consumer_group;

        tenant := q.tenant; queue := q.name; deleted := v_n;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The HTTP push in ONE statement: the admission checks of queen_push_checked, queen_push, and the
-- metering of the messages queued (queen_meter, the function metering.record calls) all run in the
-- statement's own transaction. Before, a push was BEGIN, queen_push_checked, queen_meter, COMMIT: four
-- round trips where one does. Same rows as queen_push; SQLSTATE QN001/QN002 as queen_push_checked.
CREATE OR REPLACE FUNCTION queen_push_edge(
    p_tenant text, p_period_s integer, p_plain text[], p_queues text[], p_partitions text[], p_ids uuid[],
    p_txns text[], p_traces uuid[], p_payloads bytea[], p_codecs smallint[], p_key_ids text[], p_subs text[],
    p_deadline_ms bigint[]
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id uuid, seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_queued bigint := 0;
BEGIN
    IF EXISTS (SELECT 1 FROM queen_queues q WHERE q.tenant = p_tenant AND (q.encryption_enabled OR q.max_size > 0)
               AND q.name = ANY (CASE WHEN p_queues[1] = ALL (p_queues) THEN p_queues[1:1] ELSE p_queues END)) THEN
        PERFORM queen_push_guard(p_tenant, p_plain, p_queues);  -- queue_options.sql: encryption race, maxSize
    END IF;
    FOR idx, status, message_id, partition_id, seq IN
        SELECT r.idx, r.status, r.message_id, r.partition_id, r.seq
        FROM queen_push(p_tenant, p_queues, p_partitions, p_ids, p_txns, p_traces, p_payloads, p_codecs,
                        p_key_ids, p_subs, p_deadline_ms) r
    LOOP
        IF status = 'queued' THEN
            v_queued := v_queued + 1;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF v_queued > 0 THEN
        PERFORM queen_meter(p_tenant, p_period_s, v_queued, 0);
    END IF;
END
$$;
