-- Streams: query registration, the cycle (state + sink pushes + source ack in one transaction) and
-- state reads. Tables: broker/sql/migrations/0015_streams.sql. The cycle reuses the log's functions
-- (queen_ack, queen_push_edge from log.sql) so a stream's ack and its sink pushes obey exactly the
-- rules of the log's own routes. Re-applied at boot like every function file: CREATE OR REPLACE only.
--
-- Refusals a caller must see as an HTTP error are raised with our own SQLSTATEs, which the domain
-- (broker/streams/) maps to the envelope; nothing of the statement is kept:
--   QS404  the query does not exist for this tenant

-- Register (or find) a query by name. Outcomes:
--   'ok'        query_id; fresh = the row was created now; did_reset = the stored chain differed,
--               p_reset asked to drop it: its state is deleted and the new hash adopted
--   'mismatch'  the stored config_hash differs and p_reset is false: nothing changed
-- Source and sink queue names follow the latest registration.
CREATE OR REPLACE FUNCTION queen_streams_register(
    p_tenant text, p_name text, p_source text, p_sink text, p_hash text, p_reset boolean
) RETURNS TABLE (outcome text, query_id uuid, fresh boolean, did_reset boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id   uuid;
    v_hash text;
    v_new  integer;
BEGIN
    INSERT INTO queen_stream_queries (tenant, id, name, source_queue, sink_queue, config_hash)
    VALUES (p_tenant, gen_random_uuid(), p_name, p_source, p_sink, p_hash)
    ON CONFLICT (tenant, name) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    SELECT q.id, q.config_hash INTO v_id, v_hash FROM queen_stream_queries q
    WHERE q.tenant = p_tenant AND q.name = p_name
    FOR UPDATE;
    IF v_new > 0 THEN
        RETURN QUERY SELECT 'ok'::text, v_id, true, false;
        RETURN;
    END IF;
    IF v_hash <> p_hash AND NOT p_reset THEN
        RETURN QUERY SELECT 'mismatch'::text, v_id, false, false;
        RETURN;
    END IF;
    IF v_hash <> p_hash THEN
        DELETE FROM queen_stream_state s WHERE s.tenant = p_tenant AND s.query_id = v_id;
    END IF;
    UPDATE queen_stream_queries q
    SET source_queue = p_source, sink_queue = p_sink, config_hash = p_hash, updated_at = now()
    WHERE q.tenant = p_tenant AND q.id = v_id;
    RETURN QUERY SELECT 'ok'::text, v_id, false, v_hash <> p_hash;
END
$$;

-- Rows of one (query, partition). Filters combine with AND: p_keys (empty = every key), p_prefix
-- (NULL or '' = none; an index range), p_ripe (NULL = none): only rows whose value carries a numeric
-- windowEnd (epoch ms, what the SDK's window operators store) at or before it. Raises QS404 for a
-- query this tenant does not have.
CREATE OR REPLACE FUNCTION queen_streams_state_get(
    p_tenant text, p_query uuid, p_pid uuid, p_keys text[], p_prefix text, p_ripe bigint
) RETURNS TABLE (key text, value jsonb, updated_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_upper text := CASE WHEN coalesce(p_prefix, '') = '' THEN NULL ELSE queen_kv_prefix_upper(p_prefix) END;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen_stream_queries q WHERE q.tenant = p_tenant AND q.id = p_query) THEN
        RAISE EXCEPTION 'no such stream query' USING ERRCODE = 'QS404';
    END IF;
    RETURN QUERY
    SELECT s.key::text, s.value, s.updated_at FROM queen_stream_state s
    WHERE s.tenant = p_tenant AND s.query_id = p_query AND s.partition_id = p_pid
      AND (cardinality(p_keys) = 0 OR s.key = ANY (p_keys))
      AND (coalesce(p_prefix, '') = '' OR (s.key >= p_prefix AND (v_upper IS NULL OR s.key < v_upper)))
      AND (p_ripe IS NULL OR (jsonb_typeof(s.value -> 'windowEnd') = 'number'
                              AND (s.value ->> 'windowEnd')::numeric <= p_ripe))
    ORDER BY s.key;
END
$$;

-- The one row of a refused cycle: kind 'refused', status = the reason, detail = the prose.
CREATE OR REPLACE FUNCTION queen_streams_refused(p_reason text, p_detail text)
RETURNS TABLE (kind text, idx integer, status text, message_id uuid, partition_id uuid, seq bigint, detail text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'refused'::text, NULL::integer, p_reason, NULL::uuid, NULL::uuid, NULL::bigint, p_detail
$$;

-- One step of a stream operator, all or nothing (the statement is its own transaction, or runs in the
-- caller's): acknowledge the source batch, apply the state ops, push the sink items. Steps of one
-- (query, partition) are serialised by a transaction-scoped advisory lock.
--
-- The ack (p_ack_txn not NULL) covers the first p_ack_count messages of the lease p_ack_lease holds on
-- partition p_pid for group p_group that are not done yet, and must include the message p_ack_txn.
-- "First" in the order the official client processes a popped batch: createdAt as delivered
-- (milliseconds), then id; ids minted by one worker in one millisecond count up (broker/ids.py), so it
-- is offset order but for pushes from two workers in one millisecond, and either way the messages
-- acked are exactly the ones the client processed. It is judged like the log's ack (queen_ack, which
-- then settles it):
--   * the message p_ack_txn is already done for the group -> this step was committed before (a client
--     retry after a lost answer): nothing is applied, one row of kind 'duplicate';
--   * the group's cursor on the partition does not hold that lease -> 'refused' / lease_invalid;
--   * unknown message, not covered by the lease, fewer undone messages than p_ack_count, or p_ack_txn
--     not among them -> 'refused' / ack_refused.
-- A refusal writes nothing. With p_release the lease is released even when messages stay under it
-- (they are delivered again at once, without counting a failure). Without it (the SDK's gate, which
-- defers the tail of a batch) the partition stays held until the lease ends and the lease stops
-- covering the tail, which is then delivered again without counting a failure (acking everything
-- under a lease always releases it).
-- State ops: (key, JSON text or NULL = delete), applied in order (the last op on a key wins).
-- Sink pushes: queen_push_edge's arrays (encryption check, push, metering; SQLSTATE QN001 when a queue
-- switched to encryption under the caller's cached view: everything is rolled back).
-- Rows out: 'refused' (status = reason, detail = prose) | 'duplicate' | 'ack' (idx = messages acked) |
-- 'state' (idx = ops applied) | 'push' (queen_push_edge's row per item).
CREATE OR REPLACE FUNCTION queen_streams_cycle(
    p_tenant text, p_query uuid, p_pid uuid, p_group text,
    p_op_keys text[], p_op_values text[],
    p_ack_txn text, p_ack_lease uuid, p_ack_count integer, p_release boolean,
    p_period_s integer, p_plain text[], p_queues text[], p_partitions text[], p_ids uuid[], p_txns text[],
    p_traces uuid[], p_payloads bytea[], p_codecs smallint[], p_key_ids text[], p_subs text[],
    p_deadline_ms bigint[]
) RETURNS TABLE (kind text, idx integer, status text, message_id uuid, partition_id uuid, seq bigint, detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_seq   bigint;
    v_cur   record;
    v_txns  text[];
    v_has   boolean;
    v_bad   text;
    v_n     integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen_stream_queries q WHERE q.tenant = p_tenant AND q.id = p_query) THEN
        RAISE EXCEPTION 'no such stream query' USING ERRCODE = 'QS404';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || E'\t' || p_query::text || E'\t' || p_pid::text, 0));

    IF p_ack_txn IS NOT NULL THEN
        SELECT m.seq INTO v_seq FROM queen_messages m
        WHERE m.tenant = p_tenant AND m.partition_id = p_pid AND m.txn = p_ack_txn;
        IF v_seq IS NULL THEN
            RETURN QUERY SELECT * FROM queen_streams_refused('ack_refused', 'Message not found');
            RETURN;
        END IF;
        SELECT c.acked_seq, c.lease_id, c.lease_end_seq INTO v_cur FROM queen_cursors c
        WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group
        FOR UPDATE;
        IF NOT FOUND THEN
            RETURN QUERY SELECT * FROM queen_streams_refused('lease_invalid', 'Invalid or expired lease');
            RETURN;
        END IF;
        IF v_seq <= v_cur.acked_seq OR EXISTS (
            SELECT 1 FROM queen_msg_state st
            WHERE st.tenant = p_tenant AND st.partition_id = p_pid AND st.consumer_group = p_group
              AND st.seq = v_seq AND st.acked) THEN
            RETURN QUERY SELECT 'duplicate'::text, 0, NULL::text, NULL::uuid, NULL::uuid, NULL::bigint, NULL::text;
            RETURN;
        END IF;
        IF v_cur.lease_id IS DISTINCT FROM p_ack_lease THEN
            RETURN QUERY SELECT * FROM queen_streams_refused('lease_invalid', 'Invalid or expired lease');
            RETURN;
        END IF;
        IF v_seq > v_cur.lease_end_seq THEN
            RETURN QUERY SELECT * FROM queen_streams_refused('ack_refused',
                'the message is not covered by this lease');
            RETURN;
        END IF;
        SELECT array_agg(x.txn ORDER BY x.seq), bool_or(x.txn = p_ack_txn) INTO v_txns, v_has
        FROM (SELECT m.seq, m.txn FROM queen_messages m
              LEFT JOIN queen_msg_state st ON st.tenant = p_tenant AND st.partition_id = p_pid
                                          AND st.consumer_group = p_group AND st.seq = m.seq
              WHERE m.tenant = p_tenant AND m.partition_id = p_pid
                AND m.seq > v_cur.acked_seq AND m.seq <= v_cur.lease_end_seq AND st.acked IS NOT TRUE
              ORDER BY date_trunc('milliseconds', m.created_at), m.id::text
              LIMIT p_ack_count) x;
        IF coalesce(cardinality(v_txns), 0) < p_ack_count THEN
            RETURN QUERY SELECT * FROM queen_streams_refused('ack_refused', format(
                'count %s exceeds the %s undone messages under this lease', p_ack_count,
                coalesce(cardinality(v_txns), 0)));
            RETURN;
        END IF;
        IF NOT v_has THEN
            RETURN QUERY SELECT * FROM queen_streams_refused('ack_refused',
                'transactionId is not among the first count undone messages of the lease');
            RETURN;
        END IF;
        SELECT min(a.error) INTO v_bad
        FROM queen_ack(p_tenant, array_fill(p_pid, ARRAY[p_ack_count]), v_txns,
                       array_fill('completed'::text, ARRAY[p_ack_count]), array_fill(p_ack_lease, ARRAY[p_ack_count]),
                       array_fill(p_group, ARRAY[p_ack_count]), array_fill(NULL::text, ARRAY[p_ack_count])) a
        WHERE NOT a.success;
        IF v_bad IS NOT NULL THEN  -- judged above already; a disagreement must not commit half a step
            RAISE EXCEPTION 'the log refused the stream ack: %', v_bad USING ERRCODE = 'QS409';
        END IF;
        IF p_release THEN
            UPDATE queen_cursors c SET lease_id = NULL, lease_until = NULL, lease_end_seq = NULL
            WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group
              AND c.lease_id = p_ack_lease;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            IF v_n > 0 THEN
                PERFORM queen_wake(p_tenant, ARRAY[p.queue::text]) FROM queen_partitions p
                WHERE p.tenant = p_tenant AND p.id = p_pid;
            END IF;
        ELSE
            -- Keep holding the partition until the lease ends, but no longer cover the tail: when the
            -- lease runs out the tail is delivered again WITHOUT counting a failure (a gate that defers
            -- messages must not walk them to the DLQ).
            UPDATE queen_cursors c SET lease_end_seq = c.acked_seq
            WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group
              AND c.lease_id = p_ack_lease AND c.lease_end_seq > c.acked_seq;
        END IF;
        RETURN QUERY SELECT 'ack'::text, p_ack_count, 'completed'::text, NULL::uuid, p_pid, NULL::bigint, NULL::text;
    END IF;

    IF cardinality(p_op_keys) > 0 THEN
        WITH ops AS (
            SELECT DISTINCT ON (u.k) u.k, u.v
            FROM unnest(p_op_keys, p_op_values) WITH ORDINALITY AS u(k, v, ord)
            ORDER BY u.k, u.ord DESC
        ), gone AS (
            DELETE FROM queen_stream_state s USING ops
            WHERE ops.v IS NULL AND s.tenant = p_tenant AND s.query_id = p_query AND s.partition_id = p_pid
              AND s.key = ops.k
        )
        INSERT INTO queen_stream_state AS s (tenant, query_id, partition_id, key, value)
        SELECT p_tenant, p_query, p_pid, ops.k, ops.v::jsonb FROM ops WHERE ops.v IS NOT NULL
        ORDER BY ops.k
        ON CONFLICT (tenant, query_id, partition_id, key)
        DO UPDATE SET value = excluded.value, updated_at = now();
        RETURN QUERY SELECT 'state'::text, cardinality(p_op_keys), NULL::text, NULL::uuid, NULL::uuid,
            NULL::bigint, NULL::text;
    END IF;

    IF cardinality(p_queues) > 0 THEN
        RETURN QUERY SELECT 'push'::text, r.idx, r.status, r.message_id, r.partition_id, r.seq, NULL::text
        FROM queen_push_edge(p_tenant, p_period_s, p_plain, p_queues, p_partitions, p_ids, p_txns, p_traces,
                             p_payloads, p_codecs, p_key_ids, p_subs, p_deadline_ms) r;
    END IF;
END
$$;
