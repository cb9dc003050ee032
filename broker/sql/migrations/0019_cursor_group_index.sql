-- queen_cursors_group serves one walk: a pop's search of one (tenant, queue, group) for the least
-- recently claimed free partition. Because it leads with tenant, the planner could also serve every
-- statement that names one cursor by its primary key (tenant, partition_id, consumer_group) with it,
-- as "tenant = ..., then filter", and on a young table without statistics it often did: a pop's lease
-- update, a cursor advance or a named-partition pop read every cursor of the tenant's group (1,000
-- rows at 1,001 partitions, 0.2 ms and growing with the partitions). As a partial index on
-- "queue IS NOT NULL" (every row: the column is NOT NULL) it is considered only for a statement that
-- compares queue (a strict comparison implies the predicate), so a single cursor is found by the
-- primary key whatever the planner knows. It still leads with tenant (tests/test_migrate.py).
DROP INDEX queen_cursors_group;
CREATE INDEX queen_cursors_group ON queen_cursors (tenant, queue, consumer_group, claimed_at NULLS FIRST)
    WHERE queue IS NOT NULL;
