-- The HTTP push in ONE statement: the encryption check of queen_push_checked, queen_push, and the
-- metering of the messages queued (queen_meter, the function metering.record calls) all run in the
-- statement's own transaction. Before, a push was BEGIN, queen_push_checked, queen_meter, COMMIT: four
-- round trips where one does. Same rows as queen_push; SQLSTATE QN001 as queen_push_checked.
CREATE FUNCTION queen_push_edge(
    p_tenant text, p_period_s integer, p_plain text[], p_queues text[], p_partitions text[], p_ids uuid[],
    p_txns text[], p_traces uuid[], p_payloads bytea[], p_codecs smallint[], p_key_ids text[], p_subs text[],
    p_deadline_ms bigint[]
) RETURNS TABLE (idx integer, status text, message_id uuid, partition_id uuid, seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_queued bigint := 0;
BEGIN
    IF cardinality(p_plain) > 0 AND EXISTS (
        SELECT 1 FROM queen_queues q
        WHERE q.tenant = p_tenant AND q.name = ANY (p_plain) AND q.encryption_enabled) THEN
        RAISE EXCEPTION 'a destination queue encrypts at rest' USING ERRCODE = 'QN001';
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
