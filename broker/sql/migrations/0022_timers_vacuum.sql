-- queen_timers is vacuumed by the number of dead rows, not by a fraction of the table.
--
-- A fired timer is a deleted row whose entries stay at the front of the due indexes (due_at in the past)
-- until a vacuum removes them: every insert lands further right, so nothing else ever cleans those pages,
-- and every claim walks them from the start. At a steady 1,000 fired/s the take's probes of the
-- (tenant, due_at) index read 80 blocks at ~35,000 dead rows and 230-390 at ~80,000, and a sweep cycle took
-- 3.9 ms instead of 2.2 (PostgreSQL 15, pg_stat_statements; lag at the consumer p50 13.1 vs 10.1 ms).
-- With the default scale factor (0.2) autovacuum waits for a fifth of the table to be dead: with
-- 1,000,000 far-future timers pending, 200,000 dead rows in front of every claim, so the claim's cost grew
-- with the pending volume. A fixed threshold keeps the dead front bounded by the fire rate instead.
-- vacuum_index_cleanup = on: the dead rows of a big table sit in few of its pages, under the 2 % of pages
-- below which a vacuum skips the indexes, which would leave exactly the entries that matter.
ALTER TABLE queen_timers SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    vacuum_index_cleanup = on
);
