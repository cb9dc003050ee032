-- The same message acknowledged twice in one batch must not make the side-table upsert touch one row
-- twice (an error): the done offsets are de-duplicated. Supersedes queen_cursor_advance of 0010.

CREATE OR REPLACE FUNCTION queen_cursor_advance(p_tenant text, p_pid uuid, p_group text, p_done bigint[] DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_acked    bigint;
    v_end      bigint;
    v_released boolean;
BEGIN
    SELECT c.acked_seq INTO v_acked FROM queen_cursors c
    WHERE c.tenant = p_tenant AND c.partition_id = p_pid AND c.consumer_group = p_group;
    SELECT max(r.seq) INTO v_end
    FROM (SELECT x.seq, row_number() OVER (ORDER BY x.seq) AS rn
          FROM (SELECT s.seq FROM queen_msg_state s
                WHERE s.tenant = p_tenant AND s.partition_id = p_pid AND s.consumer_group = p_group
                  AND s.acked AND s.seq > v_acked
                UNION
                SELECT d FROM unnest(p_done) AS d WHERE d > v_acked) x) r
    WHERE r.seq - v_acked = r.rn;
    IF v_end IS NOT NULL THEN
        DELETE FROM queen_msg_state s
        WHERE s.tenant = p_tenant AND s.partition_id = p_pid AND s.consumer_group = p_group AND s.seq <= v_end;
        v_acked := v_end;
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
