-- Retention of the message log. Two queue options, enforced by the pruner loop of every worker:
--   retentionSeconds          -> a message older than N s is deleted, consumed or not;
--   completedRetentionSeconds -> a message older than N s that every consumer group of the queue (queue
--                                mode included) has done is deleted.
-- 0 or absent = keep for ever. Deletion only ever removes the HEAD of a partition (a contiguous run of
-- offsets from its start), so the log of a partition stays gapless above its floor: cursors, which
-- say "every offset <= acked_seq is done", stay valid, and one below the floor just moves up to it.
--
-- queen_log_floor remembers, per partition, the highest offset deleted. It is a table of its own (not
-- a column of queen_partitions) so the pruner never takes a partition row lock, which every push
-- holds while it allocates offsets: pruning never waits for, nor blocks, a push.

CREATE TABLE queen_log_floor (
    tenant       text NOT NULL,
    partition_id uuid NOT NULL,
    floor_seq    bigint NOT NULL,
    PRIMARY KEY (tenant, partition_id)
);

-- The queues the pruner looks at: only those with a retention option.
CREATE INDEX queen_queues_retention ON queen_queues (tenant, name)
    WHERE options ?| ARRAY['retentionSeconds', 'completedRetentionSeconds'];

-- Prune one queue: delete at most p_limit messages from the heads of its partitions, as ONE
-- statement. Returns (partition id, new floor, rows deleted) per partition touched.
-- A message of a partition is a candidate when it is older than the queue's retentionSeconds, or when
-- it is older than completedRetentionSeconds and at/below every group's cursor on that partition (a
-- group of the queue without a cursor there has consumed nothing of it). The candidates deleted are
-- the leading run of the partition (the first non-candidate stops it).
CREATE FUNCTION queen_log_prune_queue(p_tenant text, p_queue text, p_keep_s bigint, p_done_s bigint,
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
CREATE FUNCTION queen_log_prune(p_limit integer)
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

-- The cursor advance applies the floor: a cursor below the first offset still in the log is done up to
-- the floor (those messages are gone), so acks above a pruned head still make a contiguous run.
-- Supersedes queen_cursor_advance of 0012 (same signature and semantics otherwise).
CREATE OR REPLACE FUNCTION queen_cursor_advance(p_tenant text, p_pid uuid, p_group text, p_done bigint[] DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_acked    bigint;
    v_start    bigint;
    v_end      bigint;
    v_released boolean;
BEGIN
    SELECT c.acked_seq INTO v_acked FROM queen_cursors c
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
    UPDATE queen_cursors c
    SET acked_seq = v_acked,
        lease_id = CASE WHEN c.lease_end_seq IS NOT NULL AND v_acked >= c.lease_end_seq THEN NULL ELSE c.lease_id END,
        lease_until = CASE WHEN c.lease_end_seq IS NOT NULL AND v_acked >= c.lease_end_seq THEN NULL ELSE c.lease_until END,
        lease_end_seq = CASE WHEN c.lease_end_seq IS NOT NULL AND v_acked >= c.lease_end_seq THEN NULL ELSE c.lease_end_seq END
    WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group
    RETURNING c.lease_id IS NULL INTO v_released;
    IF v_released THEN
        PERFORM queen_wake(p_tenant, ARRAY[p.queue::text])
        FROM queen_partitions p WHERE p.tenant = p_tenant AND p.id = p_pid AND p.next_seq - 1 > v_acked;
    END IF;
    RETURN v_acked;
END
$$;
