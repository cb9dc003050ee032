-- queen_queues.partition_count and queen_groups.cursor_count were recounted (count(*)) by the
-- statement that created partitions or cursors, from that statement's snapshot: two concurrent
-- creators each counted only their own rows, so a counter could end below the truth, and queen_pop,
-- which creates a group's cursors only while cursor_count < partition_count, then never gave the
-- newest partition a cursor (its messages were never delivered). The functions now add what they
-- created (broker/sql/functions/log.sql); this sets both counters to the truth once, so a database that was
-- hit before the fix delivers those partitions again.
UPDATE queen_queues q SET partition_count = c.n
FROM (SELECT tenant, queue, count(*) AS n FROM queen_partitions GROUP BY tenant, queue) c
WHERE q.tenant = c.tenant AND q.name = c.queue AND q.partition_count <> c.n;

UPDATE queen_groups g SET cursor_count = c.n
FROM (SELECT tenant, queue, consumer_group, count(*) AS n FROM queen_cursors
      GROUP BY tenant, queue, consumer_group) c
WHERE g.tenant = c.tenant AND g.queue = c.queue AND g.consumer_group = c.consumer_group
  AND g.cursor_count <> c.n;
