-- Reads by offset (the official client's queue(q).fetch(), POST /api/v1/fetch). Wire offsets are
-- 0-based: offset o is our seq o + 1; highWatermark = next_seq - 1 (the next offset to be written);
-- logStartOffset = the retention floor (the first kept offset).

-- name: reads_fetch
-- One row per record (at most $5 per entry) of every entry ($2 queues, $3 partitions, $4 offsets), or
-- one row with seq NULL for an entry without records; pid NULL = no such partition.
SELECT e.idx::integer AS idx, p.id AS pid, p.next_seq - 1 AS hw, coalesce(f.floor_seq, 0) AS log_start,
       m.seq, m.txn, m.payload, m.codec, m.key_id, m.created_at, m.deleted_at
FROM unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS e(queue, partition, off, idx)
LEFT JOIN queen_partitions p ON p.tenant = $1 AND p.queue = e.queue AND p.name = e.partition
LEFT JOIN queen_log_floor f ON f.tenant = $1 AND f.partition_id = p.id
LEFT JOIN LATERAL (
    SELECT mm.seq, mm.txn, mm.payload, mm.codec, mm.key_id, mm.created_at, mm.deleted_at FROM queen_messages mm
    WHERE mm.tenant = $1 AND mm.partition_id = p.id AND mm.seq > e.off
    ORDER BY mm.seq LIMIT $5
) m ON true
ORDER BY e.idx, m.seq;

-- name: reads_changed
-- Partitions of queue $2 written at or after $3 (NULL = all), in creation order, after the partition
-- $4 (a page cursor, NULL = from the start), at most $5; plus safe_time: the instant before which every
-- write is visible now (the start of the oldest open transaction on this database, or now()).
SELECT p.id, p.name, p.next_seq - 2 AS last_offset, coalesce(f.floor_seq, 0) AS log_start, p.last_push_at,
       p.created_at,
       least(now(), coalesce((SELECT min(a.xact_start) FROM pg_stat_activity a
                              WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                                AND a.xact_start IS NOT NULL), now())) AS safe_time
FROM queen_partitions p
LEFT JOIN queen_log_floor f ON f.tenant = p.tenant AND f.partition_id = p.id
WHERE p.tenant = $1 AND p.queue = $2
  AND ($3::timestamptz IS NULL OR p.last_push_at >= $3)
  AND ($4::uuid IS NULL OR (p.created_at, p.id) > (SELECT c.created_at, c.id FROM queen_partitions c
                                                   WHERE c.tenant = $1 AND c.id = $4))
ORDER BY p.created_at, p.id
LIMIT $5;

-- name: reads_now
SELECT least(now(), coalesce((SELECT min(a.xact_start) FROM pg_stat_activity a
                              WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                                AND a.xact_start IS NOT NULL), now())) AS safe_time;
