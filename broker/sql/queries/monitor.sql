-- Monitoring reads of the official client's admin API (overview, namespaces, tasks, partitions, depth,
-- status, analytics, list_messages). Counts come from partition arithmetic (next_seq - 1 - floor), the
-- meter's gauges and small per-tenant tables: never a count(*) over the message log.

-- name: mon_overview
SELECT (SELECT count(*) FROM queen_queues q WHERE q.tenant = $1) AS queues,
       (SELECT count(*) FROM queen_partitions p WHERE p.tenant = $1) AS partitions,
       (SELECT coalesce(sum(p.next_seq - 1 - coalesce(f.floor_seq, 0)), 0)::bigint FROM queen_partitions p
        LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id WHERE p.tenant = $1) AS messages,
       (SELECT count(DISTINCT g.consumer_group) FROM queen_groups g WHERE g.tenant = $1) AS consumer_groups,
       (SELECT count(DISTINCT q.namespace) FROM queen_queues q WHERE q.tenant = $1) AS namespaces,
       (SELECT count(DISTINCT q.task) FROM queen_queues q WHERE q.tenant = $1) AS tasks,
       (SELECT count(*) FROM queen_dlq d WHERE d.tenant = $1) AS dead_letters,
       (SELECT coalesce(sum(g.timers_pending), 0)::bigint FROM queen_usage_gauges g WHERE g.tenant = $1) AS timers_pending,
       now() AS db_now;

-- name: mon_by_label
-- Queues grouped by namespace ($2 = 'namespace') or by task ($2 = 'task'); queues without one are left out.
SELECT lbl AS label, count(*) AS queues, sum(parts)::bigint AS partitions, sum(msgs)::bigint AS messages,
       array_agg(name ORDER BY name) AS queue_names
FROM (
    SELECT q.name, CASE WHEN $2 = 'task' THEN q.task ELSE q.namespace END AS lbl,
           (SELECT count(*) FROM queen_partitions p WHERE p.tenant = q.tenant AND p.queue = q.name) AS parts,
           (SELECT coalesce(sum(p.next_seq - 1 - coalesce(f.floor_seq, 0)), 0) FROM queen_partitions p
            LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
            WHERE p.tenant = q.tenant AND p.queue = q.name) AS msgs
    FROM queen_queues q WHERE q.tenant = $1
) x
WHERE lbl IS NOT NULL
GROUP BY lbl ORDER BY lbl;

-- name: mon_partitions
SELECT p.id, p.queue, p.name, p.next_seq - 1 AS last_offset, coalesce(f.floor_seq, 0) + 1 AS log_start,
       p.next_seq - 1 - coalesce(f.floor_seq, 0) AS messages, p.created_at, p.last_push_at
FROM queen_partitions p
LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
WHERE p.tenant = $1 AND ($2::text IS NULL OR p.queue = $2)
ORDER BY p.queue, p.name
LIMIT $3 OFFSET $4;

-- name: mon_depth
-- Per partition of queue $2: pending for group $3, or (NULL) behind the worst cursor of any group (a
-- partition no group has a cursor on counts every message above the floor).
SELECT p.name, p.id,
       greatest(p.next_seq - 1 - greatest(coalesce(f.floor_seq, 0), coalesce(
           (SELECT CASE WHEN $3::text IS NULL THEN min(c.acked_seq) ELSE max(c.acked_seq) END
            FROM queen_cursors c
            WHERE c.tenant = p.tenant AND c.partition_id = p.id AND ($3::text IS NULL OR c.consumer_group = $3)),
           0)), 0)::bigint AS pending
FROM queen_partitions p
LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
WHERE p.tenant = $1 AND p.queue = $2
ORDER BY p.name
LIMIT 10000;

-- name: mon_queue_status
-- Per queue ($2 one queue or NULL for all, $3 limit, $4 offset): partitions, messages, pending behind the
-- worst cursor, consumer groups, dead letters.
SELECT q.name, q.namespace, q.task, q.created_at,
       (SELECT count(*) FROM queen_partitions p WHERE p.tenant = q.tenant AND p.queue = q.name) AS partitions,
       (SELECT coalesce(sum(p.next_seq - 1 - coalesce(f.floor_seq, 0)), 0)::bigint FROM queen_partitions p
        LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
        WHERE p.tenant = q.tenant AND p.queue = q.name) AS messages,
       (SELECT coalesce(sum(greatest(p.next_seq - 1 - greatest(coalesce(f.floor_seq, 0), coalesce(
                   (SELECT min(c.acked_seq) FROM queen_cursors c
                    WHERE c.tenant = p.tenant AND c.partition_id = p.id), 0)), 0)), 0)::bigint
        FROM queen_partitions p LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
        WHERE p.tenant = q.tenant AND p.queue = q.name) AS pending,
       (SELECT count(*) FROM queen_groups g WHERE g.tenant = q.tenant AND g.queue = q.name) AS consumer_groups,
       (SELECT count(*) FROM queen_dlq d WHERE d.tenant = q.tenant AND d.queue = q.name) AS dead_letters,
       (SELECT max(p.last_push_at) FROM queen_partitions p WHERE p.tenant = q.tenant AND p.queue = q.name) AS last_push_at
FROM queen_queues q
WHERE q.tenant = $1 AND ($2::text IS NULL OR q.name = $2)
ORDER BY q.name
LIMIT $3 OFFSET $4;

-- name: mon_usage_history
-- The meter's periods of one tenant between $2 and $3 (NULL = open), newest first.
SELECT u.period_start, sum(u.messages)::bigint AS messages, sum(u.kv_ops)::bigint AS kv_ops
FROM queen_usage u
WHERE u.tenant = $1 AND ($2::timestamptz IS NULL OR u.period_start >= $2)
  AND ($3::timestamptz IS NULL OR u.period_start <= $3)
GROUP BY u.period_start
ORDER BY u.period_start DESC
LIMIT 1000;

-- name: mon_db_stats
SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()) AS connections,
       pg_database_size(current_database()) AS size_bytes, now() AS db_now;

-- name: mon_messages
-- The newest messages of queue $2 (partition $3 or every partition) with their state for group $5:
-- deleted (a tombstone, docs/decisions.md §9), completed (at or below the group's cursor, or acked out
-- of order), leased (inside a live lease) or pending; $7 keeps one state. Each partition contributes its newest $4 + $6 through the primary key
-- (so a state filter looks at that window), merged newest first; $4 limit, $6 offset.
SELECT * FROM (
    SELECT p.name AS partition, p.id AS partition_id, m.seq, m.id, m.txn, m.trace_id, m.payload, m.codec,
           m.key_id, m.producer_sub, m.created_at, m.deadline_at, m.deleted_at,
           CASE WHEN m.deleted_at IS NOT NULL THEN 'deleted'
                WHEN m.seq <= coalesce(c.acked_seq, 0) OR s.acked THEN 'completed'
                WHEN c.lease_until > now() AND m.seq <= c.lease_end_seq THEN 'leased'
                ELSE 'pending' END AS status,
           coalesce(s.failures, 0) AS failures
    FROM queen_partitions p
    LEFT JOIN queen_cursors c ON c.tenant = p.tenant AND c.partition_id = p.id AND c.consumer_group = $5
    CROSS JOIN LATERAL (
        SELECT mm.* FROM queen_messages mm
        WHERE mm.tenant = p.tenant AND mm.partition_id = p.id
        ORDER BY mm.seq DESC LIMIT $4::integer + $6::integer
    ) m
    LEFT JOIN queen_msg_state s ON s.tenant = p.tenant AND s.partition_id = p.id AND s.consumer_group = $5
                                AND s.seq = m.seq
    WHERE p.tenant = $1 AND p.queue = $2 AND ($3::text IS NULL OR p.name = $3)
) x
WHERE $7::text IS NULL OR x.status = $7
ORDER BY x.created_at DESC, x.seq DESC
LIMIT $4::integer OFFSET $6::integer;

-- name: mon_group_conflation
-- A consumer group's stored delivery policy (queen_groups.conflation); no row when it never popped.
SELECT g.conflation FROM queen_groups g WHERE g.tenant = $1 AND g.queue = $2 AND g.consumer_group = $3;
