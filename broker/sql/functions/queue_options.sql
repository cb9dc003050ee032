-- The queue options that gate delivery and admission (broker/sql/migrations/0010_queue_options.sql), as small
-- helpers that queen_push_edge / queen_push_checked / queen_pop / queen_ack (log.sql) call. Every "now"
-- here is the database's. With every option at its default (0) a push pays only the one queen_queues
-- probe it already made for the encryption check (queen_push_guard is not even called), and a pop reads
-- four more integer columns of the queue row it already reads.

-- When a failed delivery may be retried under retryDelay (NULL: at once).
CREATE OR REPLACE FUNCTION queen_retry_at(p_retry_ms integer) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_retry_ms > 0 THEN now() + p_retry_ms * interval '1 millisecond' END
$$;

-- The instant the head of (partition, group) after offset p_acked may be delivered, by
-- delayedProcessing (its push instant + p_delay_s) and retryDelay (its last failure's retry_at); NULL
-- when nothing holds it (or there is no head; a deleted message is no head). PL/pgSQL, not SQL: its body names a column of migration
-- 0010, and a SQL function's body is checked when it is created, which an upgrade that re-applies these
-- files after each older migration would refuse.
CREATE OR REPLACE FUNCTION queen_head_ready_at(p_tenant text, p_pid uuid, p_group text, p_acked bigint,
                                               p_delay_s integer, p_retry_ms integer) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT greatest(CASE WHEN p_delay_s > 0 THEN m.created_at + p_delay_s * interval '1 second' END,
                        CASE WHEN p_retry_ms > 0 THEN st.retry_at END)
        FROM queen_messages m
        LEFT JOIN queen_msg_state st ON st.tenant = p_tenant AND st.partition_id = p_pid
                                    AND st.consumer_group = p_group AND st.seq = m.seq
        WHERE m.tenant = p_tenant AND m.partition_id = p_pid AND m.seq > p_acked AND st.acked IS NOT TRUE
          AND m.deleted_at IS NULL  -- a tombstone holds nothing back: queen_pop passes over it
        ORDER BY m.seq
        LIMIT 1);
END
$$;

-- Can a pop serve this (cursor, partition) now: something after the cursor, no live lease, the
-- windowBuffer quiet period over, the head past delayedProcessing / retryDelay. (Inlined by the planner.)
CREATE OR REPLACE FUNCTION queen_cursor_servable(p_tenant text, p_group text, p_pid uuid, p_acked bigint,
                                                 p_next bigint, p_lease_until timestamptz,
                                                 p_last_push timestamptz, p_window_s integer, p_gated boolean,
                                                 p_delay_s integer, p_retry_ms integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_next - 1 > p_acked
       AND (p_lease_until IS NULL OR p_lease_until <= now())
       AND (p_window_s = 0 OR p_last_push IS NULL OR p_last_push <= now() - p_window_s * interval '1 second')
       AND (NOT p_gated OR coalesce(queen_head_ready_at(p_tenant, p_pid, p_group, p_acked, p_delay_s, p_retry_ms),
                                    now()) <= now())
$$;

-- For an empty pop of a gated queue: the earliest future instant one of the group's free partitions
-- with pending messages becomes servable (its head's delay or retry wait ends, or its windowBuffer
-- passes), so a long poll wakes then rather than at its timeout. NULL if none. (cu.ready, migration
-- 0027, lets it read only the cursors with something to hand out; a LANGUAGE sql body naming it is
-- checked at its first call, not at CREATE, as the upgrade applies these files after older migrations.)
SET LOCAL check_function_bodies = off;
CREATE OR REPLACE FUNCTION queen_pop_ready_at(p_tenant text, p_queue text, p_partition text, p_group text,
                                              p_delay_s integer, p_window_s integer, p_retry_ms integer)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(r.at) FROM (
        SELECT greatest(
                   CASE WHEN p_delay_s > 0 OR p_retry_ms > 0 THEN
                       queen_head_ready_at(p_tenant, cu.partition_id, p_group, cu.acked_seq, p_delay_s, p_retry_ms)
                   END,
                   CASE WHEN p_window_s > 0 THEN p.last_push_at + p_window_s * interval '1 second' END) AS at
        FROM queen_cursors cu
        JOIN queen_partitions p ON p.tenant = cu.tenant AND p.id = cu.partition_id
        WHERE cu.tenant = p_tenant AND cu.queue = p_queue AND cu.consumer_group = p_group AND cu.ready
          AND (p_partition IS NULL OR p.name = p_partition)
          AND p.next_seq - 1 > cu.acked_seq
          AND (cu.lease_until IS NULL OR cu.lease_until <= now())) r
    WHERE r.at > now()
$$;
RESET check_function_bodies;

-- maxSize: the queue's backlog, the messages of its partitions that the slowest of its consumer groups
-- (queue mode included) has not passed yet. A partition that some group has no cursor on yet counts
-- whole (that group has consumed nothing of it); with no group at all, everything still in the log.
-- Out-of-order acks beyond a cursor still count until the cursor passes them.
CREATE OR REPLACE FUNCTION queen_queue_backlog(p_tenant text, p_queue text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    WITH g AS (
        SELECT count(*) AS n FROM queen_groups gg WHERE gg.tenant = p_tenant AND gg.queue = p_queue
    )
    SELECT coalesce(sum(p.next_seq - 1 - greatest(
               coalesce((SELECT f.floor_seq FROM queen_log_floor f
                         WHERE f.tenant = p_tenant AND f.partition_id = p.id), 0),
               (SELECT CASE WHEN (SELECT n FROM g) > 0 AND count(*) >= (SELECT n FROM g) THEN min(c.acked_seq)
                            ELSE 0 END
                FROM queen_cursors c WHERE c.tenant = p_tenant AND c.partition_id = p.id))), 0)::bigint
    FROM queen_partitions p
    WHERE p.tenant = p_tenant AND p.queue = p_queue
$$;

-- The admission checks of a push from the HTTP edge, before any row is written. queen_push_edge and
-- queen_push_checked call it only when one destination queue encrypts or has a maxSize (one EXISTS
-- probe of the queue rows, the same cost as the encryption probe they made before maxSize existed):
--   * p_plain names the queues whose payloads the caller did NOT encrypt (it believed they do not encrypt
--     at rest): if one of them encrypts now (configure raced the caller's cached view), SQLSTATE QN001,
--     so the caller re-seals and retries; nothing is ever stored in clear text for a queue that encrypts;
--   * maxSize: a queue whose backlog (queen_queue_backlog) plus this push's items for it would exceed its
--     maxSize refuses the push: SQLSTATE QN002, DETAIL a JSON array of {queue, maxSize, backlog, items},
--     one per full queue; nothing is written. Pushes to a capped queue take a per-queue advisory lock
--     first, so two concurrent pushes cannot both take the last free place.
CREATE OR REPLACE FUNCTION queen_push_guard(p_tenant text, p_plain text[], p_queues text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_qs     text[];
    v_enc    boolean;
    v_capped boolean;
    v_full   jsonb;
BEGIN
    -- Almost every push names one queue: no sort, no DISTINCT then.
    v_qs := CASE WHEN p_queues[1] = ALL (p_queues) THEN p_queues[1:1]
                 ELSE ARRAY(SELECT DISTINCT x.q FROM unnest(p_queues) AS x(q)) END;
    SELECT coalesce(bool_or(q.encryption_enabled AND q.name = ANY (p_plain)), false),
           coalesce(bool_or(q.max_size > 0), false)
    INTO v_enc, v_capped
    FROM queen_queues q WHERE q.tenant = p_tenant AND q.name = ANY (v_qs);
    IF v_enc THEN
        RAISE EXCEPTION 'a destination queue encrypts at rest' USING ERRCODE = 'QN001';
    END IF;
    IF NOT v_capped THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(7303, queen_wake_key(p_tenant, q.name))
    FROM queen_queues q WHERE q.tenant = p_tenant AND q.name = ANY (v_qs) AND q.max_size > 0
    ORDER BY q.name;
    SELECT jsonb_agg(jsonb_build_object('queue', c.name, 'maxSize', c.max_size, 'backlog', c.backlog,
                                        'items', c.n) ORDER BY c.name)
    INTO v_full
    FROM (SELECT q.name, q.max_size, queen_queue_backlog(p_tenant, q.name) AS backlog,
                 (SELECT count(*) FROM unnest(p_queues) AS x(q) WHERE x.q = q.name) AS n
          FROM queen_queues q WHERE q.tenant = p_tenant AND q.name = ANY (v_qs) AND q.max_size > 0) c
    WHERE c.backlog + c.n > c.max_size;
    IF v_full IS NOT NULL THEN
        RAISE EXCEPTION 'queue_full' USING ERRCODE = 'QN002', DETAIL = v_full::text;
    END IF;
END
$$;
