-- The message log's consumer side: consumer groups, per-(partition, group) cursors with one lease,
-- a small side table for messages acknowledged out of order or that failed, the wake-up registry of
-- long polls, and the retention floor. Pop, ack, retention and wake-ups are in broker/sql/functions/log.sql.
--
-- Cursor model. queen_push hands out gapless offsets per partition under the partition row lock, so
-- within a partition commit order = offset order. A cursor says "every offset <= acked_seq is done for
-- this group". A pop leases (acked_seq, lease_end_seq] to one consumer (lease_id, lease_until); acks
-- inside that range that are not at the head are remembered in queen_msg_state until the head catches
-- up, and the cursor then jumps over the contiguous run. queen_msg_state also counts failed deliveries
-- (nacks and expired leases) for the retry limit. Queue mode is the group '__QUEUE_MODE__'.

-- cursor_count is kept by queen_pop (cursors created for this group so far), compared with the queue's
-- partition_count.
CREATE TABLE queen_groups (
    tenant         text NOT NULL,
    queue          text COLLATE "C" NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    -- NULL: the group reads every message ("all"); else only messages created at/after this instant.
    subscribed_at  timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    cursor_count   integer NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, queue, consumer_group)
);

-- Rewritten on every pop and ack: room on each page for HOT updates, vacuumed early.
CREATE TABLE queen_cursors (
    tenant         text NOT NULL,
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    queue          text COLLATE "C" NOT NULL,
    acked_seq      bigint NOT NULL DEFAULT 0,
    lease_id       uuid,
    lease_until    timestamptz,
    lease_end_seq  bigint,
    claimed_at     timestamptz,
    PRIMARY KEY (tenant, partition_id, consumer_group)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02);
-- In claimed_at order: a pop takes the least recently claimed free partition of its group by walking
-- this index and stops at the first one with messages (0.13 ms with 1,001 partitions), instead of
-- reading and sorting every cursor of the group (4.9 ms, growing with the partitions).
CREATE INDEX queen_cursors_group ON queen_cursors (tenant, queue, consumer_group, claimed_at NULLS FIRST);
CREATE INDEX queen_cursors_lease ON queen_cursors (tenant, lease_id) WHERE lease_id IS NOT NULL;

-- Only rows for messages acked out of order (acked) or that failed at least once (failures).
CREATE TABLE queen_msg_state (
    tenant         text NOT NULL,
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    seq            bigint NOT NULL,
    acked          boolean NOT NULL DEFAULT false,
    failures       integer NOT NULL DEFAULT 0,
    last_error     text,
    PRIMARY KEY (tenant, partition_id, consumer_group, seq)
) WITH (autovacuum_vacuum_scale_factor = 0.02);

-- Wake-ups. NOTIFY makes PostgreSQL serialise the commits of notifying transactions (a database-wide
-- lock held through the commit's WAL flush), which would cap every push at one fsync at a time. So a
-- push notifies a queue only while some worker has a long poll waiting on it: a worker registers
-- (tenant, queue) here before its waiting pop looks at the queue. The handshake is an advisory lock
-- per (tenant, queue): writers hold it shared from before their check until their commit; a
-- registration takes it exclusively, so once it has committed, every writer either has committed
-- (the waiter's pop sees its rows) or will see the registration (and notify). Rows expire by
-- `until`; UNLOGGED because a restart forgets every waiter anyway.
CREATE UNLOGGED TABLE queen_listeners (
    tenant text NOT NULL,
    queue  text COLLATE "C" NOT NULL,
    worker text NOT NULL,
    until  timestamptz NOT NULL,
    PRIMARY KEY (tenant, queue, worker)
);

-- Retention of the message log. Two queue options, enforced by the pruner loop of every worker:
--   retentionSeconds          -> a message older than N s is deleted, consumed or not;
--   completedRetentionSeconds -> a message older than N s that every consumer group of the queue (queue
--                                mode included) has done is deleted.
-- 0 or absent = keep for ever. Deletion only ever removes the HEAD of a partition (a contiguous run of
-- offsets from its start), so the log of a partition stays gapless above its floor: cursors, which
-- say "every offset <= acked_seq is done", stay valid, and one below the floor just moves up to it.
--
-- queen_log_floor remembers, per partition, the highest offset deleted. It is a table of its own (not
-- a column of queen_partitions) so the pruner never takes a partition row lock, which every push
-- holds while it allocates offsets: pruning never waits for, nor blocks, a push.
CREATE TABLE queen_log_floor (
    tenant       text NOT NULL,
    partition_id uuid NOT NULL,
    floor_seq    bigint NOT NULL,
    PRIMARY KEY (tenant, partition_id)
);
