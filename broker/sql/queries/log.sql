-- Named queries of the message log (queues, push, pop, ack, leases, DLQ, lookups).

-- name: log_queue_flags
SELECT name, encryption_enabled FROM queen_queues WHERE tenant = $1 AND name = ANY ($2::text[]);

-- name: log_push
-- The parameters of these four calls are built by broker.log.calls (Push, Pop, Ack), in $n order.
SELECT idx, status, message_id, partition_id, seq
FROM queen_push_checked(p_tenant => $1, p_plain => $2, p_queues => $3, p_partitions => $4, p_ids => $5,
                        p_txns => $6, p_traces => $7, p_payloads => $8, p_codecs => $9, p_key_ids => $10,
                        p_subs => $11, p_deadline_ms => $12);

-- name: log_push_edge
-- log_push and, in the same statement, the metering of the queued messages ($13: the period in seconds).
SELECT idx, status, message_id, partition_id, seq
FROM queen_push_edge(p_tenant => $1, p_plain => $2, p_queues => $3, p_partitions => $4, p_ids => $5,
                     p_txns => $6, p_traces => $7, p_payloads => $8, p_codecs => $9, p_key_ids => $10,
                     p_subs => $11, p_deadline_ms => $12, p_period_s => $13);

-- name: log_pop
SELECT kind, partition_id, partition, seq, id, txn, trace_id, payload, codec, key_id, producer_sub,
       created_at, attempt, lease_id, lease_until, deadline_at
FROM queen_pop(p_tenant => $1, p_queue => $2, p_partition => $3, p_group => $4, p_batch => $5,
               p_max_partitions => $6, p_auto_ack => $7, p_sub_mode => $8, p_sub_from => $9,
               p_conflation => $10);

-- name: log_pop_many
-- Several pops in one statement (the pop coalescer, broker/log/service.py _pop_group): queen_pop_many runs
-- queen_pop once per job, each call seeing what the earlier ones claimed.
SELECT job, kind, partition_id, partition, seq, id, txn, trace_id, payload, codec, key_id, producer_sub,
       created_at, attempt, lease_id, lease_until, deadline_at
FROM queen_pop_many(p_tenant => $1, p_queues => $2::text[], p_parts => $3::text[], p_groups => $4::text[],
                    p_batches => $5::integer[], p_max_parts => $6::integer[], p_auto_acks => $7::boolean[],
                    p_sub_modes => $8::text[], p_sub_froms => $9::timestamptz[], p_conflations => $10::boolean[]);

-- name: log_ack
SELECT idx, success, error, dead_lettered
FROM queen_ack(p_tenant => $1, p_pids => $2, p_txns => $3, p_statuses => $4, p_leases => $5, p_groups => $6,
               p_errors => $7);

-- name: log_lease_extend
-- Only a live lease is renewed: one whose lease_until has passed is lost (another consumer may already
-- hold the partition's messages), so renewing it answers success:false, as the client documents.
UPDATE queen_cursors c
SET lease_until = greatest(c.lease_until, now() + $3 * interval '1 second')
WHERE c.tenant = $1 AND c.lease_id = $2 AND c.lease_until > now()
RETURNING c.lease_until;

-- name: log_leases_live
SELECT DISTINCT c.lease_id FROM queen_cursors c
WHERE c.tenant = $1 AND c.lease_id = ANY ($2::uuid[]);

-- name: log_configure
INSERT INTO queen_tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: log_configure_queue
INSERT INTO queen_queues AS q (tenant, name, namespace, task, lease_time_s, retry_limit, dlq_enabled,
                               encryption_enabled, options)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant, name) DO UPDATE
SET namespace = excluded.namespace, task = excluded.task, lease_time_s = excluded.lease_time_s,
    retry_limit = excluded.retry_limit, dlq_enabled = excluded.dlq_enabled,
    encryption_enabled = excluded.encryption_enabled, options = excluded.options, updated_at = now()
RETURNING name, namespace, task, lease_time_s, retry_limit, dlq_enabled, encryption_enabled, options,
          created_at, updated_at;

-- name: log_queue_list
SELECT q.name, q.namespace, q.task, q.lease_time_s, q.retry_limit, q.dlq_enabled, q.encryption_enabled,
       q.options, q.created_at, q.updated_at,
       (SELECT count(*) FROM queen_partitions p WHERE p.tenant = q.tenant AND p.queue = q.name) AS partitions,
       (SELECT coalesce(sum(p.next_seq - 1 - coalesce(f.floor_seq, 0)), 0)::bigint FROM queen_partitions p
        LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
        WHERE p.tenant = q.tenant AND p.queue = q.name) AS messages
FROM queen_queues q
WHERE q.tenant = $1 AND ($2::text IS NULL OR q.namespace = $2) AND ($3::text IS NULL OR q.task = $3)
ORDER BY q.name
LIMIT $4;

-- name: log_queue_get
SELECT q.name, q.namespace, q.task, q.lease_time_s, q.retry_limit, q.dlq_enabled, q.encryption_enabled,
       q.options, q.created_at, q.updated_at
FROM queen_queues q WHERE q.tenant = $1 AND q.name = $2;

-- name: log_queue_partitions
SELECT p.id, p.name, p.next_seq - 1 - coalesce(f.floor_seq, 0) AS messages, p.created_at, p.last_push_at
FROM queen_partitions p
LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
WHERE p.tenant = $1 AND p.queue = $2
ORDER BY p.name
LIMIT $3;

-- name: log_queue_groups
SELECT c.consumer_group,
       sum(greatest(p.next_seq - 1 - greatest(c.acked_seq, coalesce(f.floor_seq, 0)), 0))::bigint AS pending,
       count(*) FILTER (WHERE c.lease_until > now()) AS leased_partitions,
       -- the oldest message the group has not acked: per partition the first one past its ack point
       -- that was not acked out of order (one index probe per cursor), the earliest of them
       min((SELECT m.created_at FROM queen_messages m
            WHERE m.tenant = c.tenant AND m.partition_id = c.partition_id
              AND m.seq > greatest(c.acked_seq, coalesce(f.floor_seq, 0))
              AND NOT EXISTS (SELECT 1 FROM queen_msg_state s
                              WHERE s.tenant = c.tenant AND s.partition_id = c.partition_id
                                AND s.consumer_group = c.consumer_group AND s.seq = m.seq AND s.acked)
            ORDER BY m.seq LIMIT 1)) AS oldest_unacked_at
FROM queen_cursors c JOIN queen_partitions p ON p.tenant = c.tenant AND p.id = c.partition_id
LEFT JOIN queen_log_floor f ON f.tenant = c.tenant AND f.partition_id = c.partition_id
WHERE c.tenant = $1 AND c.queue = $2
GROUP BY c.consumer_group ORDER BY c.consumer_group;

-- name: log_queue_delete
WITH parts AS (
    SELECT p.id FROM queen_partitions p WHERE p.tenant = $1 AND p.queue = $2
), m AS (
    DELETE FROM queen_messages x USING parts WHERE x.tenant = $1 AND x.partition_id = parts.id
), s AS (
    DELETE FROM queen_msg_state x USING parts WHERE x.tenant = $1 AND x.partition_id = parts.id
), fl AS (
    DELETE FROM queen_log_floor x USING parts WHERE x.tenant = $1 AND x.partition_id = parts.id
), c AS (
    DELETE FROM queen_cursors x WHERE x.tenant = $1 AND x.queue = $2
), g AS (
    DELETE FROM queen_groups x WHERE x.tenant = $1 AND x.queue = $2
), d AS (
    DELETE FROM queen_dlq x WHERE x.tenant = $1 AND x.queue = $2
), p AS (
    DELETE FROM queen_partitions x WHERE x.tenant = $1 AND x.queue = $2
)
DELETE FROM queen_queues q WHERE q.tenant = $1 AND q.name = $2 RETURNING q.name;

-- name: log_dlq_list
SELECT d.id, d.queue, d.partition_id, d.partition, d.consumer_group, d.synthetic, d.message_id, d.txn,
       d.trace_id, d.payload, d.codec, d.key_id, d.producer_sub, d.error, d.retry_count,
       d.original_created_at, d.created_at, count(*) OVER () AS total
FROM queen_dlq d
WHERE d.tenant = $1 AND ($2::text IS NULL OR d.queue = $2) AND ($3::text IS NULL OR d.consumer_group = $3)
  AND ($4::text IS NULL OR d.partition = $4)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5) AND ($6::timestamptz IS NULL OR d.created_at <= $6)
ORDER BY d.created_at, d.id
LIMIT $7 OFFSET $8;

-- name: log_dlq_count
SELECT count(*) FROM queen_dlq d
WHERE d.tenant = $1 AND ($2::text IS NULL OR d.queue = $2) AND ($3::text IS NULL OR d.consumer_group = $3)
  AND ($4::text IS NULL OR d.partition = $4)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5) AND ($6::timestamptz IS NULL OR d.created_at <= $6);

-- name: log_dlq_take
SELECT d.id, d.queue, d.partition_id, d.partition, d.consumer_group, d.synthetic, d.message_id, d.txn,
       d.trace_id, d.payload, d.codec, d.key_id, d.producer_sub
FROM queen_dlq d WHERE d.tenant = $1 AND d.id = $2
FOR UPDATE;

-- name: log_dlq_take_by_address
-- The dead letters of one message address (partition id, transaction id), oldest first, locked: the
-- official client's retry route names a message, not a DLQ row.
SELECT d.id, d.queue, d.partition_id, d.partition, d.consumer_group, d.synthetic, d.message_id, d.txn,
       d.trace_id, d.payload, d.codec, d.key_id, d.producer_sub
FROM queen_dlq d WHERE d.tenant = $1 AND d.partition_id = $2 AND d.txn = $3
ORDER BY d.created_at, d.id
FOR UPDATE;

-- name: log_dlq_delete
DELETE FROM queen_dlq d WHERE d.tenant = $1 AND d.id = $2;

-- name: log_lookup_txn
-- One probe of the (tenant, partition_id, txn) unique index per partition of the queue.
SELECT p.queue, p.name AS partition, p.id AS partition_id, m.id AS message_id, m.txn, m.producer_sub,
       m.created_at, m.deleted_at
FROM queen_partitions p
JOIN queen_messages m ON m.tenant = p.tenant AND m.partition_id = p.id AND m.txn = $3
WHERE p.tenant = $1 AND p.queue = $2
ORDER BY m.created_at, m.seq
LIMIT 1;

-- name: log_message_get
SELECT p.queue, p.name AS partition, p.id AS partition_id, m.seq, m.id, m.txn, m.trace_id, m.payload,
       m.codec, m.key_id, m.producer_sub, m.created_at, m.deadline_at, m.deleted_at
FROM queen_messages m
JOIN queen_partitions p ON p.tenant = m.tenant AND p.id = m.partition_id
WHERE m.tenant = $1 AND m.partition_id = $2 AND m.txn = $3;

-- name: log_message_delete
-- $1 tenant, $2 partition id, $3 txn, $4 the deleting principal's sub, $5 the trace event's id.
SELECT * FROM queen_message_delete($1, $2, $3, $4, $5);

-- name: log_queues_by_namespace
-- In the order a namespace/task pop tries them: higher priority first (the queue option), then by name.
SELECT q.name FROM queen_queues q
WHERE q.tenant = $1 AND ($2::text IS NULL OR q.namespace = $2) AND ($3::text IS NULL OR q.task = $3)
ORDER BY q.priority DESC, q.name
LIMIT 1000;

-- name: log_listen
SELECT queen_listen($1, $2, $3, $4);

-- name: log_retention_prune
SELECT tenant, queue, deleted FROM queen_log_prune($1);
