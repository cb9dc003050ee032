-- Consumer-group management (the official client's admin API: list, get, lagging, delete, seek,
-- subscription). A group's cursors are per (partition, group); queen_groups holds its subscription
-- (subscribed_at) and cursor_count, which queen_pop compares with the queue's partition_count to know
-- whether cursors are missing: every statement here that adds or removes cursors sets it again.

-- name: groups_stats
-- One row per (group, queue) of the tenant, optionally one group / one queue, optionally only those whose
-- oldest pending message is at least $4 seconds old. pending = offsets after the cursor (and the retention
-- floor); lag_seconds = age of the oldest pending message by the database clock (0 when none).
WITH per_part AS (
    SELECT c.consumer_group, c.queue, c.partition_id,
           greatest(p.next_seq - 1 - greatest(c.acked_seq, coalesce(f.floor_seq, 0)), 0) AS pending,
           (c.lease_until > now()) AS leased,
           (SELECT m.created_at FROM queen_messages m
            WHERE m.tenant = c.tenant AND m.partition_id = c.partition_id
              AND m.seq > greatest(c.acked_seq, coalesce(f.floor_seq, 0))
            ORDER BY m.seq LIMIT 1) AS oldest
    FROM queen_cursors c
    JOIN queen_partitions p ON p.tenant = c.tenant AND p.id = c.partition_id
    LEFT JOIN queen_log_floor f ON f.tenant = c.tenant AND f.partition_id = c.partition_id
    WHERE c.tenant = $1 AND ($2::text IS NULL OR c.consumer_group = $2) AND ($3::text IS NULL OR c.queue = $3)
), per_queue AS (
    SELECT consumer_group, queue, count(*) AS partitions, sum(pending)::bigint AS pending,
           count(*) FILTER (WHERE leased) AS leased_partitions, min(oldest) AS oldest_pending_at
    FROM per_part GROUP BY consumer_group, queue
)
SELECT g.consumer_group, g.queue, g.subscribed_at, g.created_at,
       coalesce(pq.partitions, 0) AS partitions, coalesce(pq.pending, 0)::bigint AS pending,
       coalesce(pq.leased_partitions, 0) AS leased_partitions, pq.oldest_pending_at,
       coalesce(extract(epoch FROM now() - pq.oldest_pending_at), 0)::double precision AS lag_seconds
FROM queen_groups g
LEFT JOIN per_queue pq ON pq.consumer_group = g.consumer_group AND pq.queue = g.queue
WHERE g.tenant = $1 AND ($2::text IS NULL OR g.consumer_group = $2) AND ($3::text IS NULL OR g.queue = $3)
  AND ($4::double precision IS NULL OR coalesce(extract(epoch FROM now() - pq.oldest_pending_at), 0) >= $4)
ORDER BY g.consumer_group, g.queue
LIMIT 10000;

-- name: groups_delete
-- Forget a group's positions ($3 NULL = on every queue of the tenant): its cursors, its per-message
-- state. With $4 (deleteMetadata) its subscription rows go too; without, they stay (subscribed_at kept)
-- with cursor_count and cursor_upto 0, so the next pop recreates cursors from the subscription. Returns the queues touched.
WITH cur AS (
    DELETE FROM queen_cursors c
    WHERE c.tenant = $1 AND c.consumer_group = $2 AND ($3::text IS NULL OR c.queue = $3)
    RETURNING c.partition_id, c.queue
), st AS (
    DELETE FROM queen_msg_state s USING cur
    WHERE s.tenant = $1 AND s.partition_id = cur.partition_id AND s.consumer_group = $2
), gone AS (
    DELETE FROM queen_groups g
    WHERE $4 AND g.tenant = $1 AND g.consumer_group = $2 AND ($3::text IS NULL OR g.queue = $3)
    RETURNING g.queue
), kept AS (
    UPDATE queen_groups g SET cursor_count = 0, cursor_upto = 0
    WHERE NOT $4 AND g.tenant = $1 AND g.consumer_group = $2 AND ($3::text IS NULL OR g.queue = $3)
    RETURNING g.queue
)
SELECT queue FROM gone UNION SELECT queue FROM kept UNION SELECT queue FROM cur;

-- name: groups_seek
-- Move a group's cursor on every partition of queue $3: to the end ($4 true: everything pushed so far is
-- done for it) or to instant $5 (the messages created at/after it are delivered again, the older ones
-- are done). Live leases of the group on the queue are dropped and per-message state is cleared; cursors
-- the group lacked are created, and the group row (and cursor_count) follows. Returns one row per
-- partition: name, new position, head.
WITH grp AS (
    INSERT INTO queen_groups AS g (tenant, queue, consumer_group)
    VALUES ($1, $3, $2)
    ON CONFLICT (tenant, queue, consumer_group) DO UPDATE SET cursor_count = g.cursor_count
    RETURNING 1
), target AS (
    SELECT p.id, p.name, p.next_seq - 1 AS head,
           CASE WHEN $4 THEN p.next_seq - 1
                ELSE greatest(coalesce(f.floor_seq, 0), coalesce(
                    (SELECT m.seq FROM queen_messages m
                     WHERE m.tenant = p.tenant AND m.partition_id = p.id AND m.created_at < $5
                     ORDER BY m.seq DESC LIMIT 1), 0)) END AS pos
    FROM queen_partitions p
    LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
    WHERE p.tenant = $1 AND p.queue = $3
), st AS (
    DELETE FROM queen_msg_state s USING target
    WHERE s.tenant = $1 AND s.partition_id = target.id AND s.consumer_group = $2
), up AS (
    INSERT INTO queen_cursors AS c (tenant, partition_id, consumer_group, queue, acked_seq)
    SELECT $1, t.id, $2, $3, t.pos FROM target t, grp
    ON CONFLICT (tenant, partition_id, consumer_group) DO UPDATE
    SET acked_seq = excluded.acked_seq, lease_id = NULL, lease_until = NULL, lease_end_seq = NULL,
        ready = true  -- moved back, maybe: something to hand out again (migration 0027)
    RETURNING c.partition_id
), cnt AS (
    UPDATE queen_groups g SET cursor_count = (SELECT count(*) FROM target)
    WHERE g.tenant = $1 AND g.queue = $3 AND g.consumer_group = $2 AND EXISTS (SELECT 1 FROM grp)
)
SELECT t.name, t.pos, t.head FROM target t JOIN up ON up.partition_id = t.id ORDER BY t.name;

-- name: groups_set_subscription
-- A group's subscription instant on every queue it reads: it decides where the group starts in the
-- partitions it has not read yet (messages created before it are skipped there). Returns the queues.
UPDATE queen_groups g SET subscribed_at = $3
WHERE g.tenant = $1 AND g.consumer_group = $2
RETURNING g.queue;
