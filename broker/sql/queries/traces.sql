-- Traces (broker/sql/migrations/0007_traces.sql): record one, read per message, per name, list the names.

-- name: trace_record
-- $1 tenant, $2 id, $3 partition id, $4 txn, $5 group, $6 event type, $7 names, $8 data, $9 sub.
-- Nothing is written (no row back) when the message does not exist for this tenant.
WITH t AS (
    INSERT INTO queen_traces (tenant, id, partition_id, txn, consumer_group, event_type, trace_names, data, sub)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
    WHERE EXISTS (SELECT 1 FROM queen_messages m WHERE m.tenant = $1 AND m.partition_id = $3 AND m.txn = $4)
    RETURNING id, created_at
), n AS (
    INSERT INTO queen_trace_names (tenant, name, created_at, trace_id)
    SELECT DISTINCT $1, u.name, t.created_at, t.id FROM t, unnest($7::text[]) AS u(name)
)
SELECT id, created_at FROM t;

-- name: trace_for_message
SELECT t.id, t.partition_id, t.txn, t.consumer_group, t.event_type, t.trace_names, t.data, t.sub, t.created_at
FROM queen_traces t
WHERE t.tenant = $1 AND t.partition_id = $2 AND t.txn = $3
ORDER BY t.created_at, t.id
LIMIT 1000;

-- name: trace_by_name
-- Newest first; $3 from, $4 to (NULL = open), $5 limit, $6 offset.
SELECT t.id, t.partition_id, t.txn, t.consumer_group, t.event_type, t.trace_names, t.data, t.sub, t.created_at
FROM queen_trace_names n
JOIN queen_traces t ON t.tenant = n.tenant AND t.id = n.trace_id
WHERE n.tenant = $1 AND n.name = $2
  AND ($3::timestamptz IS NULL OR n.created_at >= $3) AND ($4::timestamptz IS NULL OR n.created_at <= $4)
ORDER BY n.created_at DESC, n.trace_id DESC
LIMIT $5 OFFSET $6;

-- name: trace_names
-- Names with their trace count and latest use; $2 = a prefix to search for (NULL = all), $3 limit.
SELECT n.name, count(*) AS traces, max(n.created_at) AS last_seen_at
FROM queen_trace_names n
WHERE n.tenant = $1 AND ($2::text IS NULL OR n.name LIKE $2 || '%')
GROUP BY n.name
ORDER BY n.name
LIMIT $3;
