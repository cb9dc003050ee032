-- Ephemeral queues (docs/protocol.md §6, broker/ephemeral/): every call is one function call, one
-- round trip. Tables: broker/sql/migrations/0009_ephemeral.sql (the declarations logged, the contents
-- UNLOGGED). Every "now" is the database's: TTL, leases and redelivery are judged here.
--
-- Serialisation: a push (and reset) of a queue holds the transaction advisory lock
-- (hash(tenant, queue), 0), so the bounds are judged against a depth no other push is changing; a pop
-- holds (hash(tenant, queue), hash(group)), so two consumers of one group never take the same
-- message (the cursor and the due leases are read and moved under it). Acks lock the in-flight rows
-- they settle; removing settled messages from the ring takes turns per queue (queen_eph_trim).
--
-- Consumption: each group has a cursor per partition over the one ring (fan-out: every group sees
-- every message pushed after its first pop, and what the ring still holds from before; competing
-- consumers of one group share its cursor). A message leaves the ring when every group that has
-- popped from the queue has passed it and none holds it (queen_eph_trim), when it is older than
-- ttlSeconds, when dropOldest makes room, or on reset/delete. A group that stops popping keeps the
-- ring full until TTL or the bounds deal with it (reset forgets every group).
-- Re-applied at boot when any function file changes (docs/guides/deploying.md, "Schema and upgrades"): CREATE OR
-- REPLACE statements only; tables, indexes and data belong in forward-only migrations.

-- The lock key of a queue (first half of the advisory lock pair).
CREATE OR REPLACE FUNCTION queen_eph_key(p_tenant text, p_queue text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtext(p_tenant || E'\x1f' || p_queue)
$$;

-- The file names no table's row type and has no LANGUAGE sql body over a table: the function files
-- are applied after every migration step, also to a schema from before 0009 (tests/test_migrate.py).

-- Make sure the queue has a declaration: an implicit queue gets the column defaults.
CREATE OR REPLACE FUNCTION queen_eph_ensure(p_tenant text, p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM queen_eph_queues WHERE tenant = p_tenant AND name = p_queue;
    IF NOT FOUND THEN
        INSERT INTO queen_eph_queues (tenant, name) VALUES (p_tenant, p_queue) ON CONFLICT DO NOTHING;
    END IF;
END
$$;

-- The tenant's incarnation tag (made on first use; made anew after a crash emptied the table).
CREATE OR REPLACE FUNCTION queen_eph_tag(p_tenant text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    SELECT tag INTO v FROM queen_eph_incarnation WHERE tenant = p_tenant;
    IF v IS NULL THEN
        INSERT INTO queen_eph_incarnation (tenant, tag)
        VALUES (p_tenant, substr(md5(random()::text || clock_timestamp()::text), 1, 10))
        ON CONFLICT DO NOTHING;
        SELECT tag INTO v FROM queen_eph_incarnation WHERE tenant = p_tenant;
    END IF;
    RETURN v;
END
$$;

-- Add to a queue's gauges and drop counters.
CREATE OR REPLACE FUNCTION queen_eph_count(p_tenant text, p_queue text, d_depth bigint, d_bytes bigint,
                                           d_bounds bigint, d_ttl bigint, d_retry bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen_eph_stats AS s (tenant, queue, depth, bytes, dropped_bounds, dropped_ttl, dropped_retry)
    VALUES (p_tenant, p_queue, greatest(d_depth, 0), greatest(d_bytes, 0), d_bounds, d_ttl, d_retry)
    ON CONFLICT (tenant, queue) DO UPDATE
    SET depth = greatest(s.depth + d_depth, 0), bytes = greatest(s.bytes + d_bytes, 0), touched_at = now(),
        dropped_bounds = s.dropped_bounds + d_bounds, dropped_ttl = s.dropped_ttl + d_ttl,
        dropped_retry = s.dropped_retry + d_retry;
END
$$;

-- Delete the given messages (and the leases on them); returns how many went. Kind 'ttl' or 'bounds'
-- says which drop counter they go to ('' counts none: consumed, reset).
CREATE OR REPLACE FUNCTION queen_eph_drop(p_tenant text, p_queue text, p_seqs bigint[], p_kind text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    b bigint;
BEGIN
    WITH gone AS (
        DELETE FROM queen_eph_messages m
        WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = ANY (p_seqs)
        RETURNING m.bytes
    )
    SELECT count(*), coalesce(sum(bytes), 0) INTO n, b FROM gone;
    IF n > 0 THEN
        DELETE FROM queen_eph_inflight i WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.seq = ANY (p_seqs);
        PERFORM queen_eph_count(p_tenant, p_queue, -n, -b,
                                CASE WHEN p_kind = 'bounds' THEN n ELSE 0 END,
                                CASE WHEN p_kind = 'ttl' THEN n ELSE 0 END, 0);
    END IF;
    RETURN n;
END
$$;

-- Drop the queue's messages older than its ttlSeconds (0: no age limit).
CREATE OR REPLACE FUNCTION queen_eph_expire(p_tenant text, p_queue text, p_ttl_s integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_ttl_s > 0 THEN
        PERFORM queen_eph_drop(p_tenant, p_queue, ARRAY(
            SELECT m.seq FROM queen_eph_messages m
            WHERE m.tenant = p_tenant AND m.queue = p_queue
              AND m.created_at <= now() - make_interval(secs => p_ttl_s)), 'ttl');
    END IF;
END
$$;

-- Housekeeping (the ephemeral-expiry loop): drop expired messages of every queue with a ttlSeconds,
-- queue by queue, until about p_limit went, then forget up to 100 implicit queues that are empty and
-- untouched (no push, settle or drop) for p_idle_s, with their group cursors and counters (a queue
-- being pushed to right now is skipped: it holds the push lock). Returns the messages dropped.
-- Delivery never depends on it (pushes and pops expire their queue first).
CREATE OR REPLACE FUNCTION queen_eph_sweep(p_limit integer, p_idle_s integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    n bigint := 0;
    before bigint;
BEGIN
    FOR q IN SELECT e.tenant, e.name, e.ttl_s FROM queen_eph_queues e WHERE e.ttl_s > 0 LOOP
        EXIT WHEN n >= p_limit;
        SELECT coalesce(max(s.dropped_ttl), 0) INTO before FROM queen_eph_stats s
        WHERE s.tenant = q.tenant AND s.queue = q.name;
        PERFORM queen_eph_expire(q.tenant, q.name, q.ttl_s);
        n := n + (SELECT coalesce(max(s.dropped_ttl), 0) FROM queen_eph_stats s
                  WHERE s.tenant = q.tenant AND s.queue = q.name) - before;
    END LOOP;
    FOR q IN SELECT e.tenant, e.name FROM queen_eph_queues e
             LEFT JOIN queen_eph_stats s ON s.tenant = e.tenant AND s.queue = e.name
             WHERE NOT e.declared AND e.created_at < now() - make_interval(secs => p_idle_s)
               AND coalesce(s.touched_at, e.created_at) < now() - make_interval(secs => p_idle_s)
             LIMIT 100 LOOP
        IF pg_try_advisory_xact_lock(queen_eph_key(q.tenant, q.name), 0)
           AND NOT EXISTS (SELECT 1 FROM queen_eph_messages m WHERE m.tenant = q.tenant AND m.queue = q.name)
           AND NOT EXISTS (SELECT 1 FROM queen_eph_inflight i WHERE i.tenant = q.tenant AND i.queue = q.name) THEN
            PERFORM queen_eph_delete(q.tenant, q.name);
        END IF;
    END LOOP;
    RETURN n;
END
$$;

-- Remove those of p_seqs that every group of the queue has passed and none holds under a lease (a
-- group that has no cursor row for the message's partition has not passed it). Callers pass what they
-- just settled or handed out for good. Trims of one queue take turns (an advisory lock held to commit)
-- and each judges with what the previous ones committed, so when two groups settle a message at once
-- the later trim sees the other's change and removes it: nothing is left behind.
CREATE OR REPLACE FUNCTION queen_eph_trim(p_tenant text, p_queue text, p_seqs bigint[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_seqs), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext(E'eph-trim\x1f' || p_tenant || E'\x1f' || p_queue), 0);
    PERFORM queen_eph_drop(p_tenant, p_queue, ARRAY(
        SELECT m.seq FROM queen_eph_messages m
        WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = ANY (p_seqs)
          AND NOT EXISTS (SELECT 1 FROM queen_eph_inflight i
                          WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.seq = m.seq)
          AND NOT EXISTS (
              SELECT 1 FROM (SELECT DISTINCT c.grp FROM queen_eph_cursors c
                             WHERE c.tenant = p_tenant AND c.queue = p_queue) g
              LEFT JOIN queen_eph_cursors c
                ON c.tenant = p_tenant AND c.queue = p_queue AND c.grp = g.grp AND c.partition = m.partition
              WHERE coalesce(c.last_seq, 0) < m.seq)), '');
END
$$;

-- The queue's effective options, as the API shows them.
CREATE OR REPLACE FUNCTION queen_eph_options(q record) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'maxBytes', q.max_bytes, 'maxLength', q.max_length, 'policy', q.policy, 'ttlSeconds', q.ttl_s,
        'leaseSeconds', q.lease_s, 'retryLimit', q.retry_limit,
        'windowBuffer', jsonb_build_object('ms', q.window_ms, 'count', q.window_count));
END
$$;

-- Declare a queue: every option not given takes its default (a declaration replaces the previous one;
-- the contents stay). Answers the stored declaration.
CREATE OR REPLACE FUNCTION queen_eph_configure(p_tenant text, p_queue text, p_max_bytes bigint,
    p_max_length bigint, p_policy text, p_ttl_s integer, p_lease_s integer, p_retry_limit integer,
    p_window_ms integer, p_window_count integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    INSERT INTO queen_eph_queues AS q (tenant, name, declared) VALUES (p_tenant, p_queue, true)
    ON CONFLICT (tenant, name) DO UPDATE
    SET declared = true, max_bytes = DEFAULT, max_length = DEFAULT, policy = DEFAULT, ttl_s = DEFAULT,
        lease_s = DEFAULT, retry_limit = DEFAULT, window_ms = DEFAULT, window_count = DEFAULT;
    UPDATE queen_eph_queues q
    SET max_bytes = coalesce(p_max_bytes, q.max_bytes), max_length = coalesce(p_max_length, q.max_length),
        policy = coalesce(p_policy, q.policy), ttl_s = coalesce(p_ttl_s, q.ttl_s),
        lease_s = coalesce(p_lease_s, q.lease_s), retry_limit = coalesce(p_retry_limit, q.retry_limit),
        window_ms = coalesce(p_window_ms, q.window_ms), window_count = coalesce(p_window_count, q.window_count),
        updated_at = now()
    WHERE q.tenant = p_tenant AND q.name = p_queue
    RETURNING * INTO r;
    RETURN jsonb_build_object('queue', r.name, 'configured', true, 'declared', true,
                              'options', queen_eph_options(r));
END
$$;

-- Push: all or nothing. Answers how many went in and how many old messages dropOldest removed; a
-- refusal raises (so nothing of the call, not even an implicit queue's declaration, is kept): QE001
-- when the bounds are reached and the policy is reject, QE002 when the batch alone is larger than the
-- bounds. Meters the messages and NOTIFYs waiting pops at commit.
CREATE OR REPLACE FUNCTION queen_eph_push(p_tenant text, p_queue text, p_partition text, p_payloads jsonb[],
                                          p_period_s integer)
RETURNS TABLE (pushed bigint, dropped bigint)
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    v_n bigint;
    v_b bigint;
    need_n bigint;
    need_b bigint;
    v_seqs bigint[] := '{}';
    m record;
BEGIN
    pushed := 0;
    dropped := 0;
    -- taken before the declaration is read or made: the idle-queue collection takes it too
    PERFORM pg_advisory_xact_lock(queen_eph_key(p_tenant, p_queue), 0);
    PERFORM queen_eph_ensure(p_tenant, p_queue);
    SELECT * INTO q FROM queen_eph_queues WHERE tenant = p_tenant AND name = p_queue;
    SELECT count(*), coalesce(sum(octet_length(x::text)), 0) INTO v_n, v_b FROM unnest(p_payloads) x;
    IF v_n = 0 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_n > q.max_length OR v_b > q.max_bytes THEN
        RAISE EXCEPTION 'the push alone exceeds the bounds of ephemeral queue %', p_queue USING ERRCODE = 'QE002';
    END IF;
    PERFORM queen_eph_expire(p_tenant, p_queue, q.ttl_s);
    SELECT coalesce(max(s.depth), 0) + v_n - q.max_length, coalesce(max(s.bytes), 0) + v_b - q.max_bytes
    INTO need_n, need_b
    FROM queen_eph_stats s WHERE s.tenant = p_tenant AND s.queue = p_queue;
    IF need_n > 0 OR need_b > 0 THEN
        IF q.policy = 'reject' THEN
            RAISE EXCEPTION 'ephemeral queue % is full', p_queue USING ERRCODE = 'QE001';
        END IF;
        FOR m IN SELECT e.seq, e.bytes FROM queen_eph_messages e
                 WHERE e.tenant = p_tenant AND e.queue = p_queue ORDER BY e.seq LOOP
            EXIT WHEN need_n <= 0 AND need_b <= 0;
            v_seqs := v_seqs || m.seq;
            need_n := need_n - 1;
            need_b := need_b - m.bytes;
        END LOOP;
        dropped := queen_eph_drop(p_tenant, p_queue, v_seqs, 'bounds');
    END IF;
    INSERT INTO queen_eph_messages (tenant, queue, seq, partition, payload, bytes)
    SELECT p_tenant, p_queue, nextval('queen_eph_seq'), p_partition, u.x, octet_length(u.x::text)
    FROM (SELECT x, o FROM unnest(p_payloads) WITH ORDINALITY AS t(x, o) ORDER BY o) u;
    PERFORM queen_eph_count(p_tenant, p_queue, v_n, v_b, 0, 0, 0);
    PERFORM queen_meter(p_tenant, p_period_s, v_n, 0);
    -- The meter row (and the sequence) are the push's only WAL: commit without waiting for its flush,
    -- like the unlogged-only pops and acks do anyway. A database crash may then forget the metering of
    -- the last moments' pushes - the very pushes whose messages that crash empties.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_notify('queen_ephemeral', p_tenant || E'\t' || p_queue);
    pushed := v_n;
    RETURN NEXT;
END
$$;

-- Pop up to p_batch messages for a group: first its leases that have run out (redelivered with
-- attempts + 1; beyond the retry limit dropped and counted), then messages past its cursor in seq
-- order. With p_auto_ack nothing is leased (the cursor moves, at most once). Each row carries the
-- incarnation tag (for the id) and the queue's window buffer (for a waiting pop); when there is no
-- message, one row with seq NULL carries due_ms: how long until the group's first lease runs out.
CREATE OR REPLACE FUNCTION queen_eph_pop(p_tenant text, p_queue text, p_partition text, p_grp text,
                                         p_batch integer, p_auto_ack boolean)
RETURNS TABLE (seq bigint, partition text, payload jsonb, attempts integer, last_error text, tag text,
               window_ms integer, window_count integer, due_ms integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q record;
    v_tag text;
    v_lease interval;
    v_dead bigint[];
    v_due bigint[];
    v_new bigint[];
    n bigint;
BEGIN
    PERFORM queen_eph_ensure(p_tenant, p_queue);
    SELECT * INTO q FROM queen_eph_queues WHERE tenant = p_tenant AND name = p_queue;
    v_tag := queen_eph_tag(p_tenant);
    v_lease := make_interval(secs => q.lease_s);
    PERFORM pg_advisory_xact_lock(queen_eph_key(p_tenant, p_queue), hashtext(p_grp));
    PERFORM queen_eph_expire(p_tenant, p_queue, q.ttl_s);
    -- the group's registration (partition ''): from its first pop on, the ring keeps every message
    -- for it until it has passed it (queen_eph_trim counts the groups that have a cursor row)
    INSERT INTO queen_eph_cursors (tenant, queue, grp, partition, last_seq) VALUES (p_tenant, p_queue, p_grp, '', 0)
    ON CONFLICT DO NOTHING;

    -- leases run out: beyond the retry limit (or on a message no longer in the ring) they end here
    WITH dead AS (
        DELETE FROM queen_eph_inflight i
        WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = p_grp AND i.lease_until <= now()
          AND (i.attempts > q.retry_limit
               OR NOT EXISTS (SELECT 1 FROM queen_eph_messages m
                              WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = i.seq))
        RETURNING i.seq, i.attempts > q.retry_limit AS over
    )
    SELECT array_agg(d.seq) FILTER (WHERE d.over), count(*) FILTER (WHERE d.over) INTO v_dead, n FROM dead d;
    IF n > 0 THEN
        PERFORM queen_eph_count(p_tenant, p_queue, 0, 0, 0, 0, n);
    END IF;

    -- redeliveries: the group's leases that ran out, oldest message first
    v_due := ARRAY(
        SELECT i.seq FROM queen_eph_inflight i
        WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = p_grp AND i.lease_until <= now()
          AND (p_partition IS NULL OR i.partition = p_partition)
        ORDER BY i.seq LIMIT p_batch
        FOR UPDATE);
    RETURN QUERY
    SELECT m.seq, m.partition, m.payload, i.attempts + 1, i.last_error, v_tag, q.window_ms, q.window_count,
           NULL::integer
    FROM queen_eph_inflight i
    JOIN queen_eph_messages m ON m.tenant = p_tenant AND m.queue = p_queue AND m.seq = i.seq
    WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = p_grp AND i.seq = ANY (v_due)
    ORDER BY m.seq;
    IF p_auto_ack THEN  -- committed at delivery: this redelivery is the last
        DELETE FROM queen_eph_inflight i
        WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = p_grp AND i.seq = ANY (v_due);
    ELSE
        UPDATE queen_eph_inflight i SET attempts = i.attempts + 1, lease_until = now() + v_lease, last_error = NULL
        WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = p_grp AND i.seq = ANY (v_due);
    END IF;

    -- then messages past the group's cursor, in seq order (FIFO per partition)
    v_new := ARRAY(
        SELECT m.seq FROM queen_eph_messages m
        LEFT JOIN queen_eph_cursors c
          ON c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_grp AND c.partition = m.partition
        WHERE m.tenant = p_tenant AND m.queue = p_queue
          AND (p_partition IS NULL OR m.partition = p_partition)
          AND m.seq > coalesce(c.last_seq, 0)
        ORDER BY m.seq LIMIT p_batch - cardinality(v_due));
    IF cardinality(v_new) > 0 THEN
        INSERT INTO queen_eph_cursors AS c (tenant, queue, grp, partition, last_seq)
        SELECT p_tenant, p_queue, p_grp, m.partition, max(m.seq) FROM queen_eph_messages m
        WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = ANY (v_new)
        GROUP BY m.partition
        ON CONFLICT (tenant, queue, grp, partition) DO UPDATE SET last_seq = greatest(c.last_seq, excluded.last_seq);
        IF NOT p_auto_ack THEN
            INSERT INTO queen_eph_inflight (tenant, queue, grp, seq, partition, attempts, lease_until)
            SELECT p_tenant, p_queue, p_grp, m.seq, m.partition, 1, now() + v_lease FROM queen_eph_messages m
            WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = ANY (v_new);
        END IF;
        RETURN QUERY
        SELECT m.seq, m.partition, m.payload, 1, NULL::text, v_tag, q.window_ms, q.window_count, NULL::integer
        FROM queen_eph_messages m
        WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = ANY (v_new)
        ORDER BY m.seq;
    END IF;

    IF p_auto_ack THEN
        PERFORM queen_eph_trim(p_tenant, p_queue, coalesce(v_dead, '{}') || v_due || v_new);
    ELSE
        PERFORM queen_eph_trim(p_tenant, p_queue, v_dead);
    END IF;
    IF cardinality(v_due) + cardinality(v_new) = 0 THEN
        -- nothing to hand out: one row without a message, saying when the group's first lease runs out
        -- (a waiting pop sleeps until then at most: a redelivery sends no NOTIFY)
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::integer, NULL::text, v_tag, q.window_ms, q.window_count,
               (SELECT ceil(greatest(extract(epoch FROM min(i.lease_until) - now()), 0) * 1000)::integer
                FROM queen_eph_inflight i
                WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = p_grp
                  AND (p_partition IS NULL OR i.partition = p_partition));
    END IF;
END
$$;

-- Settle acknowledgements of one group, one result per item in order: 'stale' (minted by another
-- incarnation of the contents), 'unknown' (no lease of this delivery: acked already, redelivered to
-- someone else, reset, or never ours), 'acked' (completed; or failed/retry on the last attempt the
-- retry limit allows: dropped and counted under drops.retry), 'redelivered' (failed/retry with
-- attempts left: due to the group at once, attempts + 1). A late ack of a delivery whose lease ran out
-- but that nobody took yet still settles it.
CREATE OR REPLACE FUNCTION queen_eph_ack(p_tenant text, p_queue text, p_grp text, p_tags text[],
                                         p_seqs bigint[], p_attempts integer[], p_statuses text[],
                                         p_errors text[])
RETURNS TABLE (idx integer, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    v_tag text;
    v_attempts integer;
    v_dropped bigint := 0;
    v_redelivered boolean := false;
    v_queue boolean;
    v_settled bigint[] := '{}';
BEGIN
    SELECT * INTO q FROM queen_eph_queues WHERE tenant = p_tenant AND name = p_queue;
    v_queue := FOUND;
    SELECT i.tag INTO v_tag FROM queen_eph_incarnation i WHERE i.tenant = p_tenant;
    FOR k IN 1 .. coalesce(array_length(p_seqs, 1), 0) LOOP
        idx := k - 1;
        IF v_tag IS NULL OR p_tags[k] IS DISTINCT FROM v_tag THEN
            outcome := 'stale';
        ELSE
            SELECT f.attempts INTO v_attempts FROM queen_eph_inflight f
            WHERE f.tenant = p_tenant AND f.queue = p_queue AND f.grp = p_grp AND f.seq = p_seqs[k]
              AND f.attempts = p_attempts[k]
            FOR UPDATE;
            IF NOT FOUND OR NOT v_queue THEN
                outcome := 'unknown';
            ELSIF p_statuses[k] = 'completed' OR v_attempts > q.retry_limit THEN
                DELETE FROM queen_eph_inflight f
                WHERE f.tenant = p_tenant AND f.queue = p_queue AND f.grp = p_grp AND f.seq = p_seqs[k];
                IF p_statuses[k] <> 'completed' THEN
                    v_dropped := v_dropped + 1;
                END IF;
                v_settled := v_settled || p_seqs[k];
                outcome := 'acked';
            ELSE
                UPDATE queen_eph_inflight f SET lease_until = now(), last_error = p_errors[k]
                WHERE f.tenant = p_tenant AND f.queue = p_queue AND f.grp = p_grp AND f.seq = p_seqs[k];
                v_redelivered := true;
                outcome := 'redelivered';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF v_queue THEN
        IF v_dropped > 0 THEN
            PERFORM queen_eph_count(p_tenant, p_queue, 0, 0, 0, 0, v_dropped);
        END IF;
        PERFORM queen_eph_trim(p_tenant, p_queue, v_settled);
    END IF;
    IF v_redelivered THEN
        PERFORM pg_notify('queen_ephemeral', p_tenant || E'\t' || p_queue);
    END IF;
END
$$;

-- Drop every message, void every lease, rewind every cursor; the declaration stays. Answers how many
-- messages were dropped (0 for a queue that does not exist).
CREATE OR REPLACE FUNCTION queen_eph_reset(p_tenant text, p_queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(queen_eph_key(p_tenant, p_queue), 0);
    WITH gone AS (DELETE FROM queen_eph_messages m WHERE m.tenant = p_tenant AND m.queue = p_queue RETURNING 1)
    SELECT count(*) INTO n FROM gone;
    DELETE FROM queen_eph_inflight i WHERE i.tenant = p_tenant AND i.queue = p_queue;
    DELETE FROM queen_eph_cursors c WHERE c.tenant = p_tenant AND c.queue = p_queue;
    UPDATE queen_eph_stats s SET depth = 0, bytes = 0 WHERE s.tenant = p_tenant AND s.queue = p_queue;
    RETURN n;
END
$$;

-- Delete the queue: contents, counters and declaration. True when there was a queue.
CREATE OR REPLACE FUNCTION queen_eph_delete(p_tenant text, p_queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found_q boolean;
BEGIN
    PERFORM queen_eph_reset(p_tenant, p_queue);
    DELETE FROM queen_eph_stats s WHERE s.tenant = p_tenant AND s.queue = p_queue;
    DELETE FROM queen_eph_queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    found_q := FOUND;
    RETURN found_q;
END
$$;

-- One queue's summary (its expired messages dropped first).
CREATE OR REPLACE FUNCTION queen_eph_summary(q record) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s record;
BEGIN
    PERFORM queen_eph_expire(q.tenant, q.name, q.ttl_s);
    SELECT * INTO s FROM queen_eph_stats WHERE tenant = q.tenant AND queue = q.name;  -- nulls when none
    RETURN jsonb_build_object(
        'queue', q.name,
        'tier', CASE WHEN q.declared THEN 'declared' ELSE 'implicit' END,
        'depth', coalesce(s.depth, 0),
        'bytes', coalesce(s.bytes, 0),
        'partitions', (SELECT count(DISTINCT m.partition) FROM queen_eph_messages m
                       WHERE m.tenant = q.tenant AND m.queue = q.name),
        'groups', (SELECT count(DISTINCT c.grp) FROM queen_eph_cursors c
                   WHERE c.tenant = q.tenant AND c.queue = q.name),
        'inFlight', (SELECT count(*) FROM queen_eph_inflight i WHERE i.tenant = q.tenant AND i.queue = q.name),
        'drops', jsonb_build_object('bounds', coalesce(s.dropped_bounds, 0), 'ttl', coalesce(s.dropped_ttl, 0),
                                    'retry', coalesce(s.dropped_retry, 0)),
        'options', queen_eph_options(q),
        'createdAt', to_char(q.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
END
$$;

-- Every queue of a tenant, by name.
CREATE OR REPLACE FUNCTION queen_eph_list(p_tenant text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    out jsonb := '[]'::jsonb;
BEGIN
    FOR q IN SELECT * FROM queen_eph_queues WHERE tenant = p_tenant ORDER BY name LOOP
        out := out || jsonb_build_array(queen_eph_summary(q));
    END LOOP;
    RETURN jsonb_build_object('queues', out, 'count', jsonb_array_length(out));
END
$$;

-- One queue's depth: the summary plus each partition's messages and bytes and each group's pending
-- (not yet delivered to it) and in-flight (leased) counts. NULL when the queue does not exist.
CREATE OR REPLACE FUNCTION queen_eph_depth(p_tenant text, p_queue text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    q record;
BEGIN
    SELECT * INTO q FROM queen_eph_queues WHERE tenant = p_tenant AND name = p_queue;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM queen_eph_expire(p_tenant, p_queue, q.ttl_s);  -- before the counts below take their snapshot
    RETURN queen_eph_summary(q) || jsonb_build_object(
        'pending', (SELECT count(*) FROM queen_eph_messages m WHERE m.tenant = p_tenant AND m.queue = p_queue),
        'partitionsPending', (SELECT count(DISTINCT m.partition) FROM queen_eph_messages m
                              WHERE m.tenant = p_tenant AND m.queue = p_queue),
        'partitionDetails', coalesce((
            SELECT jsonb_agg(jsonb_build_object('partition', x.partition, 'pending', x.n, 'bytes', x.b)
                             ORDER BY x.partition)
            FROM (SELECT m.partition, count(*) AS n, sum(m.bytes) AS b FROM queen_eph_messages m
                  WHERE m.tenant = p_tenant AND m.queue = p_queue GROUP BY m.partition) x), '[]'::jsonb),
        'groupDetails', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'group', g.grp,
                       'pending', (SELECT count(*) FROM queen_eph_messages m
                                   LEFT JOIN queen_eph_cursors c
                                     ON c.tenant = p_tenant AND c.queue = p_queue AND c.grp = g.grp
                                    AND c.partition = m.partition
                                   WHERE m.tenant = p_tenant AND m.queue = p_queue
                                     AND m.seq > coalesce(c.last_seq, 0)),
                       'inFlight', (SELECT count(*) FROM queen_eph_inflight i
                                    WHERE i.tenant = p_tenant AND i.queue = p_queue AND i.grp = g.grp))
                   ORDER BY g.grp)
            FROM (SELECT DISTINCT c.grp FROM queen_eph_cursors c
                  WHERE c.tenant = p_tenant AND c.queue = p_queue) g), '[]'::jsonb));
END
$$;
