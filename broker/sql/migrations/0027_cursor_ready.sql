-- queen_cursors.ready: false only while the group has nothing left in the partition (acked_seq =
-- next_seq - 1), so a pop's walk for a partition to serve reads only cursors with something to hand
-- out. Before it the walk went over the group's cursors in claimed_at order and stopped at the first
-- servable one: with consumers keeping up on many partitions (10,001 partitions, one message pushed to
-- a random one at a time) it read half of them per pop, 12 ms, a cost growing with the partitions.
--
-- The invariant "ready = false implies drained" is kept by two writers (broker/sql/functions/log.sql):
--   * queen_push sets ready = true on the cursors of every partition it writes to, in its own
--     transaction, while it holds the partition row's lock;
--   * queen_pop sets ready = false only after taking the partition row FOR SHARE (no push of that
--     partition can then run before the pop commits; with a push in flight it leaves ready alone) and
--     reading next_seq in a statement that starts after that lock: a push that committed before is
--     seen, a push after it finds ready = false and sets it back.
-- An ack that takes a leased cursor to the partition's end marks it drained by the same rule
-- (queen_cursor_drained). Anything that moves a cursor back (a group seek) sets ready = true; a cursor
-- created later starts true. A stale true (a queue of at most 1,000 partitions keeps every cursor ready;
-- a push in flight when a consumer drained the partition) costs one skipped row in the walk, never a
-- message.
ALTER TABLE queen_cursors ADD COLUMN ready boolean NOT NULL DEFAULT true;
-- As queen_cursors_group (migration 0019), its predicate names queue, so that only a statement comparing
-- queue considers it: one cursor is still found by its primary key, whatever the planner knows.
CREATE INDEX queen_cursors_ready ON queen_cursors (tenant, queue, consumer_group, claimed_at NULLS FIRST)
    WHERE ready AND queue IS NOT NULL;

-- queen_partitions.ordinal: a partition's number in its queue, 1, 2, ... in creation order, given by
-- queen_push from queen_queues.partition_count under the queue row's lock in the transaction that
-- creates the partition: every snapshot sees a gapless prefix. queen_groups.cursor_upto: the group has
-- a cursor on every partition numbered up to it. A pop creates cursors only for the partitions past it
-- (by this index) instead of searching every partition of the queue for one without a cursor, which
-- cost 6 ms at 10,001 partitions and ran at nearly every pop while partitions were being created.
-- Existing partitions are numbered in creation order and partition_count recounted to match; existing
-- groups start at 0 (their next pop goes over every partition once, as before).
ALTER TABLE queen_partitions ADD COLUMN ordinal integer;
UPDATE queen_partitions p SET ordinal = o.n
FROM (SELECT x.tenant, x.id, row_number() OVER (PARTITION BY x.tenant, x.queue ORDER BY x.created_at, x.id) AS n
      FROM queen_partitions x) o
WHERE p.tenant = o.tenant AND p.id = o.id;
UPDATE queen_queues q SET partition_count = c.n
FROM (SELECT x.tenant, x.queue, count(*)::integer AS n FROM queen_partitions x GROUP BY x.tenant, x.queue) c
WHERE q.tenant = c.tenant AND q.name = c.queue AND q.partition_count <> c.n;
-- Partial on "ordinal IS NOT NULL" (every row once its creating push commits), as queen_cursors_group
-- is on queue (migration 0019): only a statement comparing ordinal considers it, so a lookup by (queue,
-- name) keeps the unique index whatever the planner knows, never "tenant and queue, then filter".
CREATE INDEX queen_partitions_ordinal ON queen_partitions (tenant, queue, ordinal) WHERE ordinal IS NOT NULL;
ALTER TABLE queen_groups ADD COLUMN cursor_upto integer NOT NULL DEFAULT 0;
