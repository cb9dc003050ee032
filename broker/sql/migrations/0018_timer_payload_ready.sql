-- queen_timers.payload_ready: true when the stored payload is already the log's stored bytes as the fire
-- would seal them: not zstd, not encrypted, judged JSON by the broker at schedule time (orjson, the same
-- check the sweeper's pack makes), and below the compression threshold. The sweeper fires such rows
-- inside the database, in the statement that takes them (queen_timers_sweep, broker/sql/functions/timers.sql),
-- with no round trip through Python: a 1,000-row cycle shipped 1,000 payloads to the worker and 7 arrays
-- back only for the worker to find nothing to change. A row written by anything else (old rows, SQL)
-- keeps false and is packed in Python as before; encrypted rows (key_id set) need no flag, their bytes
-- were sealed at schedule.
ALTER TABLE queen_timers ADD COLUMN payload_ready boolean NOT NULL DEFAULT false;
